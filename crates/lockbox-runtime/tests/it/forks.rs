//! Forks of snapshots and restores, through the runtime: each fork sees exactly its
//! snapshot's files plus its own changes (checked against a model, three levels deep),
//! commits on its own under the stale-base rule, and a restore gives back the exact tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_runtime::{DiffTarget, OnExit, Runtime, Sandbox, SandboxSpec, Selection};
use std::collections::BTreeMap;
use std::path::Path;

/// The files of a tree: path → content.
type Model = BTreeMap<String, String>;

/// Every regular file the sandbox sees under its workdir, as `./path=content` lines.
async fn files_seen(sb: &Sandbox) -> Model {
    let r = run(
        sb,
        "find . -type f | LC_ALL=C sort | while IFS= read -r f; do printf '%s=%s\\n' \"$f\" \"$(cat \"$f\")\"; done",
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    out(&r)
        .lines()
        .map(|l| {
            let (p, c) = l.split_once('=').unwrap();
            (p.trim_start_matches("./").to_owned(), c.to_owned())
        })
        .collect()
}

/// One step of a level: writes a file, or removes a path (a file or a whole directory).
enum Op {
    Write(&'static str, &'static str),
    Remove(&'static str),
}

/// Runs `ops` in the sandbox and applies them to `model`.
async fn apply(sb: &Sandbox, model: &mut Model, ops: &[Op]) {
    let mut script = String::from("set -e; ");
    for op in ops {
        match op {
            Op::Write(p, c) => {
                script.push_str(&format!(
                    "mkdir -p \"$(dirname {p})\"; printf %s {c} > {p}; "
                ));
                model.insert((*p).to_owned(), (*c).to_owned());
            }
            Op::Remove(p) => {
                script.push_str(&format!("rm -r {p}; "));
                let dir = format!("{p}/");
                model.retain(|k, _| k != p && !k.starts_with(&dir));
            }
        }
    }
    let r = run(sb, &script).await;
    assert_eq!(r.exit_code, 0, "{script}: {r:?}");
}

fn workdir_spec(dir: &Path) -> SandboxSpec {
    SandboxSpec {
        workdir: Some(dir.to_owned()),
        on_exit: OnExit::Abort,
        ..SandboxSpec::default()
    }
}

async fn fork_one(rt: &Runtime, snapshot: &str) -> Sandbox {
    let forks = rt.fork_snapshot(snapshot, 1).await.unwrap();
    assert_eq!(forks.len(), 1);
    rt.sandbox(&forks[0].id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_three_levels_deep_each_see_their_snapshot_and_their_own_changes() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "forks_three_levels_deep_each_see_their_snapshot_and_their_own_changes"
    ));
    let state = scratch();
    let work = scratch();
    let w = work.path();
    std::fs::create_dir_all(w.join("src/deep")).unwrap();
    std::fs::write(w.join("README"), "readme").unwrap();
    std::fs::write(w.join("src/a.rs"), "a0").unwrap();
    std::fs::write(w.join("src/b.rs"), "b0").unwrap();
    std::fs::write(w.join("src/deep/c.rs"), "c0").unwrap();
    let workdir_before = Model::from([
        ("README".into(), "readme".into()),
        ("src/a.rs".into(), "a0".into()),
        ("src/b.rs".into(), "b0".into()),
        ("src/deep/c.rs".into(), "c0".into()),
    ]);
    let (rt, root) = sandbox_with(state.path(), workdir_spec(w)).await;
    let mut m0 = workdir_before.clone();
    assert_eq!(files_seen(&root).await, m0);

    // Level 1: the root sandbox writes, deletes a file and a directory.
    apply(
        &root,
        &mut m0,
        &[
            Op::Write("src/a.rs", "a1"),
            Op::Remove("src/b.rs"),
            Op::Remove("src/deep"),
            Op::Write("new/one.txt", "one"),
        ],
    )
    .await;
    let s1 = root.snapshot(Some("level1".into())).await.unwrap();
    // The root goes on; its later writes are not the snapshot's.
    run(&root, "echo later > later.txt").await;

    // Level 2: two forks of s1, each with its own changes.
    let f1 = fork_one(&rt, &s1.id).await;
    let f2 = fork_one(&rt, &s1.id).await;
    assert_eq!(files_seen(&f1).await, m0);
    let mut m1 = m0.clone();
    apply(
        &f1,
        &mut m1,
        &[
            Op::Write("src/deep/c.rs", "c-again"),
            Op::Remove("new"),
            Op::Write("f1.txt", "f1"),
        ],
    )
    .await;
    let mut m2 = m0.clone();
    apply(
        &f2,
        &mut m2,
        &[Op::Write("src/a.rs", "a-f2"), Op::Remove("README")],
    )
    .await;
    assert_eq!(files_seen(&f1).await, m1);
    assert_eq!(files_seen(&f2).await, m2);
    let s2 = f1.snapshot(Some("level2".into())).await.unwrap();
    assert_eq!(s2.parent.as_deref(), Some(s1.id.as_str()));

    // Level 3: a fork of the fork's snapshot.
    let f3 = fork_one(&rt, &s2.id).await;
    assert_eq!(files_seen(&f3).await, m1);
    let mut m3 = m1.clone();
    apply(
        &f3,
        &mut m3,
        &[
            Op::Remove("src"),
            Op::Write("src/z.rs", "z"),
            Op::Write("f1.txt", "f1-f3"),
        ],
    )
    .await;
    assert_eq!(files_seen(&f3).await, m3);
    let s3 = f3.snapshot(Some("level3".into())).await.unwrap();
    assert_eq!(s3.parent.as_deref(), Some(s2.id.as_str()));
    // A fork of level 3 sees it exactly, and the levels above did not move.
    let f4 = fork_one(&rt, &s3.id).await;
    assert_eq!(files_seen(&f4).await, m3);
    assert_eq!(files_seen(&f1).await, m1);
    assert_eq!(files_seen(&f2).await, m2);
    let mut m_root = m0.clone();
    m_root.insert("later.txt".into(), "later".into());
    assert_eq!(files_seen(&root).await, m_root);

    // The diffs between levels say what the model says.
    let diff = rt
        .diff_snapshot(&s1.id, DiffTarget::Snapshot(s3.id.to_string()))
        .await
        .unwrap();
    let kinds = |changes: &[lockbox_runtime::Change]| -> Vec<(String, char)> {
        changes
            .iter()
            .map(|c| (c.path.display().to_string(), c.kind.letter()))
            .collect()
    };
    // f1 removed `new` (listed once, not what was below it), f3 replaced `src`.
    assert_eq!(
        kinds(&diff),
        [
            ("f1.txt".into(), 'A'),
            ("new".into(), 'D'),
            ("src/a.rs".into(), 'D'),
            ("src/z.rs".into(), 'A'),
        ]
    );
    let to_f2 = rt
        .diff_snapshot(&s1.id, DiffTarget::Sandbox(f2.id().to_owned()))
        .await
        .unwrap();
    assert_eq!(
        kinds(&to_f2),
        [("README".into(), 'D'), ("src/a.rs".into(), 'M')]
    );

    // Nothing reached the workdir.
    let mut on_disk = Model::new();
    for p in workdir_before.keys() {
        on_disk.insert(p.clone(), std::fs::read_to_string(w.join(p)).unwrap());
    }
    assert_eq!(on_disk, workdir_before);
    assert!(!w.join("new").exists());

    // A snapshot is not deleted while a fork or a snapshot stacks on it.
    let e = rt.delete_snapshot(&s1.id).await.unwrap_err();
    assert_eq!(e.code().as_str(), "SNAPSHOT_IN_USE", "{e}");
    for sb in [&f4, &f3, &f2, &f1] {
        rt.delete_sandbox(sb.id()).await.unwrap();
    }
    for s in [&s3, &s2, &s1] {
        rt.delete_snapshot(&s.id).await.unwrap();
    }
    rt.delete_sandbox(root.id()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_commits_on_its_own_and_its_siblings_commit_of_the_same_path_conflicts() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_fork_commits_on_its_own_and_its_siblings_commit_of_the_same_path_conflicts"
    ));
    let state = scratch();
    let work = scratch();
    let w = work.path();
    std::fs::write(w.join("shared.txt"), "base\n").unwrap();
    let (rt, root) = sandbox_with(state.path(), workdir_spec(w)).await;
    run(&root, "echo from-root > setup.txt").await;
    let snap = root.snapshot(None).await.unwrap();
    let forks = rt.fork_snapshot(&snap.id, 2).await.unwrap();
    let a = rt.sandbox(&forks[0].id).unwrap();
    let b = rt.sandbox(&forks[1].id).unwrap();
    run(&a, "echo A > shared.txt").await;
    run(&b, "echo B > shared.txt; echo b-only > b.txt").await;

    let done = a.commit(Selection::default()).await.unwrap();
    assert_eq!(done.remaining, 0);
    assert_eq!(
        std::fs::read_to_string(w.join("shared.txt")).unwrap(),
        "A\n"
    );
    // The snapshot's own change comes with the fork's.
    assert_eq!(
        std::fs::read_to_string(w.join("setup.txt")).unwrap(),
        "from-root\n"
    );
    // The sibling's commit of the same path is refused, and changes nothing.
    let e = b.commit(Selection::default()).await.unwrap_err();
    assert_eq!(e.code().as_str(), "CONFLICT", "{e}");
    assert_eq!(
        std::fs::read_to_string(w.join("shared.txt")).unwrap(),
        "A\n"
    );
    assert!(!w.join("b.txt").exists());
    // Forced, it wins.
    let forced = Selection {
        force: true,
        ..Selection::default()
    };
    b.commit(forced).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(w.join("shared.txt")).unwrap(),
        "B\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.join("b.txt")).unwrap(),
        "b-only\n"
    );
    // The fork keeps running after its commit.
    assert_eq!(out(&run(&a, "cat shared.txt").await), "A\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_after_many_writes_gives_back_the_exact_tree() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "restore_after_many_writes_gives_back_the_exact_tree"
    ));
    let state = scratch();
    let work = scratch();
    let w = work.path();
    for i in 0..50 {
        std::fs::write(w.join(format!("f{i}")), format!("{i}\n")).unwrap();
    }
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(w)).await;
    let hash = "find . -mindepth 1 -printf '%p %y %m\\n' | LC_ALL=C sort | sha256sum; \
                find . -type f | LC_ALL=C sort | xargs cat | sha256sum";
    run(
        &sb,
        "mkdir -p d/e; for i in $(seq 1 30); do echo $i > d/e/n$i; done; rm f1 f2; chmod 600 f3; ln -s f4 link",
    )
    .await;
    let before = out(&run(&sb, hash).await);
    let in_work = |command: &str| lockbox_runtime::ExecRequest {
        session: Some("work".into()),
        ..req(command)
    };
    sb.create_session(lockbox_runtime::SessionOptions {
        id: Some("work".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    sb.exec(in_work("cd d/e; export X=1 'Y=two words'"))
        .await
        .unwrap();
    let snap = sb.snapshot(Some("good".into())).await.unwrap();
    sb.exec(in_work("cd /; export X=2; unset Y")).await.unwrap();
    run(
        &sb,
        "for i in $(seq 1 300); do echo junk > j$i; done; rm -r d; rm f10 f11; echo changed > f5; chmod 755 f6; mkdir -p x/y/z",
    )
    .await;
    assert_ne!(out(&run(&sb, hash).await), before);
    sb.restore(&snap.id).await.unwrap();
    assert_eq!(out(&run(&sb, hash).await), before);
    // The session starts again where the snapshot found it, with its variables.
    let r = sb.exec(in_work("pwd; echo \"$X/$Y\"")).await.unwrap();
    assert_eq!(
        out(&r),
        format!("{}/d/e\n1/two words\n", w.display()),
        "{r:?}"
    );
    // Restored twice in a row: the same tree again (the fresh layer is empty).
    run(&sb, "echo more > more.txt").await;
    sb.restore(&snap.id).await.unwrap();
    assert_eq!(out(&run(&sb, hash).await), before);
    // A snapshot of a restored sandbox lies on the one it was restored to.
    let again = sb.snapshot(None).await.unwrap();
    assert_eq!(again.parent.as_deref(), Some(snap.id.as_str()));
    // Abort keeps it on its snapshot.
    run(&sb, "echo x > x.txt").await;
    sb.abort().await.unwrap();
    assert_eq!(out(&run(&sb, hash).await), before);
    // The workdir never moved.
    assert!(w.join("f1").exists() && !w.join("d").exists());
    let e = sb.restore("s-nope").await.unwrap_err();
    assert_eq!(e.code().as_str(), "SNAPSHOT_NOT_FOUND", "{e}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forking_refuses_what_it_cannot_do_and_changes_nothing() {
    let state = scratch();
    let work = scratch();
    let other = scratch();
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    let snap = sb.snapshot(None).await.unwrap();
    for count in [0, 10_000] {
        let e = rt.fork_snapshot(&snap.id, count).await.unwrap_err();
        assert_eq!(e.code().as_str(), "INVALID_REQUEST", "{e}");
    }
    let e = rt.fork_snapshot("s-none", 1).await.unwrap_err();
    assert_eq!(e.code().as_str(), "SNAPSHOT_NOT_FOUND", "{e}");
    let e = rt.fork_snapshot("../x", 1).await.unwrap_err();
    assert_eq!(e.code().as_str(), "INVALID_SNAPSHOT_ID", "{e}");
    // A workdir other than the snapshot's.
    let e = rt
        .create_sandbox(SandboxSpec {
            from_snapshot: Some(snap.id.clone()),
            ..workdir_spec(other.path())
        })
        .await
        .unwrap_err();
    assert_eq!(e.code().as_str(), "INVALID_REQUEST", "{e}");
    assert!(e.to_string().contains("workdir"), "{e}");
    // Restoring to a snapshot of another workdir.
    let (_, sb2) = (
        (),
        rt.sandbox(
            &rt.create_sandbox(workdir_spec(other.path()))
                .await
                .unwrap()
                .id,
        )
        .unwrap(),
    );
    let e = sb2.restore(&snap.id).await.unwrap_err();
    assert_eq!(e.code().as_str(), "INVALID_REQUEST", "{e}");
    // The sandbox was left running as it was.
    assert_eq!(out(&run(&sb2, "echo ok").await), "ok\n");
    assert_eq!(rt.list_sandboxes().unwrap().len(), 2);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_beyond_the_disk_budget_are_refused_and_not_kept() {
    let state = scratch();
    let work = scratch();
    let mut config = lockbox_runtime::RuntimeConfig::new(state.path());
    config.agent_exe = Some(agent_exe().to_owned());
    config.max_snapshot_bytes = Some(100_000);
    let rt = Runtime::open(config).unwrap();
    let info = rt.create_sandbox(workdir_spec(work.path())).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    run(&sb, "head -c 60000 /dev/zero > a").await;
    sb.snapshot(None).await.unwrap();
    let e = sb.snapshot(None).await.unwrap_err();
    assert_eq!(e.code().as_str(), "LIMIT_REACHED", "{e}");
    assert!(e.to_string().contains("max_snapshot_bytes"), "{e}");
    assert_eq!(rt.list_snapshots().unwrap().len(), 1);
    rt.shutdown().await;
}

/// Issue 32: 200,000 empty directories gave `bytes: 0` snapshots that cost 786 MB and
/// 200,000 inodes each. Every entry now costs its blocks (a directory at least one) plus an
/// inode, entries are bounded too, and the copy stops at the bound: nothing is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_32_snapshots_count_directories_and_inodes_and_stop_at_the_bound() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "issue_32_snapshots_count_directories_and_inodes_and_stop_at_the_bound"
    ));
    let state = scratch();
    let work = scratch();
    let mut config = lockbox_runtime::RuntimeConfig::new(state.path());
    config.agent_exe = Some(agent_exe().to_owned());
    // An empty directory costs at least 4096 + 512 bytes, an empty file 512: 20,000
    // directories cross the bytes' bound first, 20,000 files the entries'.
    config.max_snapshot_bytes = Some(10 << 20);
    config.max_snapshot_entries = Some(5_000);
    let rt = Runtime::open(config).unwrap();
    let info = rt.create_sandbox(workdir_spec(work.path())).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    // In /tmp (a tmpfs: its directories report no blocks at all), kept by the snapshot.
    let r = run(
        &sb,
        "mkdir /tmp/d && (cd /tmp/d && seq 20000 | xargs mkdir)",
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let e = sb
        .snapshot_with(lockbox_runtime::SnapshotOptions {
            name: None,
            include_tmp: true,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code().as_str(), "LIMIT_REACHED", "{e}");
    assert!(e.to_string().contains("max_snapshot_bytes"), "{e}");
    // In the workdir: 20,000 empty files (counted as nothing before).
    let r = run(&sb, "rm -r /tmp/d && seq 20000 | xargs touch").await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let e = sb.snapshot(None).await.unwrap_err();
    assert_eq!(e.code().as_str(), "LIMIT_REACHED", "{e}");
    assert!(e.to_string().contains("max_snapshot_entries"), "{e}");
    // Nothing half-made was kept, and a snapshot within the bounds is still taken.
    assert!(rt.list_snapshots().unwrap().is_empty());
    let store = state.path().join("snapshots");
    let leftovers = |dir: &Path| std::fs::read_dir(dir).unwrap().count();
    assert_eq!(leftovers(&store.join(".new")), 0);
    let r = run(&sb, "seq 20000 | xargs rm && mkdir a b && echo x > a/f").await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let snap = sb.snapshot(None).await.unwrap();
    // Two directories and a file: three inodes, two directory blocks, one data block.
    assert_eq!(snap.entries, 3, "{snap:?}");
    assert!(snap.bytes >= 2 * 4096 + 3 * 512, "{snap:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmp_kept_when_asked_comes_back_in_forks_and_restores_and_follows_no_link() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "tmp_kept_when_asked_comes_back_in_forks_and_restores_and_follows_no_link"
    ));
    let state = scratch();
    let work = scratch();
    let (rt, sb) = sandbox_with(state.path(), workdir_spec(work.path())).await;
    let r = run(
        &sb,
        "mkdir -p /tmp/cache/sub && echo one > /tmp/cache/sub/a && chmod 640 /tmp/cache/sub/a \
         && ln -s /etc/hostname /tmp/link && echo in-workdir > w.txt",
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let with_tmp = sb
        .snapshot_with(lockbox_runtime::SnapshotOptions {
            name: Some("with tmp".into()),
            include_tmp: true,
        })
        .await
        .unwrap();
    let without = sb.snapshot(None).await.unwrap();
    // Kept as it was: the link as a link, never what it points to on the host.
    let kept = state
        .path()
        .join("snapshots")
        .join(with_tmp.id.as_str())
        .join("scratch/tmp");
    assert_eq!(
        std::fs::read_link(kept.join("link")).unwrap(),
        Path::new("/etc/hostname")
    );
    // Only /tmp's own files: not what is mounted under it (the workdir, when it lies in
    // the host's /tmp, is mounted at its own path there; the directories above it are
    // /tmp's own).
    let mut all = Vec::new();
    let mut dirs = vec![kept.clone()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
            }
            all.push(e.path().strip_prefix(&kept).unwrap().to_owned());
        }
    }
    let workdir_name = work.path().file_name().unwrap();
    assert!(
        all.iter()
            .all(|p| p.file_name() != Some(workdir_name) && !p.ends_with("w.txt")),
        "{all:?}"
    );
    assert!(
        all.contains(&Path::new("cache/sub/a").to_owned()),
        "{all:?}"
    );
    let seen = "cat /tmp/cache/sub/a; stat -c %a /tmp/cache/sub/a; readlink /tmp/link; cat w.txt";
    let fork = fork_one(&rt, with_tmp.id.as_str()).await;
    assert_eq!(
        out(&run(&fork, seen).await),
        "one\n640\n/etc/hostname\nin-workdir\n"
    );
    // Not asked: a fork's /tmp is its own, without what the sandbox had put there.
    let plain = fork_one(&rt, without.id.as_str()).await;
    let absent =
        "test -e /tmp/cache || echo no-cache; test -e /tmp/link || echo no-link; cat w.txt";
    assert_eq!(
        out(&run(&plain, absent).await),
        "no-cache\nno-link\nin-workdir\n"
    );
    // A restore puts it back, and only it.
    run(&sb, "rm -rf /tmp/cache /tmp/link; echo junk > /tmp/junk").await;
    sb.restore(with_tmp.id.as_str()).await.unwrap();
    assert_eq!(
        out(&run(&sb, &format!("{seen}; test -e /tmp/junk || echo no-junk")).await),
        "one\n640\n/etc/hostname\nin-workdir\nno-junk\n"
    );
    rt.shutdown().await;
}

/// A snapshot moved to another state directory (a fleet's other node: docs/fleet.md) as its
/// artifact: its parent first, then it; forks there see exactly what forks of it see here,
/// the kept `/tmp` included, and the recorded session starts in its cwd. A tampered
/// artifact is refused with `BAD_ARTIFACT` and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_moved_to_another_state_directory_forks_there_to_the_same_files() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_snapshot_moved_to_another_state_directory_forks_there_to_the_same_files"
    ));
    let (state_a, state_b, work) = (scratch(), scratch(), scratch());
    let w = work.path();
    std::fs::create_dir_all(w.join("src/deep")).unwrap();
    std::fs::write(w.join("README"), "readme").unwrap();
    std::fs::write(w.join("src/a.rs"), "a0").unwrap();
    std::fs::write(w.join("src/deep/c.rs"), "c0").unwrap();
    let (rt_a, root) = sandbox_with(state_a.path(), workdir_spec(w)).await;
    let mut m1 = files_seen(&root).await;
    apply(
        &root,
        &mut m1,
        &[
            Op::Write("src/a.rs", "a1"),
            Op::Remove("src/deep"),
            Op::Write("new/one.txt", "one"),
        ],
    )
    .await;
    run(&root, "echo kept > /tmp/kept").await;
    let in_src = |command: &str| lockbox_runtime::ExecRequest {
        session: Some("work".into()),
        ..req(command)
    };
    root.create_session(lockbox_runtime::SessionOptions {
        id: Some("work".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = root
        .exec(in_src("cd src && export WHERE=there"))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let s1 = root
        .snapshot_with(lockbox_runtime::SnapshotOptions {
            name: Some("level1".into()),
            include_tmp: true,
        })
        .await
        .unwrap();
    let f1 = fork_one(&rt_a, &s1.id).await;
    let mut m2 = m1.clone();
    apply(
        &f1,
        &mut m2,
        &[Op::Remove("README"), Op::Write("f1.txt", "f1")],
    )
    .await;
    let s2 = f1.snapshot(Some("level2".into())).await.unwrap();
    assert_eq!(s2.parent.as_ref(), Some(&s1.id));

    let rt_b = runtime(state_b.path()).await;
    let moved = |id: &str| {
        let rt_a = rt_a.clone();
        let id = id.to_owned();
        async move {
            let export = rt_a.export_snapshot(&id).await.unwrap();
            let artifact = export.write_to(Vec::new()).unwrap();
            (export.digest().to_owned(), artifact)
        }
    };
    let (d2, a2) = moved(&s2.id).await;
    // Its parent is not there yet: refused before its layer is read.
    let e = rt_b.import_snapshot(&s2.id, &d2, &a2[..]).unwrap_err();
    assert_eq!(e.code(), lockbox_policy::ErrorCode::InvalidRequest, "{e}");
    assert!(e.to_string().contains(s1.id.as_str()), "{e}");
    let (d1, a1) = moved(&s1.id).await;
    let mut tampered = a1.clone();
    let at = tampered.windows(3).position(|w| w == b"one").unwrap();
    tampered[at] = b'0';
    let e = rt_b
        .import_snapshot(&s1.id, &d1, &tampered[..])
        .unwrap_err();
    assert_eq!(e.code(), lockbox_policy::ErrorCode::BadArtifact, "{e}");
    assert!(rt_b.list_snapshots().unwrap().is_empty());
    let unfinished = std::fs::read_dir(state_b.path().join("snapshots/.new"))
        .unwrap()
        .count();
    assert_eq!(unfinished, 0);

    let got = rt_b.import_snapshot(&s1.id, &d1, &a1[..]).unwrap();
    assert!(got.received && got.info.id == s1.id && got.info.name.as_deref() == Some("level1"));
    let got = rt_b.import_snapshot(&s2.id, &d2, &a2[..]).unwrap();
    assert!(got.received && got.info.parent.as_ref() == Some(&s1.id));
    assert!(!rt_b.import_snapshot(&s2.id, &d2, &a2[..]).unwrap().received);

    // Forks on B see what forks on A see.
    let on_b1 = fork_one(&rt_b, &s1.id).await;
    assert_eq!(files_seen(&on_b1).await, m1);
    let r = on_b1
        .exec(in_src("cat /tmp/kept; pwd; echo $WHERE"))
        .await
        .unwrap();
    assert_eq!(out(&r), format!("kept\n{}/src\nthere\n", w.display()));
    let on_b2 = fork_one(&rt_b, &s2.id).await;
    assert_eq!(files_seen(&on_b2).await, m2);
    assert_eq!(files_seen(&fork_one(&rt_a, &s2.id).await).await, m2);
    rt_a.shutdown().await;
    rt_b.shutdown().await;
}
