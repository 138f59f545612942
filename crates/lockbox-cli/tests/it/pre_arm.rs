//! Pre-armed starts (issue 34): `lockbox run` hands its command to a sandbox the user's
//! pre-arm helper set up ahead, and everything the caller sees is what a direct start
//! gives — output, exit codes, messages, the report, signals, timeouts — while a helper
//! that is not this build's, not this user's, or idle is never used. Each test has a
//! helper of its own (its own socket directory) and stops it.

use crate::common::{binary, scratch, text, users, Scratch, User};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A helper of this test's, in a socket directory of its own; stopped when dropped.
struct Helper {
    user: User,
    _scratch: Scratch,
    dir: PathBuf,
    pid: Option<u32>,
}

impl Helper {
    /// A socket directory for `user` (mode 0700, theirs); no helper started yet.
    fn dir_only(user: User) -> Helper {
        let scratch = scratch();
        let dir = scratch.path().join("pre-arm");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        if let User::Nobody = user {
            crate::common::give(&dir, user);
        }
        Helper {
            user,
            _scratch: scratch,
            dir,
            pid: None,
        }
    }

    fn start(user: User, extra: &[&str]) -> Helper {
        let mut helper = Helper::dir_only(user);
        let out = helper.lockbox(&[&["pre-arm", "start", "--json"][..], extra].concat());
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["started"], true, "{user:?} {}", text(&out));
        helper.pid = json["pid"].as_u64().map(|p| p as u32);
        helper
    }

    /// `lockbox ARGS` with this helper's directory, in a session of its own (`setsid`
    /// executes it in its own process: a spawned child is no group leader), stdin
    /// `/dev/null`.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("setsid");
        cmd.arg("-w").arg(binary()).args(args);
        if let User::Nobody = self.user {
            use std::os::unix::process::CommandExt;
            cmd.uid(65534).gid(65534);
        }
        cmd.env("LOCKBOX_PRE_ARM_DIR", &self.dir)
            .env_remove("LOCKBOX_PRE_ARM")
            .current_dir("/")
            .stdin(Stdio::null());
        cmd
    }

    fn lockbox(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs `args` (a `run` with `--json`) until it starts pre-armed (the first run of a
    /// policy starts directly and has spares armed).
    fn warm(&self, args: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.lockbox(args);
            if report(&out)["pre_armed"] == true {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{:?}: never pre-armed: {}",
                self.user,
                text(&out)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.lockbox(&["pre-arm", "stop"]);
        let Some(pid) = self.pid else { return };
        let deadline = Instant::now() + Duration::from_secs(30);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(pid) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// The last line of stdout as JSON (`--json`'s report).
fn report(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default()
}

/// What a caller sees of a run, timings and the start's kind left out.
fn seen(out: &Output) -> (Option<i32>, String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let body: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('{')).collect();
    (
        out.status.code(),
        body.join("\n"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn without_timings(mut report: serde_json::Value) -> serde_json::Value {
    if let Some(map) = report.as_object_mut() {
        for key in [
            "wall_time_ms",
            "cpu_time_ms",
            "peak_memory_bytes",
            "pre_armed",
        ] {
            map.remove(key);
        }
    }
    report
}

fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(marker) && !cmdline.contains("lockbox") {
                found.push(cmdline);
            }
        }
    }
    found
}

#[test]
fn a_warm_policy_starts_pre_armed_and_the_caller_sees_what_a_direct_start_gives() {
    for user in users() {
        let helper = Helper::start(user, &[]);
        let script = "read l; echo \"$l|$GREETING|$(pwd)|$(id -u)\"; echo to-stderr >&2; exit 7";
        let args = [
            "run",
            "--json",
            "--env",
            "GREETING=hi there",
            "--",
            "sh",
            "-c",
            script,
        ];
        helper.warm(&args);
        let with_stdin = |extra: &str| {
            let mut child = helper
                .command(&[&["run", "--json", extra][..], &args[2..]].concat())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"a line from stdin\n")
                .unwrap();
            child.wait_with_output().unwrap()
        };
        let armed = with_stdin("--pre-arm");
        let direct = with_stdin("--no-pre-arm");
        assert_eq!(
            report(&armed)["pre_armed"],
            true,
            "{user:?} {}",
            text(&armed)
        );
        assert_eq!(
            report(&direct)["pre_armed"],
            false,
            "{user:?} {}",
            text(&direct)
        );
        assert_eq!(seen(&armed), seen(&direct), "{user:?}");
        assert_eq!(armed.status.code(), Some(7));
        let uid = match user {
            User::Current => rustix::process::getuid().as_raw(),
            User::Nobody => 65534,
        };
        assert_eq!(
            seen(&armed).1,
            format!("a line from stdin|hi there|/|{uid}"),
            "{user:?}"
        );
        assert_eq!(
            without_timings(report(&armed)),
            without_timings(report(&direct)),
            "{user:?}"
        );
    }
}

#[test]
fn failures_read_as_a_direct_starts_do() {
    for user in users() {
        let helper = Helper::start(user, &[]);
        for args in [
            &["run", "--json", "--", "no-such-program-here"][..],
            &["run", "--json", "--", "/etc"][..],
            &[
                "run",
                "--json",
                "--timeout",
                "1s",
                "--",
                "sh",
                "-c",
                "sleep 20",
            ][..],
            &["run", "--json", "--", "sh", "-c", "kill -USR1 $$"][..],
        ] {
            helper.warm(args);
            let armed = helper.lockbox(args);
            let direct = helper.lockbox(&[&args[..2], &["--no-pre-arm"], &args[2..]].concat());
            assert_eq!(
                report(&armed)["pre_armed"],
                true,
                "{user:?} {}",
                text(&armed)
            );
            assert_eq!(seen(&armed), seen(&direct), "{user:?} {args:?}");
            assert_eq!(
                without_timings(report(&armed)),
                without_timings(report(&direct)),
                "{user:?} {args:?}"
            );
        }
        let code = |args: &[&str]| helper.lockbox(args).status.code();
        assert_eq!(code(&["run", "--", "no-such-program-here"]), Some(127));
        assert_eq!(code(&["run", "--", "/etc"]), Some(126));
        assert_eq!(code(&["run", "--", "sh", "-c", "kill -USR1 $$"]), Some(138));
    }
}

/// Waits until `marker` names a process (the command runs).
fn wait_for(marker: &str, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_with(marker).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn signals_to_lockbox_reach_a_pre_armed_command_as_they_reach_a_direct_one() {
    for user in users() {
        let helper = Helper::start(user, &[]);
        for (signal, code) in [("TERM", 143), ("INT", 3), ("USR2", 4)] {
            let marker = format!("pre-arm-signal-{signal}-{}-{user:?}", std::process::id());
            // sh runs a trap when `wait` is interrupted: INT and USR2 end it with 3 and 4;
            // TERM is lockbox's stop (128 + 15).
            let script = format!(
                "trap 'exit 3' INT; trap 'exit 4' USR2; sh -c 'sleep 1000; :' {marker} & wait"
            );
            let args = [
                "run",
                "--kill-grace",
                "300ms",
                "--json",
                "--",
                "sh",
                "-c",
                &script,
            ];
            helper.warm(&[
                "run",
                "--kill-grace",
                "300ms",
                "--json",
                "--",
                "sh",
                "-c",
                "true",
            ]);
            let mut child = helper
                .command(&args)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            wait_for(&marker, &mut child);
            Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status()
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(code),
                "{user:?} {signal} {}",
                text(&out)
            );
            assert_eq!(report(&out)["pre_armed"], true, "{user:?} {signal}");
            // Whatever the signal, nothing of the sandbox is left.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !processes_with(&marker).is_empty() {
                assert!(Instant::now() < deadline, "{:?}", processes_with(&marker));
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn a_killed_lockbox_takes_its_pre_armed_sandbox_with_it() {
    for user in users() {
        let helper = Helper::start(user, &[]);
        let marker = format!("pre-arm-killed-{}-{user:?}", std::process::id());
        let script = format!("sh -c 'sleep 1000; :' {marker}");
        helper.warm(&["run", "--json", "--", "sh", "-c", "true"]);
        let mut child = helper
            .command(&["run", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        wait_for(&marker, &mut child);
        // `setsid` (not a group leader here) executed lockbox in its own process.
        Command::new("kill")
            .args(["-KILL", &child.id().to_string()])
            .status()
            .unwrap();
        let _ = child.wait();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !processes_with(&marker).is_empty() {
            assert!(
                Instant::now() < deadline,
                "{user:?}: left running: {:?}",
                processes_with(&marker)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn runs_that_need_the_caller_at_the_start_or_opt_out_start_directly() {
    for user in users() {
        let helper = Helper::start(user, &[]);
        let plain = ["run", "--json", "--", "true"];
        helper.warm(&plain);
        let direct = |args: &[&str], env: Option<(&str, &str)>| {
            let mut cmd = helper.command(args);
            if let Some((k, v)) = env {
                cmd.env(k, v);
            }
            let out = cmd.output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{user:?} {args:?} {}",
                text(&out)
            );
            assert_eq!(
                report(&out)["pre_armed"],
                false,
                "{user:?} {args:?} {}",
                text(&out)
            );
        };
        direct(&["run", "--json", "--no-pre-arm", "--", "true"], None);
        direct(&plain, Some(("LOCKBOX_PRE_ARM", "0")));
        // A workdir's branch is the caller's.
        let work = scratch();
        std::fs::create_dir(work.path().join("state")).unwrap();
        std::fs::create_dir(work.path().join("work")).unwrap();
        crate::common::give(work.path(), user);
        let workdir = work.path().join("work");
        let workdir = workdir.to_str().unwrap();
        let state = work.path().join("state");
        direct(
            &[
                "run",
                "--json",
                "--state-dir",
                state.to_str().unwrap(),
                "--workdir",
                workdir,
                "--",
                "true",
            ],
            None,
        );
        // An ignored SIGINT (a shell's background job) is passed on by a direct start, and so
        // is a lower priority (nice): a spare's command would have the helper's.
        helper.warm(&["run", "--json", "--", "sh", "-c", "echo $(nice)"]);
        for (prefix, script) in [
            (&["sh", "-c", "trap '' INT; exec \"$@\"", "sh"][..], "sh"),
            (&["nice", "-n", "5"][..], "nice"),
        ] {
            let cmd = helper.command(&["run", "--json", "--", "sh", "-c", "echo $(nice)"]);
            let mut wrapped = Command::new(prefix[0]);
            wrapped
                .args(&prefix[1..])
                .arg(cmd.get_program())
                .args(cmd.get_args())
                .current_dir("/");
            for (k, v) in cmd.get_envs() {
                match v {
                    Some(v) => wrapped.env(k, v),
                    None => wrapped.env_remove(k),
                };
            }
            if let User::Nobody = user {
                use std::os::unix::process::CommandExt;
                wrapped.uid(65534).gid(65534);
            }
            let out = wrapped.stdin(Stdio::null()).output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{user:?} {script} {}",
                text(&out)
            );
            assert_eq!(
                report(&out)["pre_armed"],
                false,
                "{user:?} {script} {}",
                text(&out)
            );
            if script == "nice" {
                assert!(
                    text(&out).contains("\n5\n") || text(&out).contains(": 5\n"),
                    "{}",
                    text(&out)
                );
            }
        }
        // A terminal on stdin.
        let (master, slave) = openpty();
        let out = helper.command(&plain).stdin(slave).output().unwrap();
        drop(master);
        assert_eq!(report(&out)["pre_armed"], false, "{user:?} {}", text(&out));
        // A bad switch is a usage error.
        let out = helper
            .command(&plain)
            .env("LOCKBOX_PRE_ARM", "maybe")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            text(&out).contains("LOCKBOX_PRE_ARM=maybe"),
            "{}",
            text(&out)
        );
    }
}

fn openpty() -> (std::fs::File, std::fs::File) {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new(std::ffi::OsStr::from_bytes(name.to_bytes())))
        .unwrap();
    (std::fs::File::from(master), slave)
}

#[test]
fn stop_returns_once_the_helper_is_gone_and_a_start_right_after_starts_a_new_one() {
    for user in users() {
        let mut helper = Helper::start(user, &[]);
        let first = helper.pid.unwrap();
        helper.warm(&["run", "--json", "--", "true"]);
        let out = helper.lockbox(&["pre-arm", "stop", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["stopped"], true, "{}", text(&out));
        assert_eq!(json["exited"], true, "{}", text(&out));
        assert_eq!(json["pid"], first, "{}", text(&out));
        assert!(!alive(first), "{user:?}: the helper outlived its stop");
        // Before, this found the old helper still answering and called it started.
        let out = helper.lockbox(&["pre-arm", "start", "--json"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["started"], true, "{}", text(&out));
        let second = json["pid"].as_u64().unwrap() as u32;
        helper.pid = Some(second);
        assert_ne!(second, first, "{user:?}");
        assert!(alive(second), "{user:?}");
        let out = helper.lockbox(&["pre-arm", "stop"]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "pre-arm helper stopped",
            "{}",
            text(&out)
        );
        let out = helper.lockbox(&["pre-arm", "stop", "--json"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["stopped"], false, "{}", text(&out));
    }
}

#[test]
fn pre_arm_on_first_use_starts_a_helper_and_it_exits_when_idle() {
    for user in users() {
        let mut helper = Helper::dir_only(user);
        let out = helper.lockbox(&["pre-arm", "status"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            text(&out).contains("no pre-arm helper runs"),
            "{}",
            text(&out)
        );
        // --pre-arm: this run starts directly, and a helper is started for the next.
        let out = helper.lockbox(&["run", "--pre-arm", "--json", "--", "true"]);
        assert_eq!(report(&out)["pre_armed"], false, "{}", text(&out));
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            let out = helper.lockbox(&["pre-arm", "status", "--json"]);
            if out.status.code() == Some(0) {
                break serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "no helper started: {}",
                text(&out)
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        helper.pid = status["pid"].as_u64().map(|p| p as u32);
        helper.warm(&["run", "--json", "--", "true"]);
        helper.lockbox(&["pre-arm", "stop"]);
        // An idle helper exits by itself, with its spares.
        let helper = Helper::start(user, &["--idle", "1s"]);
        let pid = helper.pid.unwrap();
        helper.lockbox(&["run", "--json", "--", "true"]);
        let deadline = Instant::now() + Duration::from_secs(30);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "{user:?}: the idle helper still runs"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = helper.lockbox(&["pre-arm", "status"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    }
}

#[test]
fn a_helper_of_another_build_or_in_an_open_directory_is_never_used() {
    for user in users() {
        // Another build: a copy of the binary elsewhere (another inode) runs the helper.
        let other = scratch();
        let copy = other.path().join("lockbox");
        std::fs::copy(binary(), &copy).unwrap();
        std::fs::set_permissions(other.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let helper = Helper::dir_only(user);
        let mut start = Command::new(&copy);
        start
            .args(["pre-arm", "start"])
            .env("LOCKBOX_PRE_ARM_DIR", &helper.dir);
        if let User::Nobody = user {
            use std::os::unix::process::CommandExt;
            start.uid(65534).gid(65534);
        }
        let out = output_of_fresh_copy(&mut start);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        for _ in 0..5 {
            let out = helper.lockbox(&["run", "--json", "--", "true"]);
            assert_eq!(report(&out)["pre_armed"], false, "{user:?} {}", text(&out));
        }
        let mut stop = Command::new(&copy);
        stop.args(["pre-arm", "stop"])
            .env("LOCKBOX_PRE_ARM_DIR", &helper.dir);
        if let User::Nobody = user {
            use std::os::unix::process::CommandExt;
            stop.uid(65534).gid(65534);
        }
        output_of_fresh_copy(&mut stop);
        // A socket directory others may enter is refused (and runs start directly).
        std::fs::set_permissions(&helper.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = helper.lockbox(&["pre-arm", "start"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains("open to other users"), "{}", text(&out));
        let out = helper.lockbox(&["run", "--pre-arm", "--json", "--", "true"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(report(&out)["pre_armed"], false, "{}", text(&out));
    }
}

#[test]
fn the_terminals_ctrl_z_pauses_a_pre_armed_sandbox_and_ctrl_c_reaches_its_command() {
    for user in users() {
        let helper = Helper::start(user, &[]);
        let marker = format!("pre-arm-tty-{}-{user:?}", std::process::id());
        let out = scratch();
        crate::common::give(out.path(), user);
        let report_file = out.path().join("out");
        helper.warm(&["run", "--json", "--", "sh", "-c", "true"]);
        // `script` gives lockbox a terminal as its controlling terminal (its stdio is not
        // one): what is typed on the master is what a user types.
        let inner = format!(
            "exec {} run --json -- sh -c \"trap 'exit 3' INT; sh -c 'sleep 1000; :' {marker} & wait\" \
             </dev/null >{} 2>&1",
            binary().display(),
            report_file.display()
        );
        let mut cmd = Command::new("script");
        // From the directory the policy was warmed in: spares are kept per directory.
        cmd.args(["-qfec", &inner, "/dev/null"])
            .current_dir("/")
            .env("LOCKBOX_PRE_ARM_DIR", &helper.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null());
        if let User::Nobody = user {
            use std::os::unix::process::CommandExt;
            cmd.uid(65534).gid(65534);
        }
        let mut child = KillOnDrop(cmd.spawn().unwrap());
        wait_for(&marker, &mut child.0);
        let mut keys = child.0.stdin.take().unwrap();
        use std::io::Write;
        let sleeper = || {
            let pids: Vec<u32> = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|pid: &u32| {
                    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                        String::from_utf8_lossy(&c).starts_with("sleep\x001000")
                            && std::fs::read(format!("/proc/{}/cmdline", ppid(*pid)))
                                .is_ok_and(|p| String::from_utf8_lossy(&p).contains(&marker))
                    })
                })
                .collect();
            pids.first().copied()
        };
        let state = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit(") ").next().and_then(|r| r.chars().next()))
        };
        // The marker's shell may not have started its `sleep` yet.
        let deadline = Instant::now() + Duration::from_secs(20);
        let sleeping = loop {
            if let Some(pid) = sleeper() {
                break pid;
            }
            assert!(
                Instant::now() < deadline,
                "{user:?}: the command's sleep never ran"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        // Ctrl-Z: the sandbox's processes stop (lockbox stops too; nothing continues it
        // but us, as a shell's `fg` would).
        keys.write_all(b"\x1a").unwrap();
        let lockbox_pid = lockbox_in(&child.0);
        let script_pid = child.0.id();
        let deadline = Instant::now() + Duration::from_secs(20);
        // `script` stops itself once it sees its child stop: a continue sent before that
        // would leave it stopped for good, and its child unreaped.
        while state(sleeping) != Some('T')
            || state(lockbox_pid) != Some('T')
            || state(script_pid) != Some('T')
        {
            assert!(
                Instant::now() < deadline,
                "{user:?}: not paused: {:?}",
                state(sleeping)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // `script` stopped itself with its child, as a job's processes do: a shell's `fg`
        // continues them all.
        Command::new("kill")
            .args(["-CONT", &lockbox_pid.to_string(), &child.0.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while state(sleeping) == Some('T') {
            assert!(Instant::now() < deadline, "{user:?}: not resumed");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Ctrl-C: the command's trap runs.
        keys.write_all(b"\x03").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "{user:?}: the run never ended");
            std::thread::sleep(Duration::from_millis(20));
        };
        let written = std::fs::read_to_string(&report_file).unwrap();
        let report: serde_json::Value =
            serde_json::from_str(written.lines().last().unwrap_or("")).unwrap_or_default();
        assert_eq!(report["exit_code"], 3, "{user:?} {status} {written}");
        assert_eq!(report["pre_armed"], true, "{user:?} {written}");
    }
}

/// Runs `cmd`, an executable this process has just written: a child another thread of
/// the test forked meanwhile may still hold it open for writing until it executes, and the
/// kernel then refuses to execute it (`ETXTBSY`) for a moment.
fn output_of_fresh_copy(cmd: &mut Command) -> Output {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                assert!(Instant::now() < deadline, "{e}");
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other.unwrap(),
        }
    }
}

/// A child killed (with its children) if the test fails before it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.0.id()))
                .unwrap_or_default();
            for pid in kids.split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn ppid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(") ").next().map(str::to_owned))
        .and_then(|r| r.split_whitespace().nth(1).and_then(|p| p.parse().ok()))
        .unwrap_or(0)
}

/// The `lockbox run` that `script` started (its child).
fn lockbox_in(script: &std::process::Child) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|&pid| {
                ppid(pid) == script.id()
                    && std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("lockbox"))
            });
        if let Some(pid) = found {
            return pid;
        }
        assert!(Instant::now() < deadline, "no lockbox under script");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection whose first record is no request of ours is closed at once (no thread
/// waits on it), and the helper goes on serving.
#[test]
fn a_connection_that_sends_no_request_of_ours_is_closed_and_the_helper_goes_on() {
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketAddrUnix, SocketType};
    let helper = Helper::start(User::Current, &[]);
    let socket = std::fs::read_dir(&helper.dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "sock"))
        .expect("the helper's socket");
    let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
    rustix::net::connect(&fd, &SocketAddrUnix::new(&socket).unwrap()).unwrap();
    rustix::net::send(&fd, b"not a request", SendFlags::empty()).unwrap();
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(10)),
    )
    .unwrap();
    let mut buf = [0u8; 64];
    let got = rustix::net::recv(&fd, &mut buf[..], RecvFlags::empty());
    assert!(matches!(got, Ok((0, _))), "not closed: {got:?}");
    let out = helper.lockbox(&["pre-arm", "status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// The sandboxes' inits the helper `pid` holds: its children named `lockbox-init`.
fn inits_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            ppid(child) == pid
                && std::fs::read_to_string(format!("/proc/{child}/comm"))
                    .is_ok_and(|c| c.trim() == "lockbox-init")
        })
        .collect()
}

/// A used spare's init waits, after its report, for the helper to let it go (its
/// namespaces' teardown then does not hold up the caller's end): once the caller has the
/// answer, it goes; nothing of the run stays.
#[test]
fn a_used_spare_is_gone_once_its_caller_has_the_answer() {
    for user in users() {
        let helper = Helper::start(user, &[]);
        let pid = helper.pid.expect("the helper's pid");
        let args = ["run", "--json", "--", "true"];
        helper.warm(&args);
        // The spares there are now (the armer may still be making one).
        std::thread::sleep(Duration::from_millis(500));
        let before = inits_of(pid);
        assert!(!before.is_empty(), "{user:?}: no spare");
        let out = helper.lockbox(&args);
        assert_eq!(report(&out)["pre_armed"], true, "{user:?} {}", text(&out));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = inits_of(pid);
            if before.iter().any(|init| !left.contains(init)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{user:?}: the used spare still runs: {before:?} -> {left:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
