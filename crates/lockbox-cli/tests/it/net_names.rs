//! End-to-end tests of names in `--net-allow`: lockbox's resolver (the sandbox's
//! nameserver), wildcards, addresses allowed only once answered, NXDOMAIN for every other
//! name (never asked upstream), DNS over TCP, rebinding onto the host's loopback, and the
//! `--audit` log of all of these decisions.
//!
//! The destinations are a network namespace each test makes (a veth pair with addresses of
//! the benchmarking range 198.18.0.0/15; nothing else outside is used), with TCP servers and
//! a DNS server ("upstream") in it. Names are made resolvable with the hosts file of
//! `LOCKBOX_NET_HOSTS_FILE`, or through the upstream DNS server: lockbox then runs in a
//! mount namespace of its own whose `/etc/resolv.conf` names it. Making the namespace
//! needs root; as another user the tests say so and pass. Each scenario runs as root and
//! as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::testnet::{audit_events, sh, skip_unless_root, Netns, Range};
use common::{binary, lockbox, scratch, shared_file, text, users, User};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// This file's /30s: 240 of them from 198.19.0.0 (part of 198.18.0.0/15).
const NAMES_RANGE: Range = Range::new([198, 19, 0, 0], 240);

/// A network namespace with one veth link to the host (its side `ns.host_ip`), with TCP
/// servers and a DNS server listening on `ip` in it.
struct TestNet {
    services: Child,
    /// Dropped after the servers (fields drop after `drop`), it deletes the namespace.
    ns: Netns,
    ip: String,
    dir: crate::common::Scratch,
}

impl TestNet {
    fn new() -> TestNet {
        let ns = Netns::new("n", NAMES_RANGE);
        let ip = ns.ip.clone();
        let dir = scratch();
        let log = dir.path().join("upstream.log");
        // A certificate made here for the TLS server (the clients do not check it: what is
        // tested is the name they ask for).
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        let made = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
            .args(["-subj", "/CN=svc.test", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap();
        assert!(made.status.success(), "openssl: {}", text(&made));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/net_names/upstream.py");
        let mut services = ns
            .command("python3")
            .arg(&script)
            .arg(&ip)
            .arg(&log)
            .arg(&cert)
            .arg(&key)
            .arg(dir.path().join("conns.log"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(services.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        TestNet {
            ns,
            ip,
            services,
            dir,
        }
    }

    /// The names the upstream DNS server was asked, in order.
    fn upstream_asked(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("upstream.log"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// What reached the TLS and HTTP servers since the last call, one `PORT data|nothing`
    /// line per connection, waiting until `want` connections are logged (or 5 s).
    fn take_conns(&self, want: usize) -> Vec<String> {
        let path = self.dir.path().join("conns.log");
        let read = || {
            std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let mut lines = read();
        for _ in 0..50 {
            if lines.len() >= want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            lines = read();
        }
        let _ = std::fs::remove_file(&path);
        lines.sort();
        lines
    }

    /// A hosts file (readable by every test user) with `lines`.
    fn hosts(&self, lines: &str) -> PathBuf {
        let path = self.dir.path().join("hosts");
        std::fs::write(&path, lines).unwrap();
        path
    }

    /// A copy of the host's `/etc` whose `resolv.conf` names the upstream DNS server (the
    /// whole directory, not the one file: lockbox's `/etc` overlay cannot be built over a
    /// file bind-mounted inside `/etc`).
    fn etc_with_upstream(&self) -> PathBuf {
        let etc = self.dir.path().join("etc");
        let status = Command::new("cp")
            .args(["-a", "/etc"])
            .arg(&etc)
            .status()
            .unwrap();
        assert!(status.success(), "copying /etc");
        let resolv = etc.join("resolv.conf");
        let _ = std::fs::remove_file(&resolv); // it may be a symlink
        let conf = format!("nameserver {}\noptions attempts:1\n", self.ip);
        std::fs::write(&resolv, conf).unwrap();
        etc
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let _ = self.services.kill();
        let _ = self.services.wait();
        // Then `ns` is dropped, and with it the namespace and the veth pair.
    }
}

/// The client, copied into a directory every test user can read (the checkout may be
/// under one only root can enter).
fn client_dir() -> &'static Path {
    static CLIENT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/net_names/client.py");
            shared_file("client.py", &std::fs::read(src).unwrap())
        })
        .parent()
        .unwrap()
}

fn client() -> String {
    client_dir().join("client.py").to_str().unwrap().to_owned()
}

/// Runs the client's `ops` in a sandbox with `net` options; returns `op -> result` lines.
/// `hosts`: the resolver's hosts file. `etc`: lockbox itself runs with this directory over
/// the host's `/etc` (in a mount namespace of its own).
fn run(
    user: User,
    net: &[String],
    hosts: Option<&Path>,
    etc: Option<&Path>,
    ops: &[String],
) -> Vec<(String, String)> {
    let dir = client_dir();
    let mut args: Vec<String> = vec!["run".into(), "-r".into(), dir.to_str().unwrap().into()];
    args.extend(net.iter().cloned());
    args.extend(["--".into(), "python3".into(), client()]);
    args.extend(ops.iter().cloned());
    let out = match etc {
        None => {
            let mut cmd = common::command_as(user);
            if let Some(h) = hosts {
                cmd.env("LOCKBOX_NET_HOSTS_FILE", h);
            }
            cmd.args(&args).current_dir("/").output().unwrap()
        }
        Some(etc) => {
            // Root makes the mount namespace; uid 65534 runs lockbox in it.
            let mut cmd = Command::new("unshare");
            cmd.args(["-m", "--propagation", "private", "sh", "-c"])
                .arg("mount --bind \"$0\" /etc && exec \"$@\"")
                .arg(etc);
            if let User::Nobody = user {
                cmd.args([
                    "setpriv",
                    "--reuid",
                    "65534",
                    "--regid",
                    "65534",
                    "--clear-groups",
                ]);
            }
            cmd.arg(binary()).args(&args).current_dir("/");
            if let Some(h) = hosts {
                cmd.env("LOCKBOX_NET_HOSTS_FILE", h);
            }
            cmd.output().unwrap()
        }
    };
    assert_eq!(
        out.status.code(),
        Some(0),
        "{user:?} {net:?}: {}",
        text(&out)
    );
    let lines: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let (op, result) = l.split_once(' ').unwrap();
            (op.to_owned(), result.to_owned())
        })
        .collect();
    assert_eq!(lines.len(), ops.len(), "{}", text(&out));
    lines
}

fn expect(lines: &[(String, String)], want: &[(&str, &str)], user: User) {
    for ((op, got), (wop, wres)) in lines.iter().zip(want) {
        assert_eq!(op, wop);
        assert_eq!(got, wres, "{user:?}: {op} (all: {lines:#?})");
    }
}

fn allow(specs: &[&str]) -> Vec<String> {
    specs
        .iter()
        .flat_map(|s| ["--net-allow".to_owned(), (*s).to_owned()])
        .collect()
}

#[test]
fn names_resolve_when_asked_wildcards_cover_subdomains_and_addresses_open_only_once_answered() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    let hosts = net.hosts(&format!(
        "{ip} a.wild.test b.a.wild.test wild.test svc.test\n"
    ));
    for user in users() {
        let ops: Vec<String> = [
            // Never answered yet: the address alone opens nothing.
            format!("connect,{ip},8443"),
            "resolve,wild.test".into(),
            "resolve,A.Wild.TEST.".into(),
            "resolve,b.a.wild.test".into(),
            "connect,a.wild.test,8443".into(),
            format!("connect,{ip},8443"),
            // Answered for a name whose rules list 8443 only.
            format!("connect,{ip},8080"),
            "connect,svc.test,8443".into(),
            "resolve,other.test".into(),
            // glibc counts no address but 127.0.0.1 for AI_ADDRCONFIG: lockbox's
            // 127.0.0.153 makes IPv4 count.
            "addrconfig,svc.test".into(),
        ]
        .into();
        let lines = run(
            user,
            &allow(&["tcp://*.wild.test:8443", "tcp://svc.test:8443"]),
            Some(&hosts),
            None,
            &ops,
        );
        let addr = format!("['{ip}']");
        expect(
            &lines,
            &[
                (&ops[0], "err 13"),
                (&ops[1], "err gai"),
                (&ops[2], &format!("ok {addr}")),
                (&ops[3], &format!("ok {addr}")),
                (&ops[4], "ok hello-8443"),
                (&ops[5], "ok hello-8443"),
                (&ops[6], "err 13"),
                (&ops[7], "ok hello-8443"),
                (&ops[8], "err gai"),
                (&ops[9], &format!("ok {addr}")),
            ],
            user,
        );
    }
    assert!(
        net.upstream_asked().is_empty(),
        "{:?}",
        net.upstream_asked()
    );
}

#[test]
fn names_off_the_list_get_nxdomain_over_udp_and_tcp_and_never_reach_the_upstream_resolver() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let etc = net.etc_with_upstream();
    for user in users() {
        let ops: Vec<String> = [
            "udp,evil.test",
            "tcp,evil-tcp.test",
            "udp,x.up.test",
            "tcp,up.test",
            "connect,up.test,8443",
        ]
        .map(str::to_owned)
        .into();
        let lines = run(
            user,
            &allow(&["tcp://up.test:8443"]),
            None,
            Some(&etc),
            &ops,
        );
        let ip = &net.ip;
        expect(
            &lines,
            &[
                (&ops[0], "ok rcode 3 []"),
                (&ops[1], "ok rcode 3 []"),
                (&ops[2], "ok rcode 3 []"),
                (&ops[3], &format!("ok rcode 0 ['{ip}']")),
                (&ops[4], "ok hello-8443"),
            ],
            user,
        );
    }
    let asked = net.upstream_asked();
    assert!(asked.iter().any(|n| n == "up.test"), "{asked:?}");
    assert!(
        asked.iter().all(|n| n == "up.test"),
        "only the listed name may be asked upstream: {asked:?}"
    );
}

#[test]
fn rebinding_onto_the_hosts_loopback_or_link_local_is_refused_unless_that_address_is_allowed() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    // A host service on the host's loopback, which a listed name points at.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let hosts = net.hosts(&format!(
        "127.0.0.1 lo.test\n169.254.169.254 meta.test\n{ip} mixed.test\n127.0.0.1 mixed.test\n"
    ));
    for user in users() {
        let ops: Vec<String> = [
            "resolve,lo.test".to_owned(),
            format!("connect,127.0.0.1,{port}"),
            "resolve,meta.test".into(),
            "resolve,mixed.test".into(),
        ]
        .into();
        let lines = run(
            user,
            &allow(&[
                &format!("tcp://lo.test:{port}"),
                "tcp://meta.test:80",
                "tcp://mixed.test:8443",
            ]),
            Some(&hosts),
            None,
            &ops,
        );
        expect(
            &lines,
            &[
                (&ops[0], "err gai"),
                // The sandbox's own loopback: nothing listens there.
                (&ops[1], "err 111"),
                (&ops[2], "err gai"),
                (&ops[3], &format!("ok ['{ip}']")),
            ],
            user,
        );
        assert!(
            listener.accept().is_err(),
            "the host's loopback was reached"
        );
        // Allowed as an address, the loopback answer is given and reaches the host.
        let ops: Vec<String> = [
            "resolve,lo.test".to_owned(),
            format!("connect,lo.test,{port}"),
        ]
        .into();
        let server = std::thread::spawn({
            let l = listener.try_clone().unwrap();
            move || {
                for _ in 0..500 {
                    if let Ok((mut c, _)) = l.accept() {
                        let _ = c.write_all(b"host-loopback\n");
                        let _ = c.read(&mut [0u8; 1]);
                        return true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                false
            }
        });
        let lines = run(
            user,
            &allow(&[
                &format!("tcp://lo.test:{port}"),
                &format!("tcp://127.0.0.1:{port}"),
            ]),
            Some(&hosts),
            None,
            &ops,
        );
        expect(
            &lines,
            &[(&ops[0], "ok ['127.0.0.1']"), (&ops[1], "ok host-loopback")],
            user,
        );
        assert!(server.join().unwrap());
    }
}

#[test]
fn issue_32_names_never_answer_the_hosts_own_interface_or_metadata_addresses() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let host_ip = net.ns.host_ip.clone();
    // A host service on every address of the host, which listed names point at through its
    // veth address, metadata addresses outside 169.254/16, and IPv6 forms of internal ones.
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let hosts = net.hosts(&format!(
        "{host_ip} self.test\n100.100.100.200 meta.test\nfd00:ec2::254 meta6.test\n\
         64:ff9b::a9fe:a9fe nat64.test\n::127.0.0.1 compat.test\n::ffff:{host_ip} mapped.test\n"
    ));
    for user in users() {
        let ops: Vec<String> = vec![
            "resolve,self.test".to_owned(),
            format!("connect,self.test,{port}"),
            format!("connect,{host_ip},{port}"),
            "resolve,meta.test".into(),
            "resolve6,meta6.test".into(),
            "resolve6,nat64.test".into(),
            "resolve6,compat.test".into(),
            "resolve6,mapped.test".into(),
        ];
        let specs: Vec<String> = ["self", "meta", "meta6", "nat64", "compat", "mapped"]
            .iter()
            .map(|n| format!("tcp://{n}.test:{port}"))
            .collect();
        let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
        let lines = run(user, &allow(&specs), Some(&hosts), None, &ops);
        expect(
            &lines,
            &[
                (&ops[0], "err gai"),
                (&ops[1], "err gai"),
                (&ops[2], "err 13"),
                (&ops[3], "err gai"),
                (&ops[4], "err gai"),
                (&ops[5], "err gai"),
                (&ops[6], "err gai"),
                (&ops[7], "err gai"),
            ],
            user,
        );
        assert!(listener.accept().is_err(), "a host service was reached");
        // An address rule naming the host's address lets the answer through.
        let ops: Vec<String> = vec![
            "resolve,self.test".to_owned(),
            format!("connect,self.test,{port}"),
        ];
        let server = std::thread::spawn({
            let l = listener.try_clone().unwrap();
            move || {
                for _ in 0..500 {
                    if let Ok((mut c, _)) = l.accept() {
                        let _ = c.write_all(b"host-self\n");
                        let _ = c.read(&mut [0u8; 1]);
                        return true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                false
            }
        });
        let self_spec = format!("tcp://self.test:{port}");
        let addr_spec = format!("tcp://{host_ip}:{port}");
        let lines = run(
            user,
            &allow(&[&self_spec, &addr_spec]),
            Some(&hosts),
            None,
            &ops,
        );
        expect(
            &lines,
            &[
                (&ops[0], &format!("ok ['{host_ip}']")),
                (&ops[1], "ok host-self"),
            ],
            user,
        );
        assert!(server.join().unwrap());
    }
}

#[test]
fn explain_names_lockboxs_resolver_and_the_name_rules() {
    let out = lockbox(
        User::Current,
        Path::new("/"),
        &[
            "check",
            "--explain",
            "--net-allow",
            "*.Example.ORG.:443",
            "--net-allow",
            "10.0.0.1:22",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("resolver: lockbox at 127.0.0.153:53"),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains("allow tcp+udp *.example.org:443"),
        "{}",
        text(&out)
    );
    assert!(
        stdout.contains("allow tcp+udp 10.0.0.1:22"),
        "{}",
        text(&out)
    );
}

#[test]
fn wildcards_in_a_deny_list_are_usage_errors() {
    let out = lockbox(
        User::Current,
        Path::new("/"),
        &["run", "--net-deny", "*.example.org:443", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("*.example.org:443"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_report_counts_answers_refused_names_and_left_out_host_addresses() {
    let dir = scratch();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "198.18.0.9 ok.test\n127.0.0.1 lo.test\n").unwrap();
    let report = dir.path().join("report.json");
    let out = common::command_as(User::Current)
        .env("LOCKBOX_NET_HOSTS_FILE", &hosts)
        .current_dir(dir.path())
        .args(["run", "-r"])
        .arg(client_dir())
        .args([
            "--net-allow",
            "tcp://ok.test:443",
            "--net-allow",
            "tcp://lo.test:443",
            "--report",
            report.to_str().unwrap(),
            "--",
            "python3",
            &client(),
            "udp,ok.test",
            "udp,evil.test",
            "udp,lo.test",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "udp,ok.test ok rcode 0 ['198.18.0.9']\nudp,evil.test ok rcode 3 []\n\
         udp,lo.test ok rcode 0 []\n",
        "{}",
        text(&out)
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let net = &json["network"];
    assert_eq!(net["dns_answered"], 2, "{net}");
    assert_eq!(net["dns_rebinding_refused"], 1, "{net}");
    assert_eq!(net["denied"], 1, "{net}");
    let first: Vec<&str> = net["denied_first"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(first.contains(&"dns evil.test"), "{net}");
    assert!(
        first.contains(&"dns lo.test -> 127.0.0.1 (host-internal)"),
        "{net}"
    );
}

/// What an op is logged as: (kind, decision, reason's start); `None`: not logged.
type Logged = Option<(&'static str, &'static str, &'static str)>;

#[test]
fn the_audit_log_has_one_event_per_decision_with_its_reason_and_the_asking_process() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    let hosts = net.hosts(&format!("{ip} name.test\n127.0.0.1 lo.test\n"));
    // One round: what each op is decided as (None: stays inside, not logged).
    let round: Vec<(String, &str, Logged)> = vec![
        (
            format!("connect,{ip},8080"),
            "ok hello-8080",
            Some(("connect", "allowed", "address rule tcp ")),
        ),
        (
            "udp,name.test".into(),
            "ok rcode 0",
            Some(("dns", "allowed", "name tcp://name.test:8443 listed")),
        ),
        (
            format!("connect,{ip},8443"),
            "ok hello-8443",
            Some(("connect", "allowed", "name tcp://name.test:8443 answered")),
        ),
        (
            "tcp,name.test".into(),
            "ok rcode 0",
            Some(("dns", "allowed", "name tcp://name.test:8443 listed")),
        ),
        (
            format!("connect,{ip},9999"),
            "err 13",
            Some(("connect", "denied", "not in the allow-list")),
        ),
        (
            "udp,evil.test".into(),
            "ok rcode 3 []",
            Some(("dns", "denied", "nxdomain: name not listed")),
        ),
        (
            "tcp,evil-tcp.test".into(),
            "ok rcode 3 []",
            Some(("dns", "denied", "nxdomain: name not listed")),
        ),
        (
            "udp,lo.test".into(),
            "ok rcode 0 []",
            Some(("dns", "denied", "rebinding: loopback answer refused")),
        ),
        (
            "connect,198.18.0.77,443".into(),
            "err 13",
            Some(("connect", "denied", "not in the allow-list")),
        ),
        // The sandbox's own loopback: nothing listens, nothing is logged.
        ("connect,127.0.0.1,8443".into(), "err 111", None),
    ];
    let dir = scratch();
    for user in users() {
        let log = dir.path().join(format!("audit-{user:?}.jsonl"));
        let mut net_args = allow(&[
            &format!("tcp://{ip}:8080"),
            "tcp://name.test:8443",
            "tcp://lo.test:8443",
        ]);
        net_args.extend(["--audit".to_owned(), log.to_str().unwrap().to_owned()]);
        let ops: Vec<String> = (0..10)
            .flat_map(|_| round.iter().map(|(op, _, _)| op.clone()))
            .collect();
        assert_eq!(ops.len(), 100);
        let lines = run(user, &net_args, Some(&hosts), None, &ops);
        for ((op, got), (_, want, _)) in lines.iter().zip(round.iter().cycle()) {
            assert!(got.starts_with(want), "{user:?}: {op}: {got}");
        }
        let mode = std::fs::metadata(&log).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let events = audit_events(&log);
        let expected: Vec<(&String, (&str, &str, &str))> = (0..10)
            .flat_map(|_| round.iter())
            .filter_map(|(op, _, e)| e.map(|e| (op, e)))
            .collect();
        assert_eq!(
            events.len(),
            expected.len(),
            "{user:?}: one event per decision: {events:#?}"
        );
        for (event, (op, (kind, decision, reason))) in events.iter().zip(&expected) {
            let show = format!("{user:?} {op}: {event}");
            assert_eq!(event["kind"], *kind, "{show}");
            assert_eq!(event["decision"], *decision, "{show}");
            assert!(
                event["reason"].as_str().unwrap().starts_with(reason),
                "{show}"
            );
            assert!(event["pid"].as_u64().unwrap() > 0, "{show}");
            assert!(
                event["command"].as_str().unwrap().contains("client.py"),
                "{show}"
            );
            assert!(event["ts"].as_str().unwrap().ends_with('Z'), "{show}");
            let args: Vec<&str> = op.split(',').collect();
            match *kind {
                "connect" => {
                    assert_eq!(event["protocol"], "tcp", "{show}");
                    assert_eq!(event["address"], args[1], "{show}");
                    assert_eq!(event["port"].to_string(), args[2], "{show}");
                    if reason.starts_with("name ") {
                        assert_eq!(event["name"], "name.test", "{show}");
                    }
                }
                _ => {
                    assert_eq!(event["protocol"], args[0], "{show}");
                    assert_eq!(event["name"], args[1], "{show}");
                    assert_eq!(event["qtype"], "A", "{show}");
                    let answers = event["answers"].as_array().unwrap();
                    if args[1] == "name.test" {
                        assert_eq!(answers, &[serde_json::json!(ip)], "{show}");
                    } else {
                        assert!(answers.is_empty(), "{show}");
                    }
                    if args[1] == "lo.test" {
                        assert_eq!(event["refused"], serde_json::json!(["127.0.0.1"]), "{show}");
                    }
                }
            }
        }
    }
}

#[test]
fn audit_files_that_cannot_be_opened_and_audits_without_a_list_are_usage_errors() {
    let dir = scratch();
    let missing = dir.path().join("no/such/dir/audit.jsonl");
    let out = lockbox(
        User::Current,
        Path::new("/"),
        &[
            "run",
            "--net-allow",
            "10.0.0.1:80",
            "--audit",
            missing.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(missing.to_str().unwrap()),
        "{}",
        text(&out)
    );
    let log = dir.path().join("audit.jsonl");
    let out = lockbox(
        User::Current,
        Path::new("/"),
        &["run", "--audit", log.to_str().unwrap(), "--", "true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--net-allow"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_deny_lists_refusals_are_audited_with_the_rule_and_loopback_stays_unlogged() {
    let dir = scratch();
    for user in users() {
        let log = dir.path().join(format!("deny-{user:?}.jsonl"));
        let out = common::command_as(user)
            .current_dir("/")
            .args(["run", "-r"])
            .arg(client_dir())
            .args(["--net-deny", "tcp://192.0.2.1:80", "--audit"])
            .arg(&log)
            .args([
                "--",
                "python3",
                &client(),
                "connect,192.0.2.1,80",
                "connect,127.0.0.1,9",
            ])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "connect,192.0.2.1,80 err 13\nconnect,127.0.0.1,9 err 111\n",
            "{user:?}: {}",
            text(&out)
        );
        let events = audit_events(&log);
        assert_eq!(events.len(), 1, "{user:?}: {events:#?}");
        let e = &events[0];
        assert_eq!(
            (&e["kind"], &e["decision"], &e["reason"]),
            (
                &serde_json::json!("connect"),
                &serde_json::json!("denied"),
                &serde_json::json!("deny rule tcp 192.0.2.1:80")
            ),
            "{e}"
        );
        assert_eq!(
            (&e["address"], &e["port"]),
            (&serde_json::json!("192.0.2.1"), &serde_json::json!(80))
        );
    }
}

/// `lockbox run` with `args` (after `run`) on a terminal: `script` gives lockbox a pty.
/// `react` sees everything the terminal showed so far, whenever more came and every 20 ms
/// (it may wait for something other than output), and returns what to type next, if
/// anything. Returns the whole output and lockbox's exit code.
fn on_terminal(
    user: User,
    args: &[String],
    hosts: Option<&Path>,
    mut react: impl FnMut(&str) -> Option<String>,
) -> (String, Option<i32>) {
    let argv: Vec<&str> = [binary().to_str().unwrap(), "run"]
        .into_iter()
        .chain(args.iter().map(String::as_str))
        .collect();
    let line = shlex::try_join(argv).unwrap();
    let mut cmd = Command::new("script");
    if let User::Nobody = user {
        std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
        std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
    }
    cmd.args(["-qfec", &line, "/dev/null"])
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(h) = hosts {
        cmd.env("LOCKBOX_NET_HOSTS_FILE", h);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let reader = {
        let mut stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut output = Vec::new();
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            tail(&String::from_utf8_lossy(&output))
        );
        match rx.recv_timeout(std::time::Duration::from_millis(20)) {
            Ok(bytes) => output.extend_from_slice(&bytes),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Some(typed) = react(&String::from_utf8_lossy(&output)) {
            stdin.write_all(typed.as_bytes()).unwrap();
        }
    }
    let status = child.wait().unwrap();
    drop(stdin);
    reader.join().unwrap();
    (String::from_utf8_lossy(&output).into_owned(), status.code())
}

/// `lockbox run --net-ask` on a terminal ([`on_terminal`]): each question shown there is
/// answered with the next of `answers` (`None`: left to time out). Returns the client's
/// `op -> result` lines, the number of questions, and lockbox's exit code. `linger`: the
/// sandbox lives on for a second after the client (in a shell).
fn run_asked(
    user: User,
    net: &[String],
    hosts: Option<&Path>,
    ops: &[String],
    answers: &[Option<&str>],
    linger: bool,
    mut on_question: impl FnMut(usize, u32),
) -> (Vec<(String, String)>, usize, Option<i32>) {
    let mut args: Vec<String> = vec!["-r".into(), client_dir().to_str().unwrap().into()];
    args.extend(net.iter().cloned());
    args.push("--".into());
    if linger {
        args.extend(["sh", "-c", "python3 \"$@\"; sleep 1", "sh"].map(str::to_owned));
    } else {
        args.push("python3".into());
    }
    args.push(client());
    args.extend(ops.iter().cloned());
    let mut asked = 0;
    let (text, code) = on_terminal(user, &args, hosts, |text| {
        let shown = text.matches("[o]nce / [a]lways / [N]o").count();
        if shown <= asked {
            return None;
        }
        let question = text.split("lockbox: allow ").nth(shown).unwrap_or("");
        let pid = question
            .split("(pid ")
            .nth(1)
            .and_then(|p| p.split(')').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        on_question(asked, pid);
        let answer = answers.get(asked).copied().flatten();
        asked = shown;
        answer.map(|a| format!("{a}\n"))
    });
    let lines = text
        .split(['\r', '\n'])
        .filter_map(|l| {
            let op = ops.iter().find(|op| l.starts_with(&format!("{op} ")))?;
            Some((op.clone(), l[op.len() + 1..].to_owned()))
        })
        .collect();
    (lines, asked, code)
}

fn reasons(log: &Path) -> Vec<(String, String)> {
    audit_events(log)
        .iter()
        .map(|e| {
            (
                e["decision"].as_str().unwrap().to_owned(),
                e["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn asked_destinations_pass_once_or_for_the_sandbox_and_no_or_silence_denies() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    let dir = scratch();
    for user in users() {
        let log = dir.path().join(format!("ask-{user:?}.jsonl"));
        let mut args = allow(&["tcp://198.18.0.250:1"]);
        args.extend(
            [
                "--net-ask",
                "--net-ask-timeout",
                "2s",
                "--audit",
                log.to_str().unwrap(),
            ]
            .map(str::to_owned),
        );
        let ops: Vec<String> = [8443, 8443, 8443, 8080, 8080]
            .iter()
            .map(|p| format!("connect,{ip},{p}"))
            .collect();
        let answers = [Some("o"), Some("a"), Some("n"), None];
        let (lines, asked, code) = run_asked(user, &args, None, &ops, &answers, false, |_, _| {});
        assert_eq!(code, Some(0), "{user:?}: {lines:?}");
        // The third connect was approved for the sandbox by the second: not asked.
        assert_eq!(asked, 4, "{user:?}: {lines:?}");
        expect(
            &lines,
            &[
                (&ops[0], "ok hello-8443"),
                (&ops[1], "ok hello-8443"),
                (&ops[2], "ok hello-8443"),
                (&ops[3], "err 13"),
                (&ops[4], "err 13"),
            ],
            user,
        );
        let got = reasons(&log);
        let want: Vec<(String, String)> = [
            ("asked", "not in the allow-list; asked"),
            ("allowed", "approved once"),
            ("asked", "not in the allow-list; asked"),
            ("allowed", "approved for the sandbox"),
            ("allowed", "approved for the sandbox"),
            ("asked", "not in the allow-list; asked"),
            ("denied", "denied by the terminal"),
            ("asked", "not in the allow-list; asked"),
            ("denied", "no answer in 2 s"),
        ]
        .iter()
        .map(|(d, r)| ((*d).to_owned(), (*r).to_owned()))
        .collect();
        assert_eq!(got, want, "{user:?}");
    }
}

#[test]
fn asked_names_are_answered_once_approved_and_their_connections_asked_with_the_name() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    let hosts = net.hosts(&format!("{ip} ask.test\n"));
    let dir = scratch();
    for user in users() {
        let log = dir.path().join(format!("ask-dns-{user:?}.jsonl"));
        let mut args = allow(&["tcp://listed.test:1"]);
        args.extend(["--net-ask", "--audit", log.to_str().unwrap()].map(str::to_owned));
        let ops: Vec<String> = ["udp,ask.test", "connect,ask.test,8443", "tcp,other.test"]
            .map(str::to_owned)
            .into();
        let mut questions = Vec::new();
        let (lines, asked, code) = run_asked(
            user,
            &args,
            Some(&hosts),
            &ops,
            &[Some("a"), Some("o"), Some("n")],
            false,
            |_, pid| questions.push(pid),
        );
        assert_eq!(code, Some(0), "{user:?}: {lines:?}");
        assert_eq!(asked, 3, "{user:?}: {lines:?}");
        assert!(questions.iter().all(|p| *p > 0), "{questions:?}");
        expect(
            &lines,
            &[
                (&ops[0], &format!("ok rcode 0 ['{ip}']")),
                (&ops[1], "ok hello-8443"),
                (&ops[2], "ok rcode 3 []"),
            ],
            user,
        );
        let events = audit_events(&log);
        let asked: Vec<&serde_json::Value> =
            events.iter().filter(|e| e["decision"] == "asked").collect();
        assert_eq!(asked.len(), 3, "{events:#?}");
        assert_eq!(
            (&asked[0]["kind"], &asked[0]["name"]),
            (&"dns".into(), &"ask.test".into())
        );
        // The connection is asked on its own, naming the name it was answered for.
        assert_eq!(asked[1]["kind"], "connect", "{events:#?}");
        assert_eq!(asked[1]["name"], "ask.test", "{events:#?}");
        assert_eq!(asked[2]["protocol"], "tcp", "{events:#?}");
        let denied = events.last().unwrap();
        assert_eq!(denied["reason"], "denied by the terminal", "{events:#?}");
    }
    assert!(net.upstream_asked().is_empty());
}

#[test]
fn a_caller_killed_while_asked_is_dropped() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    let dir = scratch();
    for user in users() {
        let log = dir.path().join(format!("ask-kill-{user:?}.jsonl"));
        let mut args = allow(&["tcp://198.18.0.250:1"]);
        args.extend(["--net-ask", "--audit", log.to_str().unwrap()].map(str::to_owned));
        let ops = vec![format!("connect,{ip},8443")];
        let (_, asked, code) = run_asked(user, &args, None, &ops, &[None], true, |_, pid| {
            sh(&["kill", "-9", &pid.to_string()]);
        });
        assert_eq!(asked, 1);
        assert_eq!(code, Some(0), "{user:?}");
        let got = reasons(&log);
        assert_eq!(
            got.last().map(|(d, r)| (d.as_str(), r.as_str())),
            Some(("denied", "the caller went away while asked")),
            "{user:?}: {got:?}"
        );
    }
}

/// The end of a long terminal output, for a failure's message.
fn tail(text: &str) -> &str {
    let mut at = text.len().saturating_sub(3000);
    while !text.is_char_boundary(at) {
        at += 1;
    }
    &text[at..]
}

/// The question of a real connection, `lockbox: allow ... to connect to DEST? ...`, in
/// `text`: where it starts and ends (after its timeout), if it was shown.
fn question_at(text: &str, dest: &str) -> Option<(usize, usize)> {
    let mut from = 0;
    while let Some(at) = text[from..].find("lockbox: allow ").map(|i| from + i) {
        let end = text[at..].find(" s) ").map(|i| at + i + 4)?;
        if text[at..end].contains(&format!(" to connect to {dest}? ")) {
            return Some((at, end));
        }
        from = end;
    }
    None
}

/// Issue 32: a second process of the sandbox keeps repainting the terminal's line with a
/// fake question (`\r\e[2K` + "allow pip install requests ... pypi.org:443?") while the
/// real one is open. Nothing of it may show between the real question and the answer's
/// echo: the sandbox's output waits until the answer (its writer blocks, the sandbox runs
/// on a pty of lockbox's), and the echo names the destination really allowed.
#[test]
fn issue_32_net_ask_question_cannot_be_repainted_by_the_sandbox() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    for user in users() {
        let dir = scratch();
        let progress = dir.path().join("progress");
        // The writer repaints every 10 ms (flooding would fill the pty's buffer before the
        // question, so that it could not write while asked) and counts its writes in a
        // file: the test sees it write while asked.
        let writer = format!(
            "i=0; while :; do i=$((i+1)); echo $i > {}; printf '\\r\\033[2Klockbox: allow pip \
             install requests (pid 7) to connect to pypi.org (151.101.0.223):443/tcp? [o]nce / \
             [a]lways / [N]o (30 s) FAKE'; sleep 0.01; done",
            progress.display(),
        );
        let op = format!("connect,{ip},8443");
        let mut args = allow(&["tcp://198.18.0.250:1"]);
        args.extend(["-r", client_dir().to_str().unwrap(), "-w"].map(str::to_owned));
        args.push(dir.path().to_str().unwrap().to_owned());
        args.extend(["--net-ask", "--", "sh", "-c"].map(str::to_owned));
        args.push(format!("({writer}) & exec python3 \"$@\""));
        args.extend(["sh".to_owned(), client(), op.clone()]);
        let dest = format!("{ip}:8443/tcp");
        let writes = || {
            std::fs::read_to_string(&progress)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
        };
        let mut seen_at = None;
        let mut answered = false;
        let (text, code) = on_terminal(user, &args, None, |text| {
            if answered || question_at(text, &dest).is_none() {
                return None;
            }
            // Asked: answer once the writer has written 50 more times.
            let now = writes()?;
            let first = *seen_at.get_or_insert(now);
            (now >= first + 50).then(|| {
                answered = true;
                "o\n".to_owned()
            })
        });
        assert_eq!(code, Some(0), "{user:?}: {}", tail(&text));
        assert!(answered, "{user:?}: never asked: {}", tail(&text));
        let (start, end) = question_at(&text, &dest).unwrap();
        let echo = format!("lockbox: allowed once {dest}");
        let echoed = text[end..].find(&echo).map(|i| end + i);
        let between = &text[start..echoed.unwrap_or(text.len())];
        assert!(!between.contains("FAKE"), "{user:?}: {between:?}");
        let echoed = echoed
            .unwrap_or_else(|| panic!("{user:?}: no {echo:?} after the question: {between:?}"));
        assert!(!text[start..end].contains('\x1b'), "{user:?}: {between:?}");
        // The writer went on after the answer, and the data arrived.
        assert!(
            text[echoed..].contains("FAKE"),
            "{user:?}: {:?}",
            tail(&text)
        );
        assert!(
            text.contains(&format!("{op} ok hello-8443")),
            "{user:?}: {:?}",
            tail(&text)
        );
    }
}

/// Issue 32: an argv[0] holding `\e]0;` (an unterminated "set title" that would swallow
/// the real destination) is shown escaped in the question, byte for byte printable ASCII.
#[test]
fn issue_32_net_ask_shows_the_command_line_escaped() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    for user in users() {
        let op = format!("connect,{ip},8443");
        let mut args = allow(&["tcp://198.18.0.250:1"]);
        args.extend(["-r", client_dir().to_str().unwrap(), "--net-ask"].map(str::to_owned));
        args.extend(["--", "python3", "-c"].map(str::to_owned));
        args.push(
            "import os, sys; os.execv(sys.executable, \
             ['\\x1b]0;pip install requests \\u202e', *sys.argv[1:]])"
                .to_owned(),
        );
        args.extend([client(), op.clone()]);
        let dest = format!("{ip}:8443/tcp");
        let mut answered = false;
        let (text, code) = on_terminal(user, &args, None, |text| {
            (!answered && question_at(text, &dest).is_some()).then(|| {
                answered = true;
                "n\n".to_owned()
            })
        });
        assert_eq!(code, Some(0), "{user:?}: {text:?}");
        let (start, end) =
            question_at(&text, &dest).unwrap_or_else(|| panic!("{user:?}: no question: {text:?}"));
        let question = &text[start..end];
        assert!(
            question.starts_with(r"lockbox: allow \033]0;pip install requests \342\200\256 /"),
            "{user:?}: {question:?}"
        );
        assert!(
            question.bytes().all(|b| (0x20..=0x7e).contains(&b)),
            "{user:?}: {question:?}"
        );
        assert!(!text.contains("\x1b]0;"), "{user:?}: {text:?}");
        assert!(
            text[end..].contains(&format!("lockbox: denied {dest}")),
            "{user:?}: {text:?}"
        );
        assert!(text.contains(&format!("{op} err 13")), "{user:?}: {text:?}");
    }
}

/// Under `--net-ask` on a terminal the command runs on lockbox's relayed pty (issue 32):
/// typed lines reach it, Ctrl-C interrupts it through its terminal, `/dev/tty` is its own
/// terminal, and exit codes and `--timeout` are as without.
#[test]
fn net_ask_on_a_terminal_keeps_input_interrupts_exit_codes_and_timeouts() {
    for user in users() {
        let run = |script: &str, extra: &[&str], typed: &str| {
            let mut args = allow(&["tcp://198.18.0.250:1"]);
            args.push("--net-ask".into());
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            args.extend(["--", "sh", "-c", script].map(str::to_owned));
            let mut done = false;
            on_terminal(user, &args, None, |text| {
                (!done && text.contains("ready")).then(|| {
                    done = true;
                    typed.to_owned()
                })
            })
        };
        let (text, code) = run(
            "echo ready > /dev/tty; read l; echo \"got $l\"; exit 3",
            &[],
            "hello\n",
        );
        assert_eq!(code, Some(3), "{user:?}: {text:?}");
        assert!(text.contains("got hello"), "{user:?}: {text:?}");
        let (text, code) = run("echo ready; exec sleep 60", &[], "\x03");
        assert_eq!(code, Some(130), "{user:?}: {text:?}");
        let (text, code) = run("exec sleep 60", &["--timeout", "1s"], "");
        assert_eq!(code, Some(124), "{user:?}: {text:?}");
    }
}

#[test]
fn net_ask_needs_an_allow_list_and_a_terminal() {
    let out = lockbox(
        User::Current,
        Path::new("/"),
        &["run", "--net-deny", "10.0.0.1:1", "--net-ask", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--net-ask"), "{}", text(&out));
    // No controlling terminal: setsid detaches lockbox from any.
    let out = Command::new("setsid")
        .arg(binary())
        .args([
            "run",
            "--net-allow",
            "10.0.0.1:1",
            "--net-ask",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("/dev/tty"), "{}", text(&out));
}

#[test]
fn questions_beyond_the_pending_cap_are_denied_at_once_and_the_rest_time_out() {
    let dir = scratch();
    for user in users() {
        let log = dir.path().join(format!("ask-cap-{user:?}.jsonl"));
        let mut args = allow(&["tcp://198.18.0.250:1"]);
        args.extend(
            [
                "--net-ask",
                "--net-ask-timeout",
                "2s",
                "--audit",
                log.to_str().unwrap(),
            ]
            .map(str::to_owned),
        );
        // 65 processes ask at once; nobody answers.
        let ops = vec!["fan,65,198.18.0.77,443".to_owned()];
        let (lines, _, code) = run_asked(user, &args, None, &ops, &[], false, |_, _| {});
        assert_eq!(code, Some(0), "{user:?}: {lines:?}");
        expect(&lines, &[(&ops[0], "ok {13: 65}")], user);
        let got = reasons(&log);
        let count = |d: &str, r: &str| got.iter().filter(|(gd, gr)| gd == d && gr == r).count();
        assert_eq!(
            count("asked", "not in the allow-list; asked"),
            64,
            "{got:?}"
        );
        assert_eq!(
            count("denied", "not in the allow-list; 64 questions pending"),
            1,
            "{got:?}"
        );
        assert_eq!(count("denied", "no answer in 2 s"), 64, "{got:?}");
        assert_eq!(got.len(), 129, "{got:?}");
    }
}

#[test]
fn an_approval_once_holds_for_the_address_asked_not_one_swapped_in_while_asked() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    for user in users() {
        let args: Vec<String> = allow(&["tcp://198.18.0.250:1"])
            .into_iter()
            .chain(["--net-ask".to_owned()])
            .collect();
        // Asked about :8443; the address becomes :8080 in memory before the answer.
        let ops = vec![format!("swap,{ip},8443,{ip},8080")];
        let mut texts = Vec::new();
        let (lines, asked, code) = run_asked(
            user,
            &args,
            None,
            &ops,
            &[Some("o"), Some("n")],
            false,
            |i, _| {
                texts.push(i);
                if i == 0 {
                    std::thread::sleep(std::time::Duration::from_secs(2));
                }
            },
        );
        assert_eq!(code, Some(0), "{user:?}: {lines:?}");
        // Read again after the verdict, the call names another destination: asked again.
        assert_eq!(asked, 2, "{user:?}: {lines:?}");
        expect(&lines, &[(&ops[0], "ok 13")], user);
    }
}

#[test]
fn the_name_a_tls_or_http_client_asks_for_must_be_listed_fronting_and_no_sni_are_refused() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    let hosts = net.hosts(&format!("{ip} svc.test a.wild.test wild.test other.test\n"));
    for user in users() {
        let audit = net.dir.path().join(format!("audit-{user:?}.jsonl"));
        let ops: Vec<String> = [
            "tls,svc.test,9443,svc.test",
            // Domain fronting: the listed name's address, another name asked for.
            "tls,svc.test,9443,other.test",
            "tls,svc.test,9443,-",
            "tls,a.wild.test,9443,b.wild.test",
            // `*.wild.test` covers subdomains, not the apex.
            "tls,a.wild.test,9443,wild.test",
            "http,svc.test,8081,svc.test",
            "http,svc.test,8081,other.test",
            // HTTP/1.0 with a half-close: the server answers only after the client's EOF.
            "http10,svc.test,8081,svc.test:8081",
            // Listed, but for another port.
            "http,svc.test,8081,a.wild.test",
            // A server that speaks first: no name is asked.
            "connect,svc.test,8443",
        ]
        .map(str::to_owned)
        .into();
        let mut net_args = allow(&[
            "tcp://svc.test:9443",
            "tcp://svc.test:8081",
            "tcp://svc.test:8443",
            "tcp://*.wild.test:9443",
        ]);
        net_args.extend(["--audit".to_owned(), audit.to_str().unwrap().to_owned()]);
        let lines = run(user, &net_args, Some(&hosts), None, &ops);
        let reset = "err 104";
        expect(
            &lines,
            &[
                (&ops[0], "ok tls-ok svc.test"),
                (&ops[1], reset),
                (&ops[2], reset),
                (&ops[3], "ok tls-ok b.wild.test"),
                (&ops[4], reset),
                (&ops[5], "ok http-ok svc.test"),
                (&ops[6], reset),
                (&ops[7], "ok http-ok svc.test:8081"),
                (&ops[8], reset),
                (&ops[9], "ok hello-8443"),
            ],
            user,
        );
        // Refused connections reached the server's address, but never a byte of theirs.
        let conns = net.take_conns(9);
        let count = |l: &str| conns.iter().filter(|c| *c == l).count();
        assert_eq!(
            (count("9443 data"), count("8081 data")),
            (2, 2),
            "{user:?}: {conns:?}"
        );
        assert_eq!(
            (count("9443 nothing"), count("8081 nothing")),
            (3, 2),
            "{user:?}: {conns:?}"
        );
        let events = audit_events(&audit);
        let find = |kind: &str, field: &str, value: &str, decision: &str| {
            events
                .iter()
                .find(|e| e["kind"] == kind && e[field] == value && e["decision"] == decision)
        };
        let fronted = find("tls", "sni", "other.test", "denied")
            .unwrap_or_else(|| panic!("no denied tls event for other.test: {events:#?}"));
        assert_eq!(fronted["reason"], "sni other.test not in the allow-list");
        assert_eq!(fronted["name"], "svc.test");
        assert_eq!(fronted["port"], 9443);
        assert!(
            find("tls", "sni", "b.wild.test", "allowed").is_some(),
            "{events:#?}"
        );
        assert!(
            find("http", "host", "other.test", "denied").is_some(),
            "{events:#?}"
        );
        assert!(
            events
                .iter()
                .any(|e| e["kind"] == "tls" && e["reason"] == "no sni"),
            "{events:#?}"
        );
    }
}

#[test]
fn address_rules_keep_the_direct_path_and_check_no_name() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    for user in users() {
        let ops = vec![format!("tls,{ip},9443,other.test")];
        let lines = run(
            user,
            &allow(&[&format!("tcp://{ip}:9443")]),
            None,
            None,
            &ops,
        );
        expect(&lines, &[(&ops[0], "ok tls-ok other.test")], user);
        assert_eq!(net.take_conns(1), ["9443 data"]);
    }
}

#[test]
fn relayed_connections_are_capped_per_sandbox_and_a_closed_one_frees_its_slot() {
    if skip_unless_root() {
        return;
    }
    let net = TestNet::new();
    let ip = net.ip.clone();
    let hosts = net.hosts(&format!("{ip} svc.test\n"));
    for user in users() {
        let ops = vec!["hold,svc.test,8443,70".to_owned()];
        let lines = run(
            user,
            &allow(&["tcp://svc.test:8443"]),
            Some(&hosts),
            None,
            &ops,
        );
        // 64 relayed at once (RELAY_SLOTS); the rest get ENOBUFS at connect.
        expect(&lines, &[(&ops[0], "ok 64 [(105, 6)] hello-8443")], user);
    }
}
