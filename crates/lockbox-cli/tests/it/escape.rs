//! The escape corpus (`tests/escape/`, listed in `tests/escape/corpus.toml`): real attack
//! programs run inside `lockbox run`, as the current user and (when root) as uid 65534. Each
//! must fail the way its manifest entry says, and the host must be unchanged afterwards: the
//! fixture tree outside the grants, files the attacks try to create, the victim process, the
//! host's TCP/UDP/unix services, leftover processes, setuid files, mounts and the hostname.
//!
//! `LOCKBOX_ESCAPE_ONLY=name,name` runs a subset.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::escape_net;

use common::{binary, give, scratch, snapshot, users, Node, User};
use escape_net::names::NamesNet;
use escape_net::{NetServices, PreExec, Rebinder};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    attack: Vec<Attack>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Attack {
    name: String,
    lang: Lang,
    wall: String,
    expect: Expect,
    #[serde(default)]
    lockbox: Vec<String>,
    #[serde(default)]
    tty: bool,
    #[serde(default)]
    workdir: bool,
    /// lockbox resolves from a hosts file the test rewrites while the sandbox runs
    /// (`escape_net::REBIND_NAME`).
    #[serde(default)]
    rebind: bool,
    /// Unconnected host TCP and UDP sockets are passed with `--pass-fd 10 --pass-fd 11`.
    #[serde(default)]
    pass_sockets: bool,
    /// Runs against the test network of `escape_net::names` (root only): lockbox resolves
    /// through its DNS server, writes `--audit`, and holds a credential.
    #[serde(default)]
    names: bool,
    /// Reasons (substrings) of `denied` events the run's audit log must hold.
    #[serde(default)]
    audit: Vec<String>,
    /// Prefixes of the lines the test network's services may log (what the policy lets
    /// out); anything else that reached them is an escape.
    #[serde(default)]
    outside: Vec<String>,
    /// Lines the services must have logged (the attack's control steps).
    #[serde(default)]
    outside_seen: Vec<String>,
    arch: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Lang {
    C,
    Sh,
    Python,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Expect {
    Blocked,
    Sigsys,
    Timeout,
    Limited,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/escape")
}

fn manifest() -> Vec<Attack> {
    let text = std::fs::read_to_string(corpus_dir().join("corpus.toml")).unwrap();
    let m: Manifest = toml::from_str(&text).unwrap();
    m.attack
}

fn extension(lang: Lang) -> &'static str {
    match lang {
        Lang::C => "c",
        Lang::Sh => "sh",
        Lang::Python => "py",
    }
}

#[test]
fn corpus_lists_every_program_and_has_at_least_40() {
    let attacks = manifest();
    assert!(attacks.len() >= 40, "{} attacks", attacks.len());
    let mut listed: Vec<String> = attacks
        .iter()
        .map(|a| format!("{}.{}", a.name, extension(a.lang)))
        .collect();
    listed.sort();
    let mut files: Vec<String> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".c") || n.ends_with(".sh") || n.ends_with(".py"))
        .filter(|n| !n.starts_with("lib."))
        .collect();
    files.sort();
    assert_eq!(listed, files);
    for a in &attacks {
        assert!(!a.wall.is_empty(), "{}", a.name);
    }
}

/// Copies the scripts and compiles the C programs, once, into a directory every test user
/// can read.
fn build_corpus(attacks: &[Attack]) -> tempfile::TempDir {
    let bin = tempfile::Builder::new()
        .prefix("lockbox-escape-bin-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for helper in ["lib.sh", "lib.py"] {
        std::fs::copy(corpus_dir().join(helper), bin.path().join(helper)).unwrap();
    }
    let c: Vec<&Attack> = attacks.iter().filter(|a| a.lang == Lang::C).collect();
    for a in attacks.iter().filter(|a| a.lang != Lang::C) {
        let file = format!("{}.{}", a.name, extension(a.lang));
        std::fs::copy(corpus_dir().join(&file), bin.path().join(&file)).unwrap();
    }
    // Two compilers at a time: the machine may have two cores.
    let queue = Mutex::new(c);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some(a) = queue.lock().unwrap().pop() else {
                    return;
                };
                let out = Command::new("gcc")
                    .args(["-O1", "-no-pie", "-Wall", "-Wno-unused-result", "-o"])
                    .arg(bin.path().join(&a.name))
                    .arg(corpus_dir().join(format!("{}.c", a.name)))
                    .output()
                    .expect("gcc (the corpus compiles its C attacks)");
                assert!(
                    out.status.success(),
                    "{}: {}",
                    a.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            });
        }
    });
    for entry in std::fs::read_dir(bin.path()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

/// The host side of one run: files, services and a victim process the attack aims at.
struct Fixture {
    dir: crate::common::Scratch,
    token: String,
    victim: Child,
    tcp4: TcpListener,
    tcp6: Option<TcpListener>,
    tcp_any: TcpListener,
    udp4: UdpSocket,
    unix_path: UnixListener,
    unix_abstract: UnixListener,
    net: NetServices,
}

fn token() -> String {
    static NEXT: Mutex<u32> = Mutex::new(0);
    let mut n = NEXT.lock().unwrap();
    *n += 1;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{}x{}x{nanos}", std::process::id(), *n)
}

impl Fixture {
    fn new(user: User, attack: &Attack) -> Fixture {
        let dir = scratch();
        let fx = dir.path();
        let token = token();
        std::fs::write(fx.join("secret"), &token).unwrap();
        std::fs::create_dir(fx.join("sentinel")).unwrap();
        std::fs::write(fx.join("sentinel/a"), "sentinel a").unwrap();
        std::fs::write(fx.join("sentinel/b"), "sentinel b").unwrap();
        std::fs::create_dir(fx.join("ro")).unwrap();
        std::fs::write(fx.join("ro/ro.txt"), "read-only grant").unwrap();
        for f in ["secret", "sentinel/a", "sentinel/b", "ro/ro.txt"] {
            std::fs::set_permissions(fx.join(f), std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        for d in ["sentinel", "ro"] {
            std::fs::set_permissions(fx.join(d), std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let work = fx.join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("data"), "work data").unwrap();
        std::os::unix::fs::symlink(fx.join("secret"), work.join("planted")).unwrap();
        std::os::unix::fs::symlink(fx, work.join("planted_dir")).unwrap();
        give(&work, user);
        if attack.workdir {
            std::fs::create_dir(fx.join("state")).unwrap();
            give(&fx.join("state"), user);
        }
        let mut victim = Command::new("sleep");
        victim.arg("600").process_group(0);
        if let User::Nobody = user {
            victim.uid(65534).gid(65534);
        }
        let victim = victim.spawn().unwrap();
        let nonblocking_tcp = |addr: &str| {
            let l = TcpListener::bind(addr).ok()?;
            l.set_nonblocking(true).unwrap();
            Some(l)
        };
        let udp4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        udp4.set_nonblocking(true).unwrap();
        let unix_path = UnixListener::bind(fx.join("host.sock")).unwrap();
        unix_path.set_nonblocking(true).unwrap();
        std::fs::set_permissions(fx.join("host.sock"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        let name = format!("lockbox-escape-{token}");
        let unix_abstract =
            UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        unix_abstract.set_nonblocking(true).unwrap();
        Fixture {
            tcp4: nonblocking_tcp("127.0.0.1:0").unwrap(),
            tcp6: nonblocking_tcp("[::1]:0"),
            tcp_any: nonblocking_tcp("0.0.0.0:0").unwrap(),
            udp4,
            unix_path,
            unix_abstract,
            net: NetServices::new(),
            victim,
            token,
            dir,
        }
    }

    fn fx(&self) -> &Path {
        self.dir.path()
    }

    /// The fixture tree, without the grant the attack may write.
    fn outside_snapshot(&self) -> BTreeMap<PathBuf, Node> {
        let mut s = snapshot(self.fx());
        s.retain(|p, _| {
            !p.starts_with("work")
                && !p.starts_with("state")
                && !p.starts_with("etc")
                && !p.starts_with(AUDIT_FILE)
        });
        s
    }

    fn env(&self, bin: &Path) -> Vec<(String, String)> {
        let fx = self.fx().to_str().unwrap().to_owned();
        let port = |l: &TcpListener| l.local_addr().unwrap().port().to_string();
        let mut env = self.net.env();
        env.extend([
            ("ESCAPE_MARK".into(), self.token.clone()),
            ("BIN".into(), bin.to_str().unwrap().into()),
            ("FX".into(), fx.clone()),
            ("WORK".into(), format!("{fx}/work")),
            ("SECRET".into(), format!("{fx}/secret")),
            ("TOKEN".into(), self.token.clone()),
            ("VICTIM".into(), self.victim.id().to_string()),
            ("TCP4".into(), port(&self.tcp4)),
            (
                "TCP6".into(),
                self.tcp6.as_ref().map(port).unwrap_or_else(|| "1".into()),
            ),
            ("TCP_ANY".into(), port(&self.tcp_any)),
            (
                "UDP4".into(),
                self.udp4.local_addr().unwrap().port().to_string(),
            ),
            ("SOCK".into(), format!("{fx}/host.sock")),
            ("ABSTRACT".into(), format!("lockbox-escape-{}", self.token)),
            ("HOSTIP".into(), host_ip()),
            ("HOSTIP6".into(), host_ip6()),
            ("REBIND_TO".into(), REBIND_TO.into()),
        ]);
        env
    }

    /// A manifest option with its placeholders filled in.
    fn expand(&self, arg: &str) -> String {
        let fx = self.fx().to_str().unwrap();
        let tcp_any = self.tcp_any.local_addr().unwrap().port().to_string();
        self.net
            .expand(arg)
            .replace("{fx}", fx)
            .replace("{hostip}", &host_ip())
            .replace("{tcp_any}", &tcp_any)
    }

    /// Everything the host must still look like; one message per difference.
    fn check_host(&mut self, before: &BTreeMap<PathBuf, Node>, problems: &mut Vec<String>) {
        let after = self.outside_snapshot();
        if &after != before {
            let changed: Vec<_> = after
                .iter()
                .filter(|(p, n)| before.get(*p) != Some(*n))
                .map(|(p, _)| p.display().to_string())
                .chain(
                    before
                        .keys()
                        .filter(|p| !after.contains_key(*p))
                        .map(|p| format!("-{}", p.display())),
                )
                .collect();
            problems.push(format!("host fixture changed: {changed:?}"));
        }
        for path in [
            format!("/tmp/lockbox-escape-pwned-{}", self.token),
            format!("/dev/shm/lockbox-escape-pwned-{}", self.token),
        ] {
            if Path::new(&path).exists() {
                let _ = std::fs::remove_file(&path);
                problems.push(format!("{path} was created on the host"));
            }
        }
        if let Ok(Some(status)) = self.victim.try_wait() {
            problems.push(format!("the victim process died: {status}"));
        }
        let accepted =
            |r: std::io::Result<()>| !matches!(r, Err(e) if e.kind() == ErrorKind::WouldBlock);
        if accepted(self.tcp4.accept().map(drop)) {
            problems.push("the host's 127.0.0.1 TCP service got a connection".into());
        }
        if let Some(l) = &self.tcp6 {
            if accepted(l.accept().map(drop)) {
                problems.push("the host's [::1] TCP service got a connection".into());
            }
        }
        if accepted(self.tcp_any.accept().map(drop)) {
            problems.push("the host's 0.0.0.0 TCP service got a connection".into());
        }
        if accepted(self.udp4.recv(&mut [0; 64]).map(drop)) {
            problems.push("the host's UDP service got a datagram".into());
        }
        if accepted(self.unix_path.accept().map(drop)) {
            problems.push("the host's path unix socket got a connection".into());
        }
        if accepted(self.unix_abstract.accept().map(drop)) {
            problems.push("the host's abstract unix socket got a connection".into());
        }
        self.net.check(problems);
        let left = processes_marked(&self.token);
        if !left.is_empty() {
            for pid in &left {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
            problems.push(format!("processes left running: {left:?}"));
        }
        let setid = setid_files(&self.fx().join("work"));
        if !setid.is_empty() {
            problems.push(format!(
                "setuid/setgid/capability files in the grant: {setid:?}"
            ));
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.victim.kill();
        let _ = self.victim.wait();
    }
}

/// The host's source address towards the internet, if it has a route (no packet is sent).
/// Where `n_allow_rebind` rebinds its name: an address that is neither the host's own nor
/// internal (TEST-NET-2), which lockbox's resolver must answer once the name points there.
/// (Not the host's address: issue 32 leaves the host's own addresses out of every answer.)
const REBIND_TO: &str = "198.51.100.7";

fn host_ip() -> String {
    UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("1.1.1.1:53")?;
            s.local_addr()
        })
        .map(|a| a.ip().to_string())
        .unwrap_or_default()
}

/// The host's IPv6 source address towards the internet, if it has a route.
fn host_ip6() -> String {
    UdpSocket::bind("[::]:0")
        .and_then(|s| {
            s.connect("[2001:4860:4860::8888]:53")?;
            s.local_addr()
        })
        .map(|a| a.ip().to_string())
        .unwrap_or_default()
}

/// Pids of host processes whose environment carries this run's mark. Retried for a moment:
/// a process being killed may still be listed.
fn processes_marked(token: &str) -> Vec<String> {
    let mark = format!("ESCAPE_MARK={token}");
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let found: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.chars().all(|c| c.is_ascii_digit()))
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .map(|env| env.split(|&b| b == 0).any(|v| v == mark.as_bytes()))
                    .unwrap_or(false)
            })
            .collect();
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Files in `dir` the host would run with more privilege than their runner: setuid or setgid
/// bits, or a file capability.
fn setid_files(dir: &Path) -> Vec<PathBuf> {
    snapshot(dir)
        .into_iter()
        .filter(|(p, n)| match n {
            Node::File(mode, _) => mode & 0o6000 != 0 || has_file_capability(&dir.join(p)),
            _ => false,
        })
        .map(|(p, _)| p)
        .collect()
}

fn has_file_capability(path: &Path) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: both strings are NUL-terminated and live across the call; a null buffer of
    // size 0 asks only for the value's size.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    n >= 0
}

/// Runs a command in a new pseudo-terminal, copying its output; exits with its code.
const PTY_DRIVER: &str =
    "import os, pty, sys\nsys.exit(os.waitstatus_to_exitcode(pty.spawn(sys.argv[1:])))";

/// lockbox's `--audit` log of a `names` run, in the fixture (outside every grant).
const AUDIT_FILE: &str = "audit.jsonl";

/// The descriptor the caller "leaks" into every run (a host directory, not close-on-exec).
const LEAKED_FD: i32 = 9;

fn run_attack(
    attack: &Attack,
    user: User,
    bin: &Path,
    names: Option<&NamesNet>,
) -> Result<String, String> {
    let names = names.filter(|_| attack.names);
    let _turn = names.map(NamesNet::turn);
    let mut fixture = Fixture::new(user, attack);
    let before = fixture.outside_snapshot();
    let fx = fixture.fx().to_str().unwrap().to_owned();
    let work = format!("{fx}/work");
    let mut args: Vec<String> = vec!["run".into()];
    let mut env = fixture.env(bin);
    env.extend(names.map(NamesNet::env).unwrap_or_default());
    for (k, v) in env {
        args.extend(["--env".into(), format!("{k}={v}")]);
    }
    if names.is_some() {
        args.extend(["--audit".into(), format!("{fx}/{AUDIT_FILE}")]);
    }
    args.extend(["-r".into(), bin.to_str().unwrap().into()]);
    if attack.workdir {
        args.extend(["--workdir".into(), work.clone()]);
        args.extend(["--state-dir".into(), format!("{fx}/state")]);
    } else {
        args.extend(["-w".into(), work.clone(), "--cwd".into(), work.clone()]);
    }
    if !attack.lockbox.iter().any(|a| a == "--timeout") {
        args.extend(["--timeout".into(), "30s".into()]);
    }
    args.extend(attack.lockbox.iter().map(|a| {
        let a = fixture.expand(a);
        names.map_or_else(|| a.clone(), |n| n.expand(&a))
    }));
    if attack.pass_sockets {
        for fd in [escape_net::PASSED_TCP, escape_net::PASSED_UDP] {
            args.extend(["--pass-fd".into(), fd.to_string()]);
        }
    }
    args.push("--".into());
    let program = bin.join(&attack.name).to_str().unwrap().to_owned();
    match attack.lang {
        Lang::C => args.push(program),
        Lang::Sh => args.extend(["sh".into(), format!("{program}.sh")]),
        Lang::Python => args.extend(["python3".into(), format!("{program}.py")]),
    }
    let mut cmd = if attack.tty {
        let mut c = Command::new("python3");
        c.args(["-c", PTY_DRIVER]).arg(binary()).args(&args);
        c
    } else {
        let mut c = Command::new(binary());
        c.args(&args);
        c
    };
    let etc = attack.rebind.then(|| escape_net::etc_copy(fixture.fx()));
    let etc_dir = etc
        .as_ref()
        .map(|(dir, _)| dir.clone())
        .or_else(|| names.map(NamesNet::etc));
    if let Some(n) = names {
        cmd.envs(n.lockbox_env());
    }
    let pre = PreExec {
        etc: etc_dir.as_ref().map(|dir| {
            (
                std::ffi::CString::new(dir.to_str().unwrap()).unwrap(),
                std::ffi::CString::new("/etc").unwrap(),
            )
        }),
        pass_sockets: attack.pass_sockets,
        // Mounting over /etc needs root: the drop to uid 65534 comes after it.
        drop_to_nobody: etc_dir.is_some() && matches!(user, User::Nobody),
    };
    if let (User::Nobody, false) = (user, pre.drop_to_nobody) {
        cmd.uid(65534).gid(65534);
    }
    let leak = std::fs::File::open(fixture.fx()).unwrap();
    let leak_fd = leak.as_raw_fd();
    // In the victim's process group, so that kill(0, ...) from inside would reach it.
    cmd.process_group(fixture.victim.id() as i32)
        .current_dir(&work)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: dup2 is async-signal-safe and touches only descriptors.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(leak_fd, LEAKED_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            pre.apply()
        });
    }
    let child = cmd.spawn().unwrap();
    drop(leak);
    let rebinder = etc.map(|(_, h)| Rebinder::start(h, PathBuf::from(&work), REBIND_TO.to_owned()));
    let out = wait_with_deadline(child, Duration::from_secs(90));
    let rebound = rebinder.map(Rebinder::finish);
    let out = out?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code();
    let mut problems = Vec::new();
    let ok = match attack.expect {
        Expect::Blocked => code == Some(0) && stdout.lines().any(|l| l.trim() == "BLOCKED"),
        Expect::Sigsys => code == Some(128 + libc::SIGSYS),
        Expect::Timeout => code == Some(124),
        Expect::Limited => code != Some(0) || stdout.contains("BLOCKED"),
    };
    if !ok {
        problems.push(format!("expected {:?}, got exit {code:?}", attack.expect));
    }
    if rebound == Some(false) {
        problems.push("the attack never asked for the host's hosts file to change".into());
    }
    if stdout.contains("ESCAPED") {
        problems.push("the attack reports an escape".into());
    }
    if stdout.contains(&fixture.token) || stderr.contains(&fixture.token) {
        problems.push("the host secret appeared in the output".into());
    }
    if let Some(n) = names {
        if stdout.contains(n.secret()) || stderr.contains(n.secret()) {
            problems.push("the credential's value appeared in the output".into());
        }
        n.check(&attack.outside, &attack.outside_seen, &mut problems);
        check_audit(&fixture.fx().join(AUDIT_FILE), &attack.audit, &mut problems);
    }
    fixture.check_host(&before, &mut problems);
    let transcript = format!("exit {code:?}\nstdout:\n{stdout}stderr:\n{stderr}");
    if problems.is_empty() {
        Ok(transcript)
    } else {
        Err(format!("{}\n{transcript}", problems.join("\n")))
    }
}

/// Every expected reason must be that of a `denied` event of the run's audit log.
fn check_audit(path: &Path, expected: &[String], problems: &mut Vec<String>) {
    let events: Vec<serde_json::Value> = std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for want in expected {
        let found = events.iter().any(|e| {
            e["decision"] == "denied"
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains(want.as_str()))
        });
        if !found {
            let reasons: Vec<String> = events
                .iter()
                .map(|e| format!("{} {} {}", e["kind"], e["decision"], e["reason"]))
                .collect();
            problems.push(format!(
                "no denied event with the reason {want:?} in the audit log: {reasons:#?}"
            ));
        }
    }
}

fn wait_with_deadline(mut child: Child, limit: Duration) -> Result<std::process::Output, String> {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return Ok(child.wait_with_output().unwrap());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            return Err(format!(
                "lockbox did not finish within {limit:?}\nstdout:\n{}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mount_table() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    // Fields after the mount id and parent id: what is mounted where. Network namespaces
    // that tests make (`ip netns add`, here and in other test binaries running alongside)
    // come and go under /run/netns: not the attacks' doing.
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(4)
                .is_none_or(|m| !m.starts_with("/run/netns"))
        })
        .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
        .collect();
    lines.sort();
    lines
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap()
}

#[test]
fn every_escape_attack_fails_and_leaves_the_host_unchanged() {
    let only: Option<Vec<String>> = std::env::var("LOCKBOX_ESCAPE_ONLY")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());
    let arch = std::env::consts::ARCH;
    let attacks: Vec<Attack> = manifest()
        .into_iter()
        .filter(|a| a.arch.as_deref().is_none_or(|x| x == arch))
        .filter(|a| only.as_ref().is_none_or(|o| o.contains(&a.name)))
        .filter(|a| {
            if a.names && !common::testnet::root() {
                return lockbox_testkit::requirement(
                    false,
                    &format!("{}: the test network needs root", a.name),
                );
            }
            let needs_host_ip = a.lockbox.iter().any(|o| o.contains("{hostip}"));
            if needs_host_ip && host_ip().is_empty() {
                return lockbox_testkit::requirement(
                    false,
                    &format!("{}: the host has no address with a route", a.name),
                );
            }
            true
        })
        .collect();
    let bin = build_corpus(&attacks);
    let names = attacks.iter().any(|a| a.names).then(NamesNet::new);
    let mounts = mount_table();
    let host = hostname();
    let jobs: Vec<(Attack, User)> = attacks
        .iter()
        .flat_map(|a| users().into_iter().map(move |u| (a.clone(), u)))
        .collect();
    let total = jobs.len();
    let queue = Mutex::new(jobs);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let Some((attack, user)) = queue.lock().unwrap().pop() else {
                    return;
                };
                match run_attack(&attack, user, bin.path(), names.as_ref()) {
                    Ok(_) => eprintln!("blocked: {} as {user:?} ({})", attack.name, attack.wall),
                    Err(e) => failures.lock().unwrap().push(format!(
                        "== {} as {user:?} (wall: {})\n{e}",
                        attack.name, attack.wall
                    )),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert_eq!(mount_table(), mounts, "the host's mount table changed");
    assert_eq!(hostname(), host, "the host's hostname changed");
    assert!(
        failures.is_empty(),
        "{} of {total} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn fixture_checks_see_a_changed_host() {
    // The host checks themselves must be able to fail: change the host the way an escape
    // would, from outside, and expect a complaint for each.
    let attack = manifest().into_iter().next().unwrap();
    let mut fixture = Fixture::new(User::Current, &attack);
    let before = fixture.outside_snapshot();
    std::fs::write(fixture.fx().join("sentinel/a"), "changed").unwrap();
    std::fs::write(fixture.fx().join("work/suid"), "x").unwrap();
    std::fs::set_permissions(
        fixture.fx().join("work/suid"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    let _ = std::net::TcpStream::connect(fixture.tcp4.local_addr().unwrap());
    let _ = std::os::unix::net::UnixStream::connect(fixture.fx().join("host.sock"));
    fixture.net.reach_the_denied_ones();
    let _ = Command::new("kill")
        .arg(fixture.victim.id().to_string())
        .status();
    std::thread::sleep(Duration::from_millis(200));
    let mut problems = Vec::new();
    fixture.check_host(&before, &mut problems);
    let all = problems.join("\n");
    for want in [
        "host fixture changed",
        "setuid/setgid",
        "127.0.0.1 TCP",
        "path unix socket",
        "victim process died",
        "127.0.0.2 TCP service on a port no rule names",
        "127.0.0.3 TCP service",
        "127.0.0.3 UDP service",
        "0.0.0.0 UDP service",
    ] {
        assert!(all.contains(want), "{want} not detected: {all}");
    }
    assert!(std::fs::metadata(fixture.fx()).unwrap().mode() & 0o777 == 0o777);
}

#[test]
fn names_checks_see_what_reached_the_outside_and_missing_audit_reasons() {
    // The checks of the egress-by-name runs must be able to fail too: reach the test
    // network's services from the host with names no policy allows, and look for a reason
    // an empty audit log lacks.
    if !common::testnet::root() {
        eprintln!("skipped: the test network needs root");
        return;
    }
    let net = NamesNet::new();
    let _turn = net.turn();
    let ip = net.env()[0].1.clone();
    let mut http = std::net::TcpStream::connect((ip.as_str(), 80)).unwrap();
    std::io::Write::write_all(&mut http, b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n").unwrap();
    let _ = std::io::Read::read(&mut http, &mut [0; 64]);
    let dns = UdpSocket::bind("0.0.0.0:0").unwrap();
    let query =
        b"\x42\x42\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05other\x04test\x00\x00\x01\x00\x01";
    dns.send_to(query, (ip.as_str(), 53)).unwrap();
    dns.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = dns.recv(&mut [0; 512]);
    // The check must see both, however loaded the machine: wait for their log lines.
    net.wait_for_line("http other.test");
    net.wait_for_line("dns-udp other.test");
    let mut problems = Vec::new();
    net.check(
        &["dns-udp allowed.test".into()],
        &["tls allowed.test".into()],
        &mut problems,
    );
    let dir = scratch();
    check_audit(
        &dir.path().join(AUDIT_FILE),
        &["no sni".into()],
        &mut problems,
    );
    let all = problems.join("\n");
    for want in [
        "the outside got what no rule allows: http other.test",
        "the outside got what no rule allows: dns-udp other.test",
        "the outside never got \"tls allowed.test\"",
        "no denied event with the reason \"no sni\"",
    ] {
        assert!(all.contains(want), "{want} not detected: {all}");
    }
}
