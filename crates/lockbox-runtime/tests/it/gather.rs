//! Running sandboxes committed together (`Runtime::commit_together`): forks of one snapshot
//! gathered into one commit under a conflict policy, all or none.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_runtime::{
    ConflictPolicy, GatherOptions, OnExit, Runtime, RuntimeError, Sandbox, SandboxId, SandboxSpec,
};
use std::collections::BTreeMap;
use std::path::Path;

fn workdir_spec(dir: &Path) -> SandboxSpec {
    SandboxSpec {
        workdir: Some(dir.to_owned()),
        on_exit: OnExit::Abort,
        ..SandboxSpec::default()
    }
}

/// Every entry below `dir` (names not followed): path → file content, or `<dir>`.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                out.insert(rel, "<dir>".into());
                todo.push(e.path());
            } else {
                out.insert(rel, std::fs::read_to_string(e.path()).unwrap());
            }
        }
    }
    out
}

/// A workdir with `shared.txt`, a root sandbox that wrote `setup.txt`, its snapshot and
/// `n` forks of it.
async fn forks(state: &Path, w: &Path, n: usize) -> (Runtime, Vec<Sandbox>) {
    std::fs::write(w.join("shared.txt"), "base\n").unwrap();
    let (rt, root) = sandbox_with(state, workdir_spec(w)).await;
    run(&root, "echo from-root > setup.txt").await;
    let snap = root.snapshot(None).await.unwrap();
    let mut out = Vec::new();
    for info in rt.fork_snapshot(&snap.id, n).await.unwrap() {
        out.push(rt.sandbox(&info.id).unwrap());
    }
    (rt, out)
}

fn ids(boxes: &[&Sandbox]) -> Vec<SandboxId> {
    boxes
        .iter()
        .map(|b| SandboxId::from(b.id().to_owned()))
        .collect()
}

fn with(conflicts: ConflictPolicy) -> GatherOptions {
    GatherOptions {
        conflicts,
        ..GatherOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_forks_writing_disjoint_files_are_gathered_with_the_snapshots_changes_once() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "three_forks_writing_disjoint_files_are_gathered_with_the_snapshots_changes_once"
    ));
    let state = scratch();
    let work = scratch();
    let w = work.path();
    let (rt, f) = forks(state.path(), w, 3).await;
    run(&f[0], "echo A > a.txt").await;
    run(&f[1], "echo B > b.txt").await;
    run(&f[2], "mkdir -p sub && echo C > sub/c.txt").await;

    let done = rt
        .commit_together(&ids(&[&f[0], &f[1], &f[2]]), GatherOptions::default())
        .await
        .unwrap();
    assert!(done.committed && !done.dry_run);
    assert!(done.conflicts.is_empty(), "{:?}", done.conflicts);
    let expected: BTreeMap<String, String> = [
        ("a.txt", "A\n"),
        ("b.txt", "B\n"),
        ("setup.txt", "from-root\n"),
        ("shared.txt", "base\n"),
        ("sub", "<dir>"),
        ("sub/c.txt", "C\n"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(tree(w), expected);
    // Each contributed its own file only; the snapshot's change went in once.
    let own: Vec<Vec<String>> = done
        .contributions
        .iter()
        .map(|c| {
            c.changes
                .iter()
                .map(|c| c.path.display().to_string())
                .collect()
        })
        .collect();
    assert_eq!(
        own,
        [vec!["a.txt"], vec!["b.txt"], vec!["sub", "sub/c.txt"]]
    );
    let setup = done
        .changes
        .iter()
        .filter(|c| c.path == Path::new("setup.txt"))
        .count();
    assert_eq!(setup, 1);
    // The forks keep running; they agree with the workdir and see their siblings' files.
    for fork in &f {
        assert!(fork.changes().await.unwrap().is_empty());
        assert_eq!(
            out(&run(fork, "cat a.txt b.txt sub/c.txt").await),
            "A\nB\nC\n"
        );
    }
    // A fork's later commit of its own is not taken for a concurrent edit.
    run(&f[0], "echo A2 > a.txt").await;
    f[0].commit(lockbox_runtime::Selection::default())
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(w.join("a.txt")).unwrap(), "A2\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_writing_one_path_are_refused_under_fail_and_resolved_by_the_other_policies() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "forks_writing_one_path_are_refused_under_fail_and_resolved_by_the_other_policies"
    ));
    let state = scratch();
    let work = scratch();
    let w = work.path();
    let (rt, f) = forks(state.path(), w, 2).await;
    let (a, b) = (&f[0], &f[1]);
    run(a, "echo A > shared.txt; echo a > a.txt").await;
    run(b, "echo B > shared.txt; echo b > b.txt").await;
    let both = ids(&[a, b]);
    let before = tree(w);

    // fail: refused, naming the path and both forks; nothing changes anywhere.
    let e = rt
        .commit_together(&both, GatherOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code().as_str(), "CONFLICT", "{e}");
    let RuntimeError::MergeConflicts { conflicts } = &e else {
        panic!("{e:?}");
    };
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].path, Path::new("shared.txt"));
    assert_eq!(conflicts[0].sandboxes, both);
    assert_eq!(tree(w), before);
    assert_eq!(out(&run(a, "cat shared.txt a.txt").await), "A\na\n");
    assert_eq!(out(&run(b, "cat shared.txt b.txt").await), "B\nb\n");

    // A dry run lists the merged result and changes nothing.
    let dry = rt
        .commit_together(
            &both,
            GatherOptions {
                dry_run: true,
                ..with(ConflictPolicy::LastWriterWins)
            },
        )
        .await
        .unwrap();
    assert!(dry.dry_run && !dry.committed && dry.report.is_none());
    let listed: Vec<String> = dry
        .changes
        .iter()
        .map(|c| c.path.display().to_string())
        .collect();
    assert_eq!(listed, ["a.txt", "b.txt", "setup.txt", "shared.txt"]);
    assert_eq!(dry.conflicts[0].winner.as_ref(), Some(&both[1]));
    assert_eq!(tree(w), before);

    // last-writer-wins: the later-named fork's version goes in.
    let done = rt
        .commit_together(&both, with(ConflictPolicy::LastWriterWins))
        .await
        .unwrap();
    assert!(done.committed);
    assert_eq!(
        std::fs::read_to_string(w.join("shared.txt")).unwrap(),
        "B\n"
    );
    assert_eq!(std::fs::read_to_string(w.join("a.txt")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(w.join("b.txt")).unwrap(), "b\n");
    // The loser still sees its own version, listed as a change; its own commit of it is
    // stale (the winner's went in after it began) unless forced.
    let left: Vec<String> = a
        .changes()
        .await
        .unwrap()
        .iter()
        .map(|c| c.path.display().to_string())
        .collect();
    assert_eq!(left, ["shared.txt"]);
    assert!(b.changes().await.unwrap().is_empty());
    let stale = a
        .commit(lockbox_runtime::Selection::default())
        .await
        .unwrap_err();
    assert_eq!(stale.code().as_str(), "CONFLICT", "{stale}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_keep_the_first_forks_version_and_the_others_beside_it() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "markers_keep_the_first_forks_version_and_the_others_beside_it"
    ));
    let state = scratch();
    let work = scratch();
    let w = work.path();
    let (rt, f) = forks(state.path(), w, 2).await;
    run(&f[0], "echo A > shared.txt").await;
    run(&f[1], "echo B > shared.txt").await;
    let both = ids(&[&f[0], &f[1]]);
    let done = rt
        .commit_together(&both, with(ConflictPolicy::Markers))
        .await
        .unwrap();
    assert!(done.committed);
    assert_eq!(
        std::fs::read_to_string(w.join("shared.txt")).unwrap(),
        "A\n"
    );
    let kept = format!("shared.txt.lockbox-{}", both[1]);
    assert_eq!(std::fs::read_to_string(w.join(&kept)).unwrap(), "B\n");
    assert_eq!(done.markers.len(), 1);
    assert_eq!(done.markers[0].kept_as, Path::new(&kept));
    assert_eq!(done.conflicts[0].winner.as_ref(), Some(&both[0]));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workdir_changed_since_the_snapshot_is_refused_unless_forced() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_workdir_changed_since_the_snapshot_is_refused_unless_forced"
    ));
    let state = scratch();
    let work = scratch();
    let w = work.path();
    let (rt, f) = forks(state.path(), w, 2).await;
    run(&f[0], "echo A > shared.txt").await;
    run(&f[1], "echo B > b.txt").await;
    std::fs::write(w.join("shared.txt"), "host\n").unwrap();
    let before = tree(w);
    let both = ids(&[&f[0], &f[1]]);
    let e = rt
        .commit_together(&both, GatherOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.code().as_str(), "CONFLICT", "{e}");
    assert!(e.to_string().contains("shared.txt"), "{e}");
    assert_eq!(tree(w), before);
    let forced = GatherOptions {
        force: true,
        ..GatherOptions::default()
    };
    assert!(rt.commit_together(&both, forced).await.unwrap().committed);
    assert_eq!(
        std::fs::read_to_string(w.join("shared.txt")).unwrap(),
        "A\n"
    );
    assert_eq!(std::fs::read_to_string(w.join("b.txt")).unwrap(), "B\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committing_together_refuses_bad_lists_with_typed_errors_and_changes_nothing() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "committing_together_refuses_bad_lists_with_typed_errors_and_changes_nothing"
    ));
    let state = scratch();
    let work = scratch();
    let other = scratch();
    let w = work.path();
    let (rt, f) = forks(state.path(), w, 1).await;
    run(&f[0], "echo A > a.txt").await;
    let before = tree(w);
    let a = SandboxId::from(f[0].id().to_owned());
    let code = |r: Result<_, RuntimeError>| r.unwrap_err().code().as_str();
    let opts = GatherOptions::default();
    assert_eq!(code(rt.commit_together(&[], opts).await), "INVALID_REQUEST");
    assert_eq!(
        code(rt.commit_together(&[a.clone(), a.clone()], opts).await),
        "INVALID_REQUEST"
    );
    let unknown = SandboxId::from("sb-000000000000".to_owned());
    assert_eq!(
        code(rt.commit_together(&[a.clone(), unknown], opts).await),
        "SANDBOX_NOT_FOUND"
    );
    let elsewhere = rt.create_sandbox(workdir_spec(other.path())).await.unwrap();
    let e = rt
        .commit_together(&[a.clone(), elsewhere.id.clone()], opts)
        .await
        .unwrap_err();
    assert_eq!(e.code().as_str(), "INVALID_REQUEST");
    assert!(e.to_string().contains("one workdir"), "{e}");
    let bare = rt.create_sandbox(SandboxSpec::default()).await.unwrap();
    assert_eq!(
        code(
            rt.commit_together(&[a.clone(), bare.id.clone()], opts)
                .await
        ),
        "NO_WORKDIR"
    );
    assert_eq!(tree(w), before);
    assert_eq!(out(&run(&f[0], "cat a.txt").await), "A\n");
    rt.shutdown().await;
}
