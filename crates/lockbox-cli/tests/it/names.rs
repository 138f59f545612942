//! Issue 15, items 7 (part), 8 and 9, end to end: file names are bytes (a name that is not
//! UTF-8 commits and travels through JSON exactly), review output cannot be forged by a
//! name (newlines, carriage returns, escape sequences are quoted), and a closed stdout is
//! never a panic. As the current user and (when root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use base64::Engine as _;
use common::{command_as, give, scratch, text, users, User};
use std::ffi::{OsStr, OsString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

/// The name the reproduction writes: `open(b"caf\xe9.txt", "wb")`.
const LATIN1: &[u8] = b"caf\xe9.txt";
/// Shell that writes it (dash's and bash's printf both know octal escapes).
const WRITE_LATIN1: &str = r#"printf x > "$(printf 'caf\351.txt')""#;

/// Names that forge review lines on a terminal: a newline starting a fake `M` line, a
/// carriage return overwriting the line, and cursor-up + erase-line escape sequences that
/// wipe the real `D important.txt` line above.
const WRITE_FORGERS: &str = r#"printf 1 > "$(printf 'n\nM a.txt')"
printf 2 > "$(printf 'r\rD nothing')"
printf 3 > "$(printf 'e\033[1A\033[2K')"
rm important.txt"#;

struct Dirs {
    _tmp: crate::common::Scratch,
    work: PathBuf,
    state: PathBuf,
    user: User,
}

impl Dirs {
    /// A workdir (holding `important.txt`) and a state directory owned by `user`. `name`
    /// is the workdir's own name (bytes).
    fn new(user: User, name: &[u8]) -> Dirs {
        let tmp = scratch();
        let work = tmp.path().join(OsStr::from_bytes(name));
        let state = tmp.path().join("state");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("important.txt"), "keep\n").unwrap();
        give(tmp.path(), user);
        Dirs {
            _tmp: tmp,
            work,
            state,
            user,
        }
    }

    fn lockbox<S: AsRef<OsStr>>(&self, args: &[S]) -> Output {
        command_as(self.user)
            .args(args)
            .current_dir("/")
            .output()
            .unwrap()
    }

    /// `lockbox run --workdir W --state-dir S EXTRA -- sh -c SCRIPT`.
    fn run(&self, extra: &[&str], script: &str) -> Output {
        let mut args: Vec<OsString> = vec!["run".into(), "--workdir".into()];
        args.push(self.work.clone().into());
        args.extend(["--state-dir".into(), self.state.clone().into()]);
        args.extend(extra.iter().map(OsString::from));
        args.extend(["--".into(), "sh".into(), "-c".into(), script.into()]);
        self.lockbox(&args)
    }

    /// `lockbox KIND --workdir W --state-dir S ARGS...` (pipeline, gather).
    fn txn(&self, kind: &str, args: &[&str]) -> Output {
        let mut all: Vec<OsString> = vec![kind.into(), "--workdir".into()];
        all.push(self.work.clone().into());
        all.extend(["--state-dir".into(), self.state.clone().into()]);
        all.extend(args.iter().map(OsString::from));
        self.lockbox(&all)
    }

    /// `lockbox branch ARGS... --state-dir S`.
    fn branch(&self, args: &[&str]) -> Output {
        let mut all: Vec<OsString> = vec!["branch".into()];
        all.extend(args.iter().map(OsString::from));
        all.extend(["--state-dir".into(), self.state.clone().into()]);
        self.lockbox(&all)
    }

    /// `lockbox txn --state-dir S ARGS...`.
    fn txn_cmd(&self, args: &[&str]) -> Output {
        let mut all: Vec<OsString> = vec!["txn".into(), "--state-dir".into()];
        all.push(self.state.clone().into());
        all.extend(args.iter().map(OsString::from));
        self.lockbox(&all)
    }

    fn branch_ids(&self) -> Vec<String> {
        let out = self.branch(&["list", "--json"]);
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        list.as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// Exit code as expected, and no panic (exit 101, "panicked at") whatever happened.
fn assert_exit(out: &Output, code: i32, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() != Some(101) && !stderr.contains("panicked"),
        "{what}: panic: {}",
        text(out)
    );
    assert_eq!(out.status.code(), Some(code), "{what}: {}", text(out));
}

/// A path in its JSON form back to bytes (a string, or `{"bytes": base64}`).
fn json_path(v: &serde_json::Value) -> Vec<u8> {
    match v {
        serde_json::Value::String(s) => s.as_bytes().to_vec(),
        serde_json::Value::Object(o) => base64::engine::general_purpose::STANDARD
            .decode(o["bytes"].as_str().unwrap())
            .unwrap(),
        other => panic!("not a path: {other}"),
    }
}

fn change_paths(changes: &serde_json::Value) -> Vec<Vec<u8>> {
    changes
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json_path(&c["path"]))
        .collect()
}

#[test]
fn run_workdir_commits_keeps_and_reports_a_name_that_is_not_utf8() {
    for user in users() {
        let d = Dirs::new(user, b"work");
        let target = d.work.join(OsStr::from_bytes(LATIN1));

        // Was: exit 101, "path contains invalid UTF-8 characters", after committing.
        let out = d.run(&[], WRITE_LATIN1);
        assert_exit(&out, 0, &format!("{user:?} commit"));
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
        std::fs::remove_file(&target).unwrap();

        let out = d.run(&["--dry-run"], WRITE_LATIN1);
        assert_exit(&out, 0, "dry run");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("A \"caf\\351.txt\"\n"),
            "{}",
            text(&out)
        );
        assert!(!target.exists());

        let report = d.state.with_file_name("report.json");
        let out = d.run(
            &["--report", report.to_str().unwrap(), "--on-exit", "keep"],
            WRITE_LATIN1,
        );
        assert_exit(&out, 0, "keep with --report");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        assert_eq!(v["branch"]["action"], "kept", "{v}");
        assert_eq!(change_paths(&v["changes"]), vec![LATIN1.to_vec()], "{v}");
        assert_eq!(
            v["changes"][0]["path"],
            serde_json::json!({ "bytes": "Y2Fm6S50eHQ=" })
        );

        let ids = d.branch_ids();
        assert_eq!(ids.len(), 1);
        let out = d.branch(&["show", &ids[0], "--json"]);
        assert_exit(&out, 0, "branch show --json");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(change_paths(&v["changes"]), vec![LATIN1.to_vec()], "{v}");
        let out = d.branch(&["diff", &ids[0], "--json"]);
        assert_exit(&out, 0, "branch diff --json");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json_path(&v[0]["path"]), LATIN1, "{v}");
        let out = d.branch(&["diff", &ids[0]]);
        assert_exit(&out, 0, "branch diff");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("+++ \"b/caf\\351.txt\"\n"),
            "{}",
            text(&out)
        );
        let out = d.branch(&["commit", &ids[0], "--json"]);
        assert_exit(&out, 0, "branch commit");
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
    }
}

#[test]
fn a_workdir_whose_name_is_not_utf8_is_recorded_exactly() {
    for user in users() {
        let d = Dirs::new(user, b"w\xe9rk");
        let out = d.run(&["--on-exit", "keep"], "echo new > n.txt");
        assert_exit(&out, 0, &format!("{user:?} keep"));
        let out = d.branch(&["list", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let recorded = json_path(&v[0]["meta"]["workdir"]);
        assert_eq!(
            Path::new(OsStr::from_bytes(&recorded)),
            std::fs::canonicalize(&d.work).unwrap(),
            "{v}"
        );
        let out = d.branch(&["list"]);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("/w\\351rk\""),
            "{}",
            text(&out)
        );
        let id = d.branch_ids().remove(0);
        assert_exit(&d.branch(&["commit", &id]), 0, "branch commit");
        assert_eq!(std::fs::read(d.work.join("n.txt")).unwrap(), b"new\n");

        let out = d.txn("pipeline", &["--stage", "echo p > p.txt"]);
        assert_exit(&out, 0, "pipeline in a non-UTF-8 workdir");
        let out = d.txn_cmd(&["list"]);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("/w\\351rk\""),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn pipeline_and_gather_commit_a_name_that_is_not_utf8() {
    for user in users() {
        let d = Dirs::new(user, b"work");
        let target = d.work.join(OsStr::from_bytes(LATIN1));

        // Was: exit 4, "write .../intent.json: path contains invalid UTF-8 characters".
        let out = d.txn("pipeline", &["--json", "--stage", WRITE_LATIN1]);
        assert_exit(&out, 0, &format!("{user:?} pipeline"));
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["action"], "committed", "{v}");
        assert_eq!(change_paths(&v["changes"]), vec![LATIN1.to_vec()], "{v}");
        let id = v["id"].as_str().unwrap().to_owned();
        let out = d.txn_cmd(&["show", &id]);
        assert_exit(&out, 0, "txn show");
        let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (&shown["state"], &shown["exit_code"]),
            (&"committed".into(), &0.into()),
            "{shown}"
        );
        std::fs::remove_file(&target).unwrap();

        let out = d.txn("pipeline", &["--dry-run", "--stage", WRITE_LATIN1]);
        assert_exit(&out, 0, "pipeline --dry-run");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "A \"caf\\351.txt\"\n",
            "{}",
            text(&out)
        );

        let gather = [
            "--json",
            "--source",
            &format!("a={WRITE_LATIN1}"),
            "--source",
            r#"b=printf y > "$(printf 'b\377')""#,
        ];
        let out = d.txn("gather", &gather);
        assert_exit(&out, 0, "gather");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut paths = change_paths(&v["changes"]);
        paths.sort();
        assert_eq!(paths, vec![b"b\xff".to_vec(), LATIN1.to_vec()], "{v}");
        assert_eq!(std::fs::read(&target).unwrap(), b"x");
        assert_eq!(
            std::fs::read(d.work.join(OsStr::from_bytes(b"b\xff"))).unwrap(),
            b"y"
        );
    }
}

/// No raw control byte a terminal acts on, the real deletion on a line of its own, and no
/// forged line.
fn assert_unforged(bytes: &[u8], what: &str) {
    let shown = String::from_utf8_lossy(bytes);
    assert!(
        !bytes.contains(&0x1b) && !bytes.contains(&b'\r'),
        "{what}: raw control characters reach the terminal:\n{shown}"
    );
    assert!(
        !shown.lines().any(|l| l == "M a.txt"),
        "{what}: a name forged a line:\n{shown}"
    );
}

/// The change lines of `--dry-run`, `branch show` and the summaries: one per change,
/// quoted.
fn assert_change_lines(bytes: &[u8], what: &str) {
    assert_unforged(bytes, what);
    let shown = String::from_utf8_lossy(bytes);
    for line in [
        "D important.txt",
        r#"A "e\033[1A\033[2K""#,
        r#"A "n\nM a.txt""#,
        r#"A "r\rD nothing""#,
    ] {
        assert!(
            shown.lines().any(|l| l == line),
            "{what}: no line {line:?}:\n{shown}"
        );
    }
}

#[test]
fn names_cannot_forge_review_output() {
    for user in users() {
        let d = Dirs::new(user, b"work");
        let out = d.run(&["--dry-run"], WRITE_FORGERS);
        assert_exit(&out, 0, &format!("{user:?} run --dry-run"));
        assert_change_lines(&out.stdout, "run --dry-run");

        let out = d.run(&["--on-exit", "keep"], WRITE_FORGERS);
        assert_exit(&out, 0, "run --on-exit keep");
        let id = d.branch_ids().remove(0);
        let out = d.branch(&["show", &id]);
        assert_exit(&out, 0, "branch show");
        assert_change_lines(&out.stdout, "branch show");
        let out = d.branch(&["diff", &id]);
        assert_exit(&out, 0, "branch diff");
        assert_unforged(&out.stdout, "branch diff");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("--- \"a/n\\nM a.txt\"\n"),
            "{}",
            text(&out)
        );
        assert_exit(&d.branch(&["abort", &id]), 0, "branch abort");

        let out = d.txn("pipeline", &["--dry-run", "--stage", WRITE_FORGERS]);
        assert_exit(&out, 0, "pipeline --dry-run");
        assert_change_lines(&out.stdout, "pipeline --dry-run");
        let out = d.txn("pipeline", &["--prepare", "--stage", WRITE_FORGERS]);
        assert_exit(&out, 0, "pipeline --prepare");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let out = d.txn_cmd(&["list"]);
        assert_unforged(&out.stdout, "txn list");
        let out = d.txn_cmd(&["show", &id]);
        assert_unforged(&out.stdout, "txn show");
        let out = d.txn_cmd(&["commit", &id]);
        assert_exit(&out, 0, "txn commit");
        assert_change_lines(&out.stderr, "txn commit summary");

        // Gather conflicts and error messages (a stale base lists the paths) quote too.
        let out = d.txn(
            "gather",
            &[
                "--source",
                r#"a=printf a > "$(printf 'n\nM a.txt')""#,
                "--source",
                r#"b=printf b > "$(printf 'n\nM a.txt')""#,
            ],
        );
        assert_exit(&out, 3, "gather conflict");
        assert_unforged(&out.stderr, "gather conflict");
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains("conflict: \"n\\nM a.txt\" written by a, b"),
            "{}",
            text(&out)
        );
        let out = d.run(
            &["--on-exit", "keep"],
            r#"printf edit > "$(printf 'e\033[1A\033[2K')""#,
        );
        assert_exit(&out, 0, "keep an edit");
        let id = d.branch_ids().remove(0);
        // Any later workdir change has a ctime >= the branch's base: stale.
        std::fs::write(d.work.join(OsStr::from_bytes(b"e\x1b[1A\x1b[2K")), "host").unwrap();
        let out = d.branch(&["commit", &id]);
        assert_exit(&out, 5, "stale base");
        assert_unforged(&out.stderr, "stale base message");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(r#""e\033[1A\033[2K""#),
            "{}",
            text(&out)
        );
    }
}

/// The write end of a pipe whose read end is already closed: `lockbox ... | true` where
/// `true` exited first. Every write to it fails with EPIPE.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is an array of two ints for pipe2(2) to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

fn with_closed_stdout<S: AsRef<OsStr>>(user: User, args: &[S]) -> Output {
    command_as(user)
        .args(args)
        .current_dir("/")
        .stdout(Stdio::from(closed_pipe()))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Issue 15 item 9: `lockbox txn list | true`, `branch list --json | true` and
/// `check --json | head` panicked with "failed printing to stdout: Broken pipe" (exit 101).
/// Every subcommand that prints, with a stdout nobody reads: its own exit code, no panic.
#[test]
fn a_closed_stdout_is_never_a_panic() {
    for user in users() {
        let d = Dirs::new(user, b"work");
        let (w, s) = (d.work.to_str().unwrap(), d.state.to_str().unwrap());
        // Something to list: a committed and a prepared transaction, a kept branch.
        assert_exit(
            &d.txn("pipeline", &["--stage", "echo 1 > one.txt"]),
            0,
            "setup pipeline",
        );
        let prepared = d.txn("pipeline", &["--prepare", "--stage", "echo 2 > two.txt"]);
        let txn_id = String::from_utf8_lossy(&prepared.stdout).trim().to_owned();
        assert_exit(
            &d.run(&["--on-exit", "keep"], "echo 3 > three.txt"),
            0,
            "keep",
        );
        let branch_id = d.branch_ids().remove(0);

        let b = |args: &[&str]| {
            let mut all = vec!["branch", "--state-dir", s];
            all.extend_from_slice(args);
            all.iter().map(|a| a.to_string()).collect::<Vec<_>>()
        };
        let t = |args: &[&str]| {
            let mut all = vec!["txn", "--state-dir", s];
            all.extend_from_slice(args);
            all.iter().map(|a| a.to_string()).collect::<Vec<_>>()
        };
        let k = |kind: &str, args: &[&str]| {
            let mut all = vec![kind, "--workdir", w, "--state-dir", s];
            all.extend_from_slice(args);
            all.iter().map(|a| a.to_string()).collect::<Vec<_>>()
        };
        let v = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let cases: Vec<(Vec<String>, i32)> = vec![
            (t(&["list"]), 0),
            (t(&["list", "--json"]), 0),
            (t(&["show", &txn_id]), 0),
            (t(&["--json", "show", "nope"]), 2),
            (t(&["recover"]), 0),
            (b(&["list"]), 0),
            (b(&["list", "--json"]), 0),
            (b(&["show", &branch_id]), 0),
            (b(&["show", &branch_id, "--json"]), 0),
            (b(&["diff", &branch_id]), 0),
            (b(&["diff", &branch_id, "--json"]), 0),
            (v(&["check"]), 0),
            (v(&["check", "--json"]), 0),
            (v(&["check", "--explain"]), 0),
            (v(&["--help"]), 0),
            (k("pipeline", &["--stage", "echo out"]), 0),
            (
                k("pipeline", &["--json", "--stage", "echo 4 > four.txt"]),
                0,
            ),
            (
                k("pipeline", &["--dry-run", "--stage", "echo 5 > five.txt"]),
                0,
            ),
            (
                k("pipeline", &["--prepare", "--stage", "echo 6 > six.txt"]),
                0,
            ),
            (
                k("gather", &["--json", "--source", "a=echo 7 > seven.txt"]),
                0,
            ),
            // The command inside gets SIGPIPE's default action: killed by it, 128+13.
            (
                v(&["run", "--", "sh", "-c", "echo out; echo after >&2"]),
                141,
            ),
            (t(&["--json", "commit", &txn_id]), 0),
            (b(&["commit", &branch_id, "--json"]), 0),
        ];
        for (args, code) in cases {
            let out = with_closed_stdout(user, &args);
            assert_exit(&out, code, &format!("{user:?} {args:?}"));
        }
        // The transaction and branch were committed although nobody read the output.
        assert!(d.work.join("two.txt").is_file() && d.work.join("three.txt").is_file());
    }
}

#[test]
fn journal_and_serve_with_a_closed_stdout_do_not_panic() {
    let dir = scratch();
    let journal = dir.path().join("j");
    std::fs::create_dir(&journal).unwrap();
    let url = format!("file:{}", journal.display());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        use lockbox_journal::{FileStorage, Journal, RunId, StartOptions};
        let storage = std::sync::Arc::new(FileStorage::open(&journal).unwrap());
        let run = Journal::open(storage)
            .start(&RunId::parse("r1").unwrap(), StartOptions::default())
            .await
            .unwrap();
        let _: u32 = run
            .record("llm", || async { Ok::<_, String>(1) })
            .await
            .unwrap();
        // A recorded value is the agent's: a C1 CSI (U+009B) and a right-to-left override
        // in it must not reach the terminal raw (serde_json escapes only C0).
        let _: String = run
            .record("tool", || async {
                Ok::<_, String>("a\u{9b}2Jb\u{202e}c".into())
            })
            .await
            .unwrap();
    });
    let dump = command_as(User::Current)
        .args(["journal", "--journal", &url, "dump", "r1"])
        .output()
        .unwrap();
    assert_exit(&dump, 0, "journal dump");
    let shown = String::from_utf8_lossy(&dump.stdout);
    assert!(
        !shown.contains('\u{9b}') && !shown.contains('\u{202e}'),
        "{shown}"
    );
    assert!(shown.contains(r"a\302\2332Jb\342\200\256c"), "{shown}");
    for args in [
        vec!["journal", "--journal", &url, "list"],
        vec!["journal", "--journal", &url, "status", "r1"],
        vec!["journal", "--journal", &url, "dump", "r1"],
    ] {
        let out = with_closed_stdout(User::Current, &args);
        assert_exit(&out, 0, &format!("{args:?}"));
    }

    // serve prints its address on stdout first: with nobody reading, it must still serve.
    let state = dir.path().join("serve-state");
    let mut child = command_as(User::Current)
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&state)
        .stdout(Stdio::from(closed_pipe()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let serving = loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() == 0 {
            break false;
        }
        seen.push_str(&line);
        if line.contains("serving http://") {
            break true;
        }
    };
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    seen.push_str(&rest);
    assert!(serving, "serve did not start: {status:?}\n{seen}");
    assert!(!seen.contains("panicked"), "{seen}");
    assert_eq!(status.code(), Some(0), "{seen}");
}

/// Arguments are bytes too: the not-found message quotes the program name.
#[test]
fn an_argument_that_is_not_utf8_is_quoted_in_messages() {
    let out = command_as(User::Current)
        .args(["run", "--"])
        .arg(OsString::from_vec(b"no-such-\xe9\x1b[2K".to_vec()))
        .current_dir("/")
        .output()
        .unwrap();
    assert_exit(&out, 127, "command not found");
    assert_unforged(&out.stderr, "not-found message");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(r#""no-such-\351\033[2K": command not found"#),
        "{}",
        text(&out)
    );
}
