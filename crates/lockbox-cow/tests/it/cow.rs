//! Real-kernel tests of branches, change sets and commit: each builds the upper layer by
//! running shell commands inside an actual overlayfs mount in a user namespace.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: panics are failures

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::{hash_tree, require_overlay, run_in_branch, sh, snapshot, tick, Scratch};
use lockbox_cow::{
    abort_id, list, Branch, BranchId, BranchState, Change, CommitOptions, CowError, FileDiff,
    FileType, SandboxInit, SkipReason,
};

fn kinds(branch: &Branch) -> Vec<(String, char, FileType)> {
    branch
        .change_set()
        .unwrap()
        .into_iter()
        .map(|c: Change| (c.path.display().to_string(), c.kind.letter(), c.file_type))
        .collect()
}

const FORCE: CommitOptions = CommitOptions {
    force: true,
    dry_run: false,
    defer_removal: false,
};

#[test]
fn branch_layout_meta_and_list() {
    let s = Scratch::new();
    std::fs::set_permissions(&s.wd, std::fs::Permissions::from_mode(0o751)).unwrap();
    let ctx = serde_json::json!({"policy": {"net": "deny"}, "command": ["make", "-j2"]});
    let b = Branch::create(&s.state, &s.wd, ctx.clone()).unwrap();
    let dir = s.state.join("branches").join(b.id().as_str());
    assert_eq!(b.dir(), dir);
    assert!(dir.join("upper").is_dir() && dir.join("work").is_dir());
    assert!(dir.join("meta.json").is_file());
    // The overlay root takes its mode from the upper root.
    let up = std::fs::metadata(b.upper_dir()).unwrap();
    assert_eq!(up.mode() & 0o7777, 0o751);
    let m = b.meta();
    assert_eq!(m.workdir, std::fs::canonicalize(&s.wd).unwrap());
    assert_eq!(m.context, ctx);
    assert_eq!(m.state, BranchState::Active);
    assert_eq!(m.owner_pid, std::process::id());
    let reopened = Branch::open(&s.state, b.id()).unwrap();
    assert_eq!(reopened.meta(), b.meta());
    let listed = list(&s.state).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(&listed[0].id, b.id());
    assert!(!listed[0].is_orphan(), "our own live branch is no orphan");
    let mut b = b;
    b.keep().unwrap();
    assert_eq!(
        Branch::open(&s.state, b.id()).unwrap().meta().state,
        BranchState::Kept
    );
    let missing = BranchId::parse("nope").unwrap();
    let e = Branch::open(&s.state, &missing).unwrap_err();
    assert_eq!((e.code().as_str(), e.exit_code()), ("BRANCH_NOT_FOUND", 2));
}

#[test]
fn abort_removes_branch_even_with_unwritable_entries() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo hi > f; mkdir d; echo x > d/g");
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "mkdir -p n/m && echo y > n/m/z && chmod 000 n/m && chmod 500 n && echo z > d/g && chmod 000 d/g && rm f"
    ));
    // The kernel leaves work/work at mode 000.
    let ww = b.work_dir().join("work");
    assert_eq!(std::fs::metadata(&ww).unwrap().mode() & 0o777, 0);
    let dir = b.dir().to_owned();
    b.abort().unwrap();
    assert!(!dir.exists());
    assert!(list(&s.state).unwrap().is_empty());
}

#[test]
fn damaged_branch_is_listed_and_can_be_aborted() {
    let s = Scratch::new();
    let b = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
    // Half-created branch: no meta.json.
    let half = s.state.join("branches").join("half");
    std::fs::create_dir_all(half.join("upper")).unwrap();
    // Corrupted meta.
    let meta = b.dir().join("meta.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("\"active\"", "\"kept\"")).unwrap();
    let listed = list(&s.state).unwrap();
    assert_eq!(listed.len(), 2);
    for l in &listed {
        assert!(l.meta.is_err(), "{:?}", l.meta);
        assert!(l.is_orphan());
    }
    let e = Branch::open(&s.state, b.id()).unwrap_err();
    assert_eq!(e.code(), "CORRUPT_BRANCH_META");
    abort_id(&s.state, b.id()).unwrap();
    abort_id(&s.state, &BranchId::parse("half").unwrap()).unwrap();
    assert!(list(&s.state).unwrap().is_empty());
}

/// Set by [`orphan_after_kill_9_is_listed_and_aborted`] for the child it re-executes.
const HELPER_ENV: &str = "LOCKBOX_COW_TEST_HELPER_STATE";

/// The child role of [`orphan_after_kill_9_is_listed_and_aborted`] ([`lockbox_testkit::child_role`]).
fn helper_create_branch_then_die() {
    let (Ok(state), Ok(wd)) = (
        std::env::var(HELPER_ENV),
        std::env::var("LOCKBOX_COW_TEST_HELPER_WD"),
    ) else {
        return; // only does something when re-executed by the test below
    };
    let _b = Branch::create(Path::new(&state), Path::new(&wd), serde_json::json!("x")).unwrap();
    let me = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-9", &me])
        .status();
    std::thread::sleep(std::time::Duration::from_secs(10));
}

#[test]
fn orphan_after_kill_9_is_listed_and_aborted() {
    if lockbox_testkit::child_role(HELPER_ENV).is_some() {
        return helper_create_branch_then_die();
    }
    let s = Scratch::new();
    let st = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            lockbox_testkit::test_name!("orphan_after_kill_9_is_listed_and_aborted").as_str(),
            "--nocapture",
        ])
        .env(HELPER_ENV, &s.state)
        .env("LOCKBOX_COW_TEST_HELPER_WD", &s.wd)
        .status()
        .unwrap();
    assert!(!st.success(), "helper should have been killed");
    let listed = list(&s.state).unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].meta.is_ok());
    assert!(listed[0].is_orphan(), "owner died, so it is an orphan");
    let b = Branch::open(&s.state, &listed[0].id).unwrap();
    b.abort().unwrap();
    assert!(list(&s.state).unwrap().is_empty());
}

/// Set by [`issue_32_a_branch_is_no_orphan_while_its_sandbox_runs`]: the pid of the
/// sandbox init its re-executed child records before exiting.
const HELPER_INIT_ENV: &str = "LOCKBOX_COW_TEST_HELPER_INIT";

/// The child role of [`issue_32_a_branch_is_no_orphan_while_its_sandbox_runs`] ([`lockbox_testkit::child_role`]).
fn helper_create_branch_on_a_sandbox_then_exit() {
    let (Ok(state), Ok(wd), Ok(init)) = (
        std::env::var(HELPER_ENV),
        std::env::var("LOCKBOX_COW_TEST_HELPER_WD"),
        std::env::var(HELPER_INIT_ENV),
    ) else {
        return; // only does something when re-executed by the test below
    };
    let mut b = Branch::create(Path::new(&state), Path::new(&wd), serde_json::json!("x")).unwrap();
    let init = SandboxInit::of(init.parse().unwrap()).unwrap();
    b.record_sandbox(init).unwrap();
}

/// The init (pid 1 of a new pid namespace) that `unshare` forked, once it runs.
fn init_of(unshare: &std::process::Child) -> u32 {
    let children = format!("/proc/{0}/task/{0}/children", unshare.id());
    loop {
        let text = std::fs::read_to_string(&children).unwrap();
        if let Some(pid) = text.split_whitespace().next() {
            return pid.parse().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Issue 32: the lockbox that made a branch dies (its process is gone) while its sandbox is
/// still being killed. Until the sandbox's init, and with it every process that could write
/// into the branch, is gone, the branch is not offered for commit as an orphan.
#[test]
fn issue_32_a_branch_is_no_orphan_while_its_sandbox_runs() {
    if lockbox_testkit::child_role(HELPER_ENV).is_some() {
        return helper_create_branch_on_a_sandbox_then_exit();
    }
    let s = Scratch::new();
    // A sandbox as the kernel sees it: the init of a pid namespace of its own.
    let mut sandbox = std::process::Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--kill-child",
        ])
        .args(["sleep", "1000"])
        .spawn()
        .unwrap();
    let init = init_of(&sandbox);
    let st = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            lockbox_testkit::test_name!("issue_32_a_branch_is_no_orphan_while_its_sandbox_runs")
                .as_str(),
            "--nocapture",
        ])
        .env(HELPER_ENV, &s.state)
        .env("LOCKBOX_COW_TEST_HELPER_WD", &s.wd)
        .env(HELPER_INIT_ENV, init.to_string())
        .status()
        .unwrap();
    assert!(st.success(), "{st}");
    let listed = list(&s.state).unwrap();
    assert_eq!(listed.len(), 1);
    let recorded = listed[0].meta.as_ref().unwrap().sandbox_init.unwrap();
    assert_eq!(recorded.pid, init);
    assert!(
        !listed[0].is_orphan(),
        "its owner is gone, but its sandbox still runs"
    );
    assert!(
        listed[0].status().contains("still being stopped"),
        "{}",
        listed[0].status()
    );

    // The sandbox ends: `unshare` exits once its child, the init, was reaped.
    let _ = std::process::Command::new("kill")
        .args(["-9", &init.to_string()])
        .status();
    sandbox.wait().unwrap();
    let listed = list(&s.state).unwrap();
    assert!(listed[0].is_orphan(), "owner and sandbox are gone");
    assert!(
        listed[0].status().starts_with("orphan"),
        "{}",
        listed[0].status()
    );
    abort_id(&s.state, &listed[0].id).unwrap();
}

#[test]
fn change_set_semantics() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(
        &s.wd,
        "echo a > mod; echo b > chm; echo c > touched; echo d > del; echo e > same; \
         mkdir -p gone/sub && echo f > gone/sub/x; \
         mkdir -p opq/keep opq/old && echo g > opq/keep/k && echo h > opq/old/o && echo i > opq/f; \
         echo j > f2d; mkdir d2f && echo k > d2f/x; ln -s mod link; echo m > mvsrc; \
         mkdir -p dirmode",
    );
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "echo more >> mod; chmod 600 chm; touch -d @1000000 touched; rm del; rm -r gone; \
         cat same > /dev/null; : >> same; \
         rm -rf opq; mkdir -p opq/keep; echo new > opq/keep/k; echo n > opq/added; \
         rm f2d; mkdir f2d; echo y > f2d/in; rm -r d2f; echo z > d2f; \
         ln -sf chm link; mv mvsrc mvdst; chmod 700 dirmode; mkfifo fifo; \
         mkdir -p new/deep && echo q > new/deep/file && ln -s ../../outside new/esc"
    ));
    let got = kinds(&b);
    use FileType::*;
    let want: Vec<(String, char, FileType)> = [
        ("chm", 'M', File),
        ("d2f", 'T', File),
        ("del", 'D', File),
        ("dirmode", 'M', Dir),
        ("f2d", 'T', Dir),
        ("f2d/in", 'A', File),
        ("fifo", 'A', Special),
        ("gone", 'D', Dir),
        ("link", 'M', Symlink),
        ("mod", 'M', File),
        ("mvdst", 'A', File),
        ("mvsrc", 'D', File),
        ("new", 'A', Dir),
        ("new/deep", 'A', Dir),
        ("new/deep/file", 'A', File),
        ("new/esc", 'A', Symlink),
        ("opq/added", 'A', File),
        ("opq/f", 'D', File),
        ("opq/keep/k", 'M', File),
        ("opq/old", 'D', Dir),
        ("touched", 'M', File),
    ]
    .into_iter()
    .map(|(p, k, t)| (p.to_string(), k, t))
    .collect();
    assert_eq!(got, want);
    // Streaming and collecting agree; order is Path order.
    let streamed: Vec<Change> = b.changes().unwrap().map(|c| c.unwrap()).collect();
    assert_eq!(streamed, b.change_set().unwrap().changes());
    let mut sorted: Vec<PathBuf> = streamed.iter().map(|c| c.path.clone()).collect();
    sorted.sort();
    assert_eq!(
        sorted,
        streamed.iter().map(|c| c.path.clone()).collect::<Vec<_>>()
    );
    let chm = streamed
        .iter()
        .find(|c| c.path == Path::new("chm"))
        .unwrap();
    assert_eq!((chm.mode, chm.size), (0o600, 2));
    assert!(b.change_set().unwrap().to_lines().contains("D del\n"));
}

#[test]
fn diff_text_and_binary() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(
        &s.wd,
        "printf 'one\\ntwo\\nthree\\n' > t; printf 'a\\0b' > bin; printf 'x\\0' > gone",
    );
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "printf 'one\\n2\\nthree\\n' > t; printf 'a\\0bc' > bin; echo new > n; \
         printf 'ne\\0w' > added; rm gone"
    ));
    let FileDiff::Text { unified } = b.diff(Path::new("t")).unwrap() else {
        panic!("text expected")
    };
    assert!(
        unified.contains("--- a/t") && unified.contains("+++ b/t"),
        "{unified}"
    );
    assert!(unified.contains("-two\n+2\n"), "{unified}");
    let d = b.diff(Path::new("bin")).unwrap();
    assert!(matches!(d, FileDiff::Summary { .. }), "{d:?}");
    assert_eq!(
        d.to_string(),
        "binary file, 3 bytes -> binary file, 4 bytes"
    );
    // A side that does not exist says so; a binary one gives its size.
    let added = b.diff(Path::new("added")).unwrap().to_string();
    assert_eq!(added, "absent -> binary file, 4 bytes");
    let gone = b.diff(Path::new("gone")).unwrap().to_string();
    assert_eq!(gone, "binary file, 2 bytes -> absent");
    let FileDiff::Text { unified } = b.diff(Path::new("n")).unwrap() else {
        panic!()
    };
    assert!(unified.contains("+new"), "{unified}");
    let e = b.diff(Path::new("../t")).unwrap_err();
    assert_eq!(e.code(), "BAD_PATH");
}

#[test]
fn commit_applies_and_preserves_modes_times_links() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(
        &s.wd,
        "echo a > f; mkdir d; echo b > d/x; ln -s f l; echo c > gone",
    );
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "echo A > f; chmod 640 f; touch -d @1234567890 f; rm gone; mkdir -p n/m; \
         echo z > n/m/z; chmod 555 n; ln -s /etc/passwd abs; rm l; ln -s d l; \
         printf 'x' > s; chmod 4755 s; echo h > hl1; ln hl1 hl2"
    ));
    let upper_snap = snapshot(&b.upper_dir());
    let report = b.commit(&CommitOptions::default()).unwrap();
    assert_eq!(report.deleted, 1);
    let snap = snapshot(&s.wd);
    use common::Node;
    assert_eq!(snap[Path::new("f")], Node::File(0o640, b"A\n".to_vec()));
    assert_eq!(
        std::fs::metadata(s.wd.join("f")).unwrap().mtime(),
        1234567890
    );
    assert!(!snap.contains_key(Path::new("gone")));
    assert_eq!(snap[Path::new("n")], Node::Dir(0o555));
    assert_eq!(snap[Path::new("n/m/z")], Node::File(0o644, b"z\n".to_vec()));
    assert_eq!(snap[Path::new("abs")], Node::Symlink("/etc/passwd".into()));
    assert_eq!(snap[Path::new("l")], Node::Symlink("d".into()));
    // setuid is dropped on commit.
    assert_eq!(snap[Path::new("s")], Node::File(0o755, b"x".to_vec()));
    // Hard links made in the sandbox stay one inode.
    let (h1, h2) = (
        std::fs::metadata(s.wd.join("hl1")).unwrap(),
        std::fs::metadata(s.wd.join("hl2")).unwrap(),
    );
    assert_eq!(h1.ino(), h2.ino());
    assert_eq!(snap[Path::new("hl2")], Node::File(0o644, b"h\n".to_vec()));
    assert!(upper_snap.contains_key(Path::new("hl2")));
    // Branch and staging are gone; owner is us.
    assert!(list(&s.state).unwrap().is_empty());
    let names: Vec<_> = std::fs::read_dir(&s.wd)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with(".lockbox")),
        "{names:?}"
    );
    assert_eq!(
        std::fs::metadata(s.wd.join("n/m/z")).unwrap().uid(),
        rustix::process::geteuid().as_raw()
    );
    std::fs::set_permissions(s.wd.join("n"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn abort_and_dry_run_leave_workdir_byte_identical() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo a > f; mkdir -p d/e; echo b > d/e/x; ln -s f l");
    let before = hash_tree(&s.wd);
    let b = s.branch();
    // The command fails half-way: what it wrote is still only in the branch.
    assert!(!run_in_branch(
        &b,
        "echo A > f; rm -r d; mkdir d; echo n > new; chmod 700 f; exit 3"
    ));
    let dry = CommitOptions {
        force: false,
        dry_run: true,
        defer_removal: false,
    };
    let mut b = b;
    let r = lockbox_cow::commit(&mut b, &s.wd, &dry).unwrap();
    assert!(r.dry_run);
    assert_eq!((r.added, r.modified, r.deleted), (1, 1, 1));
    assert_eq!(hash_tree(&s.wd), before, "dry run changed the workdir");
    let r2 = b.clone().commit(&dry).unwrap();
    assert_eq!(r, r2);
    assert_eq!(list(&s.state).unwrap().len(), 1, "dry run keeps the branch");
    b.abort().unwrap();
    assert_eq!(hash_tree(&s.wd), before, "abort changed the workdir");
    // A command killed by a signal half-way: same.
    let b = s.branch();
    assert!(!run_in_branch(
        &b,
        "echo A > f; rm -r d; echo n > new; kill -9 $$"
    ));
    assert!(!b.change_set().unwrap().is_empty());
    b.abort().unwrap();
    assert_eq!(
        hash_tree(&s.wd),
        before,
        "abort after SIGKILL changed the workdir"
    );
    assert!(list(&s.state).unwrap().is_empty());
}

#[test]
fn state_dir_inside_workdir_refused() {
    let s = Scratch::new();
    let e = Branch::create(&s.wd.join(".lockbox"), &s.wd, serde_json::Value::Null).unwrap_err();
    assert_eq!(e.code(), "STATE_WORKDIR_OVERLAP");
    std::fs::create_dir(s.state.join("branches")).unwrap();
    let e = Branch::create(&s.state, &s.state.join("branches"), serde_json::Value::Null);
    assert_eq!(e.unwrap_err().code(), "STATE_WORKDIR_OVERLAP");
}

#[test]
fn special_files_fifos_and_sockets_are_skipped_and_reported_the_rest_commits() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo a > f; echo b > g; echo c > was-a-file");
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "echo A > f; rm g; echo new > aaa; mkfifo zz-fifo; mkdir d; mkfifo d/pipe; \
         rm was-a-file; mkfifo was-a-file; \
         python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"zz-sock\")'"
    ));
    let report = b.clone().commit(&FORCE).unwrap();
    let skipped: Vec<(String, SkipReason)> = report
        .skipped
        .iter()
        .map(|k| (k.path.display().to_string(), k.reason))
        .collect();
    assert_eq!(
        skipped,
        [
            ("d/pipe".to_owned(), SkipReason::Fifo),
            ("was-a-file".to_owned(), SkipReason::Fifo),
            ("zz-fifo".to_owned(), SkipReason::Fifo),
            ("zz-sock".to_owned(), SkipReason::Socket),
        ]
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        json["skipped"][3],
        serde_json::json!({"path": "zz-sock", "reason": "socket"})
    );
    // Everything else is applied; at a skipped path the workdir keeps what it had.
    assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), "A\n");
    assert!(!s.wd.join("g").exists());
    assert_eq!(std::fs::read_to_string(s.wd.join("aaa")).unwrap(), "new\n");
    assert!(s.wd.join("d").is_dir() && !s.wd.join("d/pipe").exists());
    assert_eq!(
        std::fs::read_to_string(s.wd.join("was-a-file")).unwrap(),
        "c\n"
    );
    assert!(!s.wd.join("zz-fifo").exists() && !s.wd.join("zz-sock").exists());
    assert!(list(&s.state).unwrap().is_empty(), "branch left behind");
}

#[test]
fn special_files_devices_are_refused_and_nothing_applied() {
    // Only root can make a device node, so only root can plant one in an upper layer (the
    // sandbox has no CAP_MKNOD).
    if !require_overlay() || !rustix::process::geteuid().is_root() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo a > f");
    let before = hash_tree(&s.wd);
    let b = s.branch();
    assert!(run_in_branch(&b, "echo A > f"));
    sh(&b.upper_dir(), "mknod zz-null c 1 3");
    let e = b.clone().commit(&FORCE).unwrap_err();
    assert_eq!(e.code(), "SPECIAL_FILES");
    assert!(e.to_string().contains("zz-null"), "{e}");
    assert_eq!(hash_tree(&s.wd), before, "something was applied");
    assert_eq!(
        list(&s.state).unwrap().len(),
        1,
        "branch kept after refusal"
    );
}

#[test]
fn xattrs_and_hard_links_made_in_the_sandbox_survive_the_commit() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo old > existing; echo x > outside-link");
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "echo new > f && echo data > a && ln a b && mkdir d && ln a d/c && \
         ln outside-link alias && \
         python3 -c \"import os; os.setxattr('f', 'user.x', b'1'); \
         os.setxattr('existing', 'user.y', b'2'); os.setxattr('a', 'user.z', b'3')\""
    ));
    let xattrs = |p: &str| -> Vec<(String, Vec<u8>)> {
        let path = s.wd.join(p);
        let mut names = vec![0u8; 1024];
        let n = rustix::fs::listxattr(&path, &mut names[..]).unwrap();
        names[..n]
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| {
                let name = String::from_utf8(n.to_vec()).unwrap();
                let mut value = vec![0u8; 64];
                let len = rustix::fs::getxattr(&path, name.as_str(), &mut value[..]).unwrap();
                value.truncate(len);
                (name, value)
            })
            .collect()
    };
    b.commit(&FORCE).unwrap();
    // user.* xattrs, on a new file and as the only change of an existing one; overlayfs's
    // own user.overlay.* marks stay behind.
    assert_eq!(xattrs("f"), [("user.x".to_owned(), b"1".to_vec())]);
    assert_eq!(xattrs("existing"), [("user.y".to_owned(), b"2".to_vec())]);
    assert_eq!(
        std::fs::read_to_string(s.wd.join("existing")).unwrap(),
        "old\n"
    );
    // Three names of one inode made in the sandbox are one inode in the workdir.
    let ino = |p: &str| std::fs::metadata(s.wd.join(p)).unwrap().ino();
    assert_eq!(
        (ino("a"), ino("b"), ino("d/c")),
        (ino("a"), ino("a"), ino("a"))
    );
    assert_eq!(std::fs::metadata(s.wd.join("a")).unwrap().nlink(), 3);
    assert_eq!(std::fs::read_to_string(s.wd.join("d/c")).unwrap(), "data\n");
    assert_eq!(xattrs("b"), [("user.z".to_owned(), b"3".to_vec())]);
    // A link to a workdir file the change does not touch is committed as a copy.
    assert_ne!(ino("alias"), ino("outside-link"));
    assert_eq!(std::fs::read_to_string(s.wd.join("alias")).unwrap(), "x\n");
    assert_eq!(
        std::fs::metadata(s.wd.join("outside-link"))
            .unwrap()
            .nlink(),
        1
    );
}

#[test]
fn stale_base_refused_then_forced() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(
        &s.wd,
        "echo base > f; echo base > other; echo base > rm-me; mkdir d; echo 1 > d/x",
    );
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "echo branch > f; echo branch > rm-me; rm -r d"
    ));
    tick();
    // The host edits f, deletes rm-me and adds into d while the branch exists.
    sh(&s.wd, "echo host > f; rm rm-me; echo host > d/y");
    let e = b.clone().commit(&CommitOptions::default()).unwrap_err();
    assert_eq!((e.code().as_str(), e.exit_code()), ("STALE_BASE", 5));
    let CowError::StaleBase { paths } = &e else {
        panic!()
    };
    assert_eq!(
        paths,
        &vec![
            PathBuf::from("d"),
            PathBuf::from("f"),
            PathBuf::from("rm-me")
        ]
    );
    assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), "host\n");
    let r = b.commit(&FORCE).unwrap();
    assert_eq!(r.forced_stale.len(), 3);
    assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), "branch\n");
    assert_eq!(
        std::fs::read_to_string(s.wd.join("rm-me")).unwrap(),
        "branch\n"
    );
    assert!(!s.wd.join("d").exists());
}

#[test]
fn unrelated_host_edits_and_renames_are_not_stale() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo a > f; echo b > other; echo c > mv-me; mkdir d");
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "echo A > f; mv mv-me moved; echo n > d/new"
    ));
    tick();
    sh(&s.wd, "echo host > other; echo host > d/hostfile");
    b.commit(&CommitOptions::default()).unwrap();
    assert_eq!(std::fs::read_to_string(s.wd.join("moved")).unwrap(), "c\n");
    assert_eq!(
        std::fs::read_to_string(s.wd.join("other")).unwrap(),
        "host\n"
    );
    assert!(s.wd.join("d/hostfile").exists() && s.wd.join("d/new").exists());
    assert!(!s.wd.join("mv-me").exists());
}

/// The issue-15 lost update: the branch reads `counter`, a rival commits the value the
/// branch then writes (same bytes, and the same mtime: `touch -d`), so the branch's upper
/// equals the workdir *now*. It is still a write over a change made since the base.
#[test]
fn stale_base_when_writing_the_bytes_a_rival_committed_meanwhile() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo 0 > counter");
    let bump = "n=$(cat counter); echo $((n+1)) > counter; touch -d @1700000000 counter";
    let b = s.branch();
    assert!(run_in_branch(&b, &format!("{bump}; echo x > log_b")));
    tick();
    // The rival's commit: the same read, the same write.
    sh(&s.wd, bump);
    let e = b.clone().commit(&CommitOptions::default()).unwrap_err();
    assert_eq!((e.code().as_str(), e.exit_code()), ("STALE_BASE", 5), "{e}");
    let CowError::StaleBase { paths } = &e else {
        panic!("{e}")
    };
    assert_eq!(paths, &[PathBuf::from("counter")]);
    assert!(!s.wd.join("log_b").exists(), "nothing applied");
    // The change set lists what would change: not `counter`, equal now.
    assert_eq!(kinds(&b), [("log_b".into(), 'A', FileType::File)]);
    // Forced, the equal write is counted as forced and applies nothing to it.
    let r = b.commit(&FORCE).unwrap();
    assert_eq!((r.added, r.modified), (1, 0));
    assert_eq!(r.forced_stale, [PathBuf::from("counter")]);
    assert_eq!(
        std::fs::read_to_string(s.wd.join("counter")).unwrap(),
        "1\n"
    );
}

#[test]
fn stale_base_when_deleting_what_a_rival_deleted_meanwhile() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "mkdir jobs; echo job > jobs/j1; echo job > jobs/j2");
    // Both claim job j1 by removing it.
    let b = s.branch();
    assert!(run_in_branch(&b, "rm jobs/j1; echo j1 > claimed"));
    tick();
    sh(&s.wd, "rm jobs/j1");
    let e = b.clone().commit(&CommitOptions::default()).unwrap_err();
    let CowError::StaleBase { paths } = &e else {
        panic!("{e}")
    };
    assert_eq!(paths, &[PathBuf::from("jobs/j1")]);
    // A whiteout over nothing is no change to list or apply.
    assert_eq!(kinds(&b), [("claimed".into(), 'A', FileType::File)]);
    b.commit(&FORCE).unwrap();
    assert_eq!(
        std::fs::read_to_string(s.wd.join("jobs/j2")).unwrap(),
        "job\n"
    );
}

#[test]
fn stale_base_when_replacing_a_directory_a_rival_changed_meanwhile() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "mkdir d; echo 1 > d/x; echo 1 > d/y");
    // `rm -r d; mkdir d` leaves an opaque d with d's mode: not itself a change.
    let b = s.branch();
    assert!(run_in_branch(&b, "rm -r d; mkdir d; echo new > d/y"));
    tick();
    sh(&s.wd, "rm d/x");
    let e = b.clone().commit(&CommitOptions::default()).unwrap_err();
    let CowError::StaleBase { paths } = &e else {
        panic!("{e}")
    };
    assert_eq!(paths, &[PathBuf::from("d")]);
}

/// A copy-up that writes nothing (`touch -r f f`) changes nothing and is not stale by
/// itself; over a rival's change it is: the idiom that makes a read a dependency of an
/// optimistic commit (docs/transactions.md).
#[test]
fn stale_base_only_for_a_pure_copy_up_of_a_file_changed_meanwhile() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo 1 > config; echo 1 > other");
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "touch -r config config; cat config > out"
    ));
    assert!(b.upper_dir().join("config").exists(), "copied up");
    assert_eq!(kinds(&b), [("out".into(), 'A', FileType::File)]);
    tick();
    sh(&s.wd, "echo 2 > other");
    let r = b.commit(&CommitOptions::default()).unwrap();
    assert_eq!((r.added, r.modified, r.forced_stale.len()), (1, 0, 0));

    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "touch -r config config; cat config > out"
    ));
    tick();
    sh(&s.wd, "echo 2 > config");
    let e = b.commit(&CommitOptions::default()).unwrap_err();
    let CowError::StaleBase { paths } = &e else {
        panic!("{e}")
    };
    assert_eq!(paths, &[PathBuf::from("config")]);
}

/// A file written in the same clock tick as the branch's creation is older than its base
/// (`stamp_base`): no false stale base for an agent that writes and starts at once.
#[test]
fn stale_base_not_reported_for_a_file_written_just_before_the_branch() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    for round in 0..5 {
        common::at_tick_start();
        std::fs::write(s.wd.join("f"), format!("{round}\n")).unwrap();
        let b = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
        assert!(run_in_branch(&b, "echo more >> f"));
        b.commit(&CommitOptions::default())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
}

/// The base is taken without waiting for the file clock to tick (where timestamps are
/// multigrain, `stamp_base` needs one re-stamp): a host change made at once after the branch
/// began, in the same tick as its base, still counts as a change since the base.
#[test]
fn stale_base_detected_for_a_host_change_in_the_tick_the_branch_began() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    for round in 0..5 {
        std::fs::write(s.wd.join("f"), format!("{round}\n")).unwrap();
        common::at_tick_start();
        let b = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
        std::fs::write(s.wd.join("f"), "host\n").unwrap();
        assert!(run_in_branch(&b, "echo branch > f"));
        let e = b.clone().commit(&CommitOptions::default()).unwrap_err();
        assert_eq!(e.code().as_str(), "STALE_BASE", "round {round}: {e}");
        assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), "host\n");
        b.abort().unwrap();
    }
}

/// A new branch is not synced (issue 21): a power loss during its run can leave it whole (an
/// orphan: `orphan_after_kill_9_is_listed_and_aborted`), without its record, or with a
/// record whose data never reached the disk (an empty `meta.json`). Each is listed as
/// damaged, never opened (so never committed), and `abort_id` removes it.
#[test]
fn what_a_crash_leaves_of_an_unsynced_branch_is_listed_as_damaged_and_removable() {
    let s = Scratch::new();
    let no_record = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
    std::fs::remove_file(no_record.dir().join("meta.json")).unwrap();
    let empty_record = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
    std::fs::write(empty_record.dir().join("meta.json"), "").unwrap();
    let listed = list(&s.state).unwrap();
    assert_eq!(listed.len(), 2);
    for l in &listed {
        assert!(l.meta.is_err(), "{:?}", l.meta);
        assert!(l.is_orphan());
        assert!(
            l.status().contains("lockbox branch abort"),
            "{}",
            l.status()
        );
        assert!(Branch::open(&s.state, &l.id).is_err());
        abort_id(&s.state, &l.id).unwrap();
    }
    assert!(list(&s.state).unwrap().is_empty());
}

/// A branch becomes durable when it first holds something to keep: kept, it reopens as
/// kept; a branch aborted without ever being kept leaves nothing behind.
#[test]
fn a_kept_branch_reopens_kept_and_an_aborted_one_leaves_nothing() {
    let s = Scratch::new();
    let mut kept = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
    kept.keep().unwrap();
    let reopened = Branch::open(&s.state, kept.id()).unwrap();
    assert_eq!(reopened.meta().state, BranchState::Kept);
    let dropped = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
    let dir = dropped.dir().to_owned();
    dropped.abort().unwrap();
    assert!(!dir.exists());
    assert_eq!(list(&s.state).unwrap().len(), 1);
}

/// For a caller about to exit, discarding a branch that holds nothing, or committing a small
/// one, only sets it aside in `branches/.gone/` (never listed, never opened); the next
/// creation removes it on a thread of its own.
#[test]
fn a_branch_discarded_before_exit_is_set_aside_unlisted_and_removed_by_the_next_creation() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    let gone = s.state.join("branches/.gone");
    // Both made before either is discarded: a creation starts removing what is set aside.
    let empty = s.branch();
    let committed = s.branch();
    let ids = [empty.id().clone(), committed.id().clone()];
    empty.abort_before_exit().unwrap();
    assert!(run_in_branch(&committed, "echo x > f"));
    let before_exit = CommitOptions {
        defer_removal: true,
        ..CommitOptions::default()
    };
    committed.commit(&before_exit).unwrap();
    assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), "x\n");
    assert!(list(&s.state).unwrap().is_empty());
    for id in &ids {
        assert!(Branch::open(&s.state, id).is_err());
        assert!(gone.join(id.as_str()).is_dir(), "{id} set aside");
    }
    let next = s.branch();
    // Removed in the background: wait for it, as long as a slow disk needs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_dir(&gone).unwrap().next().is_some() {
        assert!(std::time::Instant::now() < deadline, "never swept");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(list(&s.state).unwrap().len(), 1);
    next.abort().unwrap();
}

/// A long-lived caller's abort and commit leave nothing in the state directory.
#[test]
fn abort_and_commit_leave_no_directory_behind() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    let empty = s.branch();
    let committed = s.branch();
    empty.abort().unwrap();
    assert!(run_in_branch(&committed, "echo x > f"));
    committed.commit(&CommitOptions::default()).unwrap();
    let left: Vec<_> = std::fs::read_dir(s.state.join("branches"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != ".new")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_refused_or_failed_commit_is_recorded_and_listed_with_its_remedy() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo 0 > f");
    let b = s.branch();
    assert!(run_in_branch(&b, "echo 1 > f"));
    tick();
    sh(&s.wd, "echo host > f");
    let id = b.id().clone();
    b.commit(&CommitOptions::default()).unwrap_err();
    let listed = list(&s.state).unwrap();
    let m = listed[0].meta.as_ref().unwrap();
    assert_eq!(m.state, BranchState::Stale);
    assert!(m.failure.as_deref().unwrap().contains('f'), "{m:?}");
    assert!(!listed[0].is_orphan());
    let status = listed[0].status();
    for want in [
        "the workdir changed".to_owned(),
        format!("lockbox branch diff {id}"),
        format!("lockbox branch commit --force {id}"),
        format!("lockbox branch abort {id}"),
    ] {
        assert!(status.contains(&want), "{status:?} lacks {want:?}");
    }
    // Reopened, it commits with force.
    Branch::open(&s.state, &id).unwrap().commit(&FORCE).unwrap();
    assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), "1\n");

    // A commit refused for another reason: commit_failed.
    let b = s.branch();
    assert!(run_in_branch(&b, "mkdir .lockbox-commit-x"));
    let id = b.id().clone();
    assert_eq!(b.commit(&FORCE).unwrap_err().code(), "RESERVED_NAME");
    let listed = list(&s.state).unwrap();
    assert_eq!(
        listed[0].meta.as_ref().unwrap().state,
        BranchState::CommitFailed
    );
    let status = listed[0].status();
    assert!(
        status.contains("commit failed") && status.contains(&format!("lockbox branch abort {id}")),
        "{status:?}"
    );
}

/// What a SIGKILL during `Branch::create` leaves (the branch built aside, not yet renamed)
/// is never listed, and the next creation removes it.
#[test]
fn a_creation_cut_short_is_never_listed_and_is_swept() {
    let s = Scratch::new();
    let aside = s
        .state
        .join("branches/.new")
        .join(format!("{}-b1", u32::MAX));
    std::fs::create_dir_all(aside.join("upper")).unwrap();
    std::fs::create_dir_all(aside.join("work")).unwrap();
    assert!(list(&s.state).unwrap().is_empty());
    let b = Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
    assert!(!aside.exists(), "swept");
    let left: Vec<_> = std::fs::read_dir(s.state.join("branches/.new"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(list(&s.state).unwrap().len(), 1);
    b.abort().unwrap();
}

/// Set by [`sigkill_during_creation_leaves_only_whole_branches`] for the child it runs.
const CREATE_LOOP_ENV: &str = "LOCKBOX_COW_TEST_CREATE_LOOP";

/// The child role of [`sigkill_during_creation_leaves_only_whole_branches`] ([`lockbox_testkit::child_role`]).
fn helper_create_branches_until_killed() {
    let Ok(spec) = std::env::var(CREATE_LOOP_ENV) else {
        return;
    };
    let (state, wd) = spec.split_once('\n').unwrap();
    loop {
        Branch::create(Path::new(state), Path::new(wd), serde_json::Value::Null).unwrap();
    }
}

/// SIGKILLs a process that does nothing but create branches, at many moments: every branch
/// listed afterwards is whole (a creation takes about one clock tick, most of it inside the
/// window where the old layout had a directory without `meta.json`).
#[test]
fn sigkill_during_creation_leaves_only_whole_branches() {
    if lockbox_testkit::child_role(CREATE_LOOP_ENV).is_some() {
        return helper_create_branches_until_killed();
    }
    let s = Scratch::new();
    for delay_ms in [3u64, 5, 7, 11, 13, 17, 19, 23, 29, 31] {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                lockbox_testkit::test_name!("sigkill_during_creation_leaves_only_whole_branches")
                    .as_str(),
            ])
            .env(
                CREATE_LOOP_ENV,
                format!("{}\n{}", s.state.display(), s.wd.display()),
            )
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let listed = list(&s.state).unwrap();
    let damaged: Vec<_> = listed
        .iter()
        .filter(|l| l.meta.is_err())
        .map(|l| l.id.as_str())
        .collect();
    assert!(
        damaged.is_empty(),
        "{} of {} half-made: {damaged:?}",
        damaged.len(),
        listed.len()
    );
    // The next creation sweeps what the killed creators left aside.
    Branch::create(&s.state, &s.wd, serde_json::Value::Null).unwrap();
    assert_eq!(
        std::fs::read_dir(s.state.join("branches/.new"))
            .unwrap()
            .count(),
        0
    );
}

fn outside_untouched(s: &Scratch) {
    let names: Vec<_> = std::fs::read_dir(&s.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("secret")]);
    assert_eq!(
        std::fs::read_to_string(s.outside.join("secret")).unwrap(),
        "outside\n"
    );
}

#[test]
fn escape_symlink_in_workdir_replaced_by_branch_dir() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    std::os::unix::fs::symlink(&s.outside, s.wd.join("link")).unwrap();
    let b = s.branch();
    // Inside the sandbox the link is replaced by a real directory with a file named like the
    // outside file.
    assert!(run_in_branch(
        &b,
        "rm link; mkdir link; echo pwned > link/secret"
    ));
    b.commit(&CommitOptions::default()).unwrap();
    outside_untouched(&s);
    assert_eq!(
        std::fs::read_to_string(s.wd.join("link/secret")).unwrap(),
        "pwned\n"
    );
    assert!(!std::fs::symlink_metadata(s.wd.join("link"))
        .unwrap()
        .is_symlink());
}

#[test]
fn escape_directory_swapped_for_symlink_between_runs() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "mkdir sub; echo a > sub/secret; echo f > file");
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "echo pwned > sub/secret; echo pwned > file"
    ));
    tick();
    // Between the run and the commit, the host turns sub into a symlink to outside, and
    // the file into a symlink to the outside file.
    std::fs::remove_dir_all(s.wd.join("sub")).unwrap();
    std::os::unix::fs::symlink(&s.outside, s.wd.join("sub")).unwrap();
    std::fs::remove_file(s.wd.join("file")).unwrap();
    std::os::unix::fs::symlink(s.outside.join("secret"), s.wd.join("file")).unwrap();
    let e = b.clone().commit(&CommitOptions::default()).unwrap_err();
    assert_eq!(e.code(), "STALE_BASE");
    outside_untouched(&s);
    b.commit(&FORCE).unwrap();
    outside_untouched(&s);
    assert!(s.wd.join("sub").is_dir() && !s.wd.join("sub").is_symlink());
    assert_eq!(
        std::fs::read_to_string(s.wd.join("sub/secret")).unwrap(),
        "pwned\n"
    );
    assert!(!s.wd.join("file").is_symlink());
}

#[test]
fn escape_symlinks_made_in_branch_are_committed_as_links() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "mkdir d");
    let out = s.outside.display().to_string();
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        &format!(
            "ln -s {out} esc; ln -s ../../outside d/up; ln -s .. dotdot; ln -s {out}/secret s"
        )
    ));
    b.commit(&CommitOptions::default()).unwrap();
    outside_untouched(&s);
    assert_eq!(std::fs::read_link(s.wd.join("esc")).unwrap(), s.outside);
    assert_eq!(
        std::fs::read_link(s.wd.join("d/up")).unwrap(),
        Path::new("../../outside")
    );
}

#[test]
fn escape_handcrafted_upper_cannot_write_through_workdir_symlink() {
    // An upper layer is just a directory: a hostile one may hold `link/x` where the workdir
    // has `link -> outside`, with no opaque mark (as a buggy or malicious writer could leave).
    let s = Scratch::new();
    std::os::unix::fs::symlink(&s.outside, s.wd.join("link")).unwrap();
    std::fs::create_dir(s.wd.join("real")).unwrap();
    std::os::unix::fs::symlink(&s.outside, s.wd.join("real/inner")).unwrap();
    let b = s.branch();
    let up = b.upper_dir();
    std::fs::create_dir_all(up.join("link")).unwrap();
    std::fs::write(up.join("link/secret"), "pwned").unwrap();
    std::fs::create_dir_all(up.join("real/inner")).unwrap();
    std::fs::write(up.join("real/inner/new"), "pwned").unwrap();
    std::fs::write(up.join("..."), "dots").unwrap();
    b.commit(&FORCE).unwrap();
    outside_untouched(&s);
    assert_eq!(
        std::fs::read_to_string(s.wd.join("link/secret")).unwrap(),
        "pwned"
    );
    assert_eq!(
        std::fs::read_to_string(s.wd.join("real/inner/new")).unwrap(),
        "pwned"
    );
    assert_eq!(std::fs::read_to_string(s.wd.join("...")).unwrap(), "dots");
}

#[test]
fn reserved_staging_name_refused() {
    let s = Scratch::new();
    let b = s.branch();
    std::fs::write(b.upper_dir().join(".lockbox-commit-x"), "x").unwrap();
    let e = b.commit(&FORCE).unwrap_err();
    assert_eq!(e.code(), "RESERVED_NAME");
    assert!(snapshot(&s.wd).is_empty());
}

#[test]
fn leftover_staging_and_partial_apply_are_finished_by_recommit() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo a > f; echo b > g");
    let b = s.branch();
    assert!(run_in_branch(&b, "echo A > f; echo B > g; echo n > new"));
    // What a crash in the middle of applying leaves: f already renamed into place, and a
    // staging directory with a staged file.
    std::fs::write(s.wd.join("f"), "A\n").unwrap();
    let staging = s.wd.join(format!(".lockbox-commit-{}", b.id()));
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join("1"), "junk").unwrap();
    let r = b.commit(&FORCE).unwrap();
    assert_eq!((r.added, r.modified), (1, 2));
    assert_eq!(std::fs::read_to_string(s.wd.join("f")).unwrap(), "A\n");
    assert_eq!(std::fs::read_to_string(s.wd.join("g")).unwrap(), "B\n");
    assert_eq!(std::fs::read_to_string(s.wd.join("new")).unwrap(), "n\n");
    assert!(!staging.exists());
}

#[test]
fn workdir_mismatch_refused() {
    let s = Scratch::new();
    let mut b = s.branch();
    let e = lockbox_cow::commit(&mut b, &s.outside, &CommitOptions::default()).unwrap_err();
    assert_eq!(e.code(), "WORKDIR_MISMATCH");
}

/// Re-runs the key scenarios above as uid/gid 65534 (when we are root), to prove nothing
/// needs privilege.
#[test]
fn key_scenarios_pass_as_uid_65534() {
    if std::env::var_os("LOCKBOX_COW_AS_NOBODY").is_some() {
        return; // we are the re-executed child
    }
    lockbox_testkit::require!(
        lockbox_testkit::is_root(),
        "running as uid 65534 needs root (this run is unprivileged already)"
    );
    if !require_overlay() {
        return;
    }
    // The test binary must be reachable by uid 65534.
    let st = lockbox_testkit::as_uid_65534("LOCKBOX_COW_AS_NOBODY")
        .args(["--test-threads", "2"])
        // Filters: this module's tests whose names start so.
        .args(
            [
                "abort_",
                "branch_layout",
                "change_set_semantics",
                "commit_applies",
                "damaged_branch",
                "diff_text",
                "escape_",
                "special_files",
                "stale_base",
                "a_refused_or_failed_commit",
                "unrelated_host",
                "orphan_after",
                "issue_32_a_branch_is_no_orphan",
                "leftover_staging",
                "xattr_whiteouts",
                "xattrs_and_hard_links",
                "paths_longer_than_path_max",
                "directories_made_unreadable",
                "sparse_files_stay_sparse",
                "import_keeps_holes",
                "a_failed_staging",
                "workdir_directories_the_committer",
                "branches_deeper_than",
            ]
            .map(|f| lockbox_testkit::test_name!(f)),
        )
        .status()
        .unwrap();
    assert!(st.success(), "scenarios failed as uid 65534: {st}");
}

#[test]
fn xattr_whiteouts_and_unsupported_features() {
    // Upper layers written by hand the way newer kernels write them.
    let s = Scratch::new();
    sh(&s.wd, "echo a > gone; mkdir d; echo b > d/x; echo c > meta");
    let b = s.branch();
    let up = b.upper_dir();
    // Linux >= 6.7 xattr whiteout: an empty file with overlay.whiteout.
    std::fs::write(up.join("gone"), "").unwrap();
    rustix::fs::lsetxattr(
        up.join("gone"),
        "user.overlay.whiteout",
        b"",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    std::fs::create_dir(up.join("d")).unwrap();
    rustix::fs::lsetxattr(
        up.join("d"),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    assert_eq!(
        kinds(&b),
        vec![
            ("d/x".to_string(), 'D', FileType::File),
            ("gone".to_string(), 'D', FileType::File)
        ]
    );
    // A metacopy upper keeps the data in the lower file: refused, nothing applied.
    std::fs::write(up.join("meta"), "").unwrap();
    rustix::fs::lsetxattr(
        up.join("meta"),
        "user.overlay.metacopy",
        b"",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let before = hash_tree(&s.wd);
    let e = b.commit(&FORCE).unwrap_err();
    assert_eq!(e.code(), "UNSUPPORTED_OVERLAY", "{e}");
    assert_eq!(hash_tree(&s.wd), before);
}

#[test]
fn trusted_overlay_xattrs_are_understood_when_root() {
    lockbox_testkit::require!(
        lockbox_testkit::is_root(),
        "setting trusted.* xattrs needs CAP_SYS_ADMIN"
    );
    let s = Scratch::new();
    sh(&s.wd, "mkdir d; echo b > d/x; echo y > d/y");
    let b = s.branch();
    let up = b.upper_dir();
    std::fs::create_dir(up.join("d")).unwrap();
    std::fs::write(up.join("d/y"), "new\n").unwrap();
    rustix::fs::lsetxattr(
        up.join("d"),
        "trusted.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    b.commit(&FORCE).unwrap();
    assert_eq!(
        snapshot(&s.wd).keys().cloned().collect::<Vec<_>>(),
        vec![PathBuf::from("d"), PathBuf::from("d/y")]
    );
}

/// Issue 15 (items 7 and 8): names are bytes. A name that is not UTF-8 and names holding
/// newlines or escape sequences travel through JSON exactly and print one quoted line each.
#[test]
fn hostile_names_round_trip_through_json_and_print_one_quoted_line_each() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo keep > important.txt");
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        r#"printf x > "$(printf 'caf\351.txt')"
           printf y > "$(printf 'a\nM forged.txt')"
           printf z > "$(printf 'x\033[1A\033[2K\rD')"
           ln -s "$(printf 'to\nthere')" link
           printf 'ok\n\033[2Kline\n' > t
           rm important.txt"#
    ));
    let set = b.change_set().unwrap();
    let lines = set.to_lines();
    assert_eq!(lines.lines().count(), set.len(), "{lines}");
    assert!(lines.contains("A \"caf\\351.txt\"\n"), "{lines}");
    assert!(lines.contains("A \"a\\nM forged.txt\"\n"), "{lines}");
    assert!(lines.contains("A \"x\\033[1A\\033[2K\\rD\"\n"), "{lines}");
    assert!(lines.contains("D important.txt\n"), "{lines}");
    assert!(
        !lines.contains('\u{1b}') && !lines.contains('\r'),
        "{lines}"
    );

    let json = serde_json::to_value(&set).unwrap();
    let latin1 = json
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"].is_object())
        .unwrap();
    assert_eq!(latin1["path"], serde_json::json!({"bytes": "Y2Fm6S50eHQ="}));
    let back: lockbox_cow::ChangeSet = serde_json::from_value(json).unwrap();
    assert_eq!(back, set);

    let FileDiff::Text { unified } = b
        .diff(Path::new(OsStr::from_bytes(b"caf\xe9.txt")))
        .unwrap()
    else {
        panic!("text expected")
    };
    assert!(unified.contains("--- \"a/caf\\351.txt\""), "{unified}");
    let shown = b.diff(Path::new("t")).unwrap().to_string();
    assert!(shown.contains("+\\033[2Kline"), "{shown}");
    let link = b.diff(Path::new("link")).unwrap().to_string();
    assert_eq!(link, "absent -> symlink to \"to\\nthere\"");

    b.commit(&CommitOptions::default()).unwrap();
    assert_eq!(
        std::fs::read(s.wd.join(OsStr::from_bytes(b"caf\xe9.txt"))).unwrap(),
        b"x"
    );
    assert!(s.wd.join(OsStr::from_bytes(b"a\nM forged.txt")).is_file());
}

/// A second workdir next to `s.wd` for the direct run: same setup, script run straight on it.
fn direct(
    s: &Scratch,
    setup: &str,
    script: &str,
) -> std::collections::BTreeMap<PathBuf, common::Node> {
    let dir = s.tmp.path().join("direct");
    std::fs::create_dir(&dir).unwrap();
    sh(&dir, setup);
    assert!(common::run_direct(&dir, script), "direct run failed");
    snapshot(&dir)
}

fn staging_left(wd: &Path) -> bool {
    std::fs::read_dir(wd).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .as_encoded_bytes()
            .starts_with(lockbox_cow::STAGING_PREFIX.as_bytes())
    })
}

/// Shell prelude: `$N` is one 200-byte name; `godeep L` enters `deep/` and L levels below
/// it with `cd -P` (a whole path that long is refused by the kernel: ENAMETOOLONG).
const DEEP: &str = "N=$(printf '%0200d' 0 | tr 0 x)\n\
    godeep() { cd -P deep || return 1; i=0; while [ $i -lt $1 ]; do cd -P $N || return 1; i=$((i+1)); done; }\n\
    P=deep; i=0; while [ $i -lt 21 ]; do P=$P/$N; i=$((i+1)); done\n";

#[test]
fn paths_longer_than_path_max_commit_fully() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    // 21 levels of 200 bytes: 4,221 bytes, longer than PATH_MAX (4,096).
    let setup = format!(
        "{DEEP}mkdir -p \"$P\" && (godeep 21 && echo old > f && echo gone > g) && \
         (godeep 10 && mkdir -p doomed/a/b && echo x > doomed/a/b/y) && echo keep > keep.txt"
    );
    let script = format!(
        "{DEEP}echo a > first.txt && (godeep 21 && echo new > f && rm g && mkdir -p n/$N && \
         echo added > n/$N/h) && (godeep 10 && rm -r doomed && chmod 700 $N) && \
         (godeep 20 && ln -s ../$N link) && echo z > zlast.txt"
    );
    sh(&s.wd, &setup);
    let expected = direct(&s, &setup, &script);
    let b = s.branch();
    assert!(run_in_branch(&b, &script));
    let set = b.change_set().unwrap();
    assert!(
        set.changes()
            .iter()
            .any(|c| c.path.as_os_str().len() > 4096),
        "no change deeper than PATH_MAX: {set:?}"
    );
    b.commit(&CommitOptions::default()).unwrap();
    assert_eq!(snapshot(&s.wd), expected);
    assert!(!staging_left(&s.wd));
    assert!(list(&s.state).unwrap().is_empty());
}

#[test]
fn directories_made_unreadable_commit_with_their_final_modes() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    let setup = "mkdir x && echo x > x/old && echo f > ro.txt";
    // What a command may do to what it owns: directories its owner may not list (300), not
    // enter (600), neither (000); a file it may not read.
    let script = "mkdir -p d/sub && echo f > d/f && echo g > d/sub/g && chmod 000 d/sub && \
                  chmod 000 d && mkdir e && echo h > e/h && chmod 300 e && \
                  mkdir m && echo k > m/k && chmod 600 m && \
                  echo new > x/new && rm x/old && chmod 100 x && chmod 000 ro.txt";
    sh(&s.wd, setup);
    let expected = direct(&s, setup, script);
    let b = s.branch();
    assert!(run_in_branch(&b, script));
    // Review works on it: change set, diff of a file below a mode-000 directory.
    let kinds = kinds(&b);
    assert!(
        kinds.contains(&("d/sub/g".into(), 'A', FileType::File)),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("x/old".into(), 'D', FileType::File)),
        "{kinds:?}"
    );
    let FileDiff::Text { unified } = b.diff(Path::new("d/sub/g")).unwrap() else {
        panic!("text expected")
    };
    assert!(unified.contains("+g"), "{unified}");
    // Reading gave the upper its modes back.
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&b.upper_dir().join("d")), 0o000);
    assert_eq!(mode(&b.upper_dir().join("e")), 0o300);
    b.commit(&CommitOptions::default()).unwrap();
    assert_eq!(snapshot(&s.wd), expected);
    assert_eq!(mode(&s.wd.join("d")), 0o000);
    assert!(!staging_left(&s.wd));
    assert!(list(&s.state).unwrap().is_empty());
}

#[test]
fn sparse_files_stay_sparse_when_committed() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "truncate -s 1M lower.img");
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "truncate -s 1G big.img && printf x | dd of=holey bs=1 seek=100000000 status=none && \
         head -c 8192 /dev/zero > zeros && printf y | dd of=lower.img bs=1 seek=5000 conv=notrunc status=none"
    ));
    b.commit(&CommitOptions::default()).unwrap();
    let blocks = |p: &str| std::fs::metadata(s.wd.join(p)).unwrap().blocks();
    let len = |p: &str| std::fs::metadata(s.wd.join(p)).unwrap().len();
    assert_eq!((len("big.img"), blocks("big.img")), (1 << 30, 0));
    assert_eq!(len("holey"), 100_000_001);
    // One 4 KiB block (8 sectors), not 95 MiB of zeros.
    assert!(blocks("holey") <= 8, "holey: {} blocks", blocks("holey"));
    assert!(
        blocks("lower.img") <= 8,
        "lower.img: {} blocks",
        blocks("lower.img")
    );
    // Zeros the command wrote are data: they stay allocated.
    assert_eq!(blocks("zeros"), 16);
}

/// A tmpfs like the `--max-disk` upper, if the host has one at /dev/shm.
fn tmpfs_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let is_tmpfs = rustix::fs::statfs(shm).is_ok_and(|f| f.f_type == 0x0102_1994);
    if is_tmpfs {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        eprintln!("no tmpfs at /dev/shm: importing from a directory of the temp dir");
        tempfile::tempdir().unwrap()
    }
}

#[test]
fn import_keeps_holes_long_paths_unreadable_directories_and_marks() {
    let s = Scratch::new();
    let src = tmpfs_dir();
    let setup = format!(
        "{DEEP}mkdir -p \"$P\" && (godeep 21 && echo deep > f) && \
         truncate -s 1G sparse.img && printf x | dd of=holey bs=1 seek=50000000 status=none && \
         mkdir -p locked/in && echo l > locked/in/f && chmod 000 locked/in && chmod 000 locked && \
         mkdir wx && echo w > wx/f && chmod 300 wx && echo r > unreadable && chmod 000 unreadable && \
         mkdir opaque && ln -s locked link"
    );
    sh(src.path(), &setup);
    let opaque = src.path().join("opaque");
    rustix::fs::setxattr(
        &opaque,
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let b = s.branch();
    let copied = lockbox_cow::import_upper(src.path(), &b.upper_dir()).unwrap();
    assert!(copied < 1 << 20, "copied {copied} bytes of data");
    assert_eq!(
        common::snapshot_with_extents(&b.upper_dir()),
        common::snapshot_with_extents(src.path())
    );
    let blocks = |p: &str| std::fs::metadata(b.upper_dir().join(p)).unwrap().blocks();
    assert_eq!(blocks("sparse.img"), 0);
    assert!(blocks("holey") <= 8, "holey: {} blocks", blocks("holey"));
    let mut value = [0u8; 4];
    let n = rustix::fs::getxattr(
        b.upper_dir().join("opaque"),
        "user.overlay.opaque",
        &mut value,
    )
    .unwrap();
    assert_eq!(&value[..n], b"y");
    // The source keeps its modes (access was only granted while reading).
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&src.path().join("locked")), 0o000);
    assert_eq!(mode(&src.path().join("unreadable")), 0o000);
    b.abort().unwrap();
    assert!(list(&s.state).unwrap().is_empty());
}

/// Set by [`a_failed_staging_applies_nothing_and_the_branch_commits_later`] for the commit it
/// runs under a file size limit.
const FSIZE_HELPER: &str = "LOCKBOX_COW_TEST_FSIZE_STATE";

/// The child role of [`a_failed_staging_applies_nothing_and_the_branch_commits_later`] ([`lockbox_testkit::child_role`]).
fn helper_commit_under_a_file_size_limit() {
    let Ok(spec) = std::env::var(FSIZE_HELPER) else {
        return; // only does something when re-executed by the test below
    };
    let (state, id) = spec.split_once('\n').unwrap();
    let b = Branch::open(Path::new(state), &BranchId::parse(id).unwrap()).unwrap();
    let e = b.commit(&CommitOptions::default()).unwrap_err();
    assert_eq!(e.code(), "COMMIT_STAGE", "{e}");
}

#[test]
fn a_failed_staging_applies_nothing_and_the_branch_commits_later() {
    if lockbox_testkit::child_role(FSIZE_HELPER).is_some() {
        return helper_commit_under_a_file_size_limit();
    }
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(&s.wd, "echo a > a.txt");
    let before = hash_tree(&s.wd);
    let b = s.branch();
    assert!(run_in_branch(
        &b,
        "echo A > a.txt && head -c 1000000 /dev/urandom > big && echo z > z.txt"
    ));
    // Staging `big` fails (EFBIG: 16 KiB at most per file; SIGXFSZ ignored), after
    // validation and after the branch was marked committing.
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 32; exec \"$0\" --exact \"$1\"")
        .arg(std::env::current_exe().unwrap())
        .arg(lockbox_testkit::test_name!(
            "a_failed_staging_applies_nothing_and_the_branch_commits_later"
        ))
        .env(FSIZE_HELPER, format!("{}\n{}", s.state.display(), b.id()))
        // Piped: the file-size limit would also hold for a log file the test's output goes to.
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "helper: {} {}{}",
        st.status,
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr)
    );
    // Every entry as it was (only the workdir's own mtime tells a staging directory came
    // and went).
    let entries = |mut t: std::collections::BTreeMap<PathBuf, _>| {
        t.remove(Path::new("."));
        t
    };
    assert_eq!(
        entries(hash_tree(&s.wd)),
        entries(before),
        "something was applied"
    );
    assert!(!staging_left(&s.wd), "staging directory left behind");
    // Not stuck in `committing`: recorded as failed (listed with its remedy), and
    // committable again.
    let again = Branch::open(&s.state, b.id()).unwrap();
    assert_eq!(
        again.meta().state,
        BranchState::CommitFailed,
        "branch stuck"
    );
    again.commit(&CommitOptions::default()).unwrap();
    assert_eq!(std::fs::read_to_string(s.wd.join("a.txt")).unwrap(), "A\n");
    assert_eq!(
        std::fs::metadata(s.wd.join("big")).unwrap().len(),
        1_000_000
    );
}

#[test]
fn workdir_directories_the_committer_cannot_change_refuse_the_commit_up_front() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    sh(
        &s.wd,
        "echo a > a.txt && mkdir ro && echo r > ro/r && chmod 555 ro",
    );
    let before = hash_tree(&s.wd);
    let b = s.branch();
    // Inside, the command is root of its namespace and may write into `ro`.
    assert!(run_in_branch(&b, "echo A > a.txt && echo n > ro/new"));
    let result = b.commit(&CommitOptions::default());
    if rustix::process::geteuid().is_root() {
        result.unwrap();
        assert_eq!(std::fs::read_to_string(s.wd.join("ro/new")).unwrap(), "n\n");
        return;
    }
    // `a.txt` sorts before `ro/new`: a commit that found out while applying would have
    // replaced it already.
    let e = result.unwrap_err();
    assert_eq!(
        (e.code().as_str(), e.exit_code()),
        ("WORKDIR_PERMISSION", 4),
        "{e}"
    );
    assert!(e.to_string().contains("ro"), "{e}");
    assert_eq!(hash_tree(&s.wd), before, "something was applied");
    assert!(!staging_left(&s.wd));
    let listed = list(&s.state).unwrap();
    assert_eq!(
        listed[0].meta.as_ref().unwrap().state,
        BranchState::CommitFailed
    );
    std::fs::set_permissions(s.wd.join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Set by [`branches_deeper_than_the_descriptor_limit_are_removed`] for the abort it runs
/// with few descriptors.
const NOFILE_HELPER: &str = "LOCKBOX_COW_TEST_NOFILE_STATE";

/// The child role of [`branches_deeper_than_the_descriptor_limit_are_removed`] ([`lockbox_testkit::child_role`]).
fn helper_abort_with_few_descriptors() {
    let Ok(spec) = std::env::var(NOFILE_HELPER) else {
        return; // only does something when re-executed by the test below
    };
    let (state, id) = spec.split_once('\n').unwrap();
    abort_id(Path::new(state), &BranchId::parse(id).unwrap()).unwrap();
}

#[test]
fn branches_deeper_than_the_descriptor_limit_are_removed() {
    if lockbox_testkit::child_role(NOFILE_HELPER).is_some() {
        return helper_abort_with_few_descriptors();
    }
    let s = Scratch::new();
    let b = s.branch();
    // 600 levels, some of them mode 000, under a limit of 128 descriptors.
    sh(
        &b.upper_dir(),
        "i=0; while [ $i -lt 600 ]; do mkdir d && cd d || exit 1; i=$((i+1)); done; echo x > f",
    );
    sh(
        &b.upper_dir(),
        "i=0; while [ $i -lt 300 ]; do cd d; i=$((i+1)); done; chmod 000 d; cd ..; chmod 000 d",
    );
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 128; exec \"$0\" --exact \"$1\"")
        .arg(std::env::current_exe().unwrap())
        .arg(lockbox_testkit::test_name!(
            "branches_deeper_than_the_descriptor_limit_are_removed"
        ))
        .env(NOFILE_HELPER, format!("{}\n{}", s.state.display(), b.id()))
        .status()
        .unwrap();
    assert!(st.success(), "helper: {st}");
    assert!(!b.dir().exists());
    assert!(list(&s.state).unwrap().is_empty());
}
