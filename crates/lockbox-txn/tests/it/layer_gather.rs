//! `LayerGather`: layers that exist already (running sandboxes' branches, here plain
//! directories standing in for their uppers) merged over their shared layers and committed
//! as one transaction; and a commit of one killed at random moments recovers to exactly the
//! pre- or the post-state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{dirs, staging_leftovers, tree_hash};
use lockbox_cow::Timestamp;
use lockbox_txn::{
    recover, ConflictPolicy, LayerGather, LayerSource, PreparedTxn, TxnError, TxnId,
};

const CHILD_ENV: &str = "LOCKBOX_TXN_LAYER_GATHER_CHILD";

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn layer(state: &Path, name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = state.join("layers-of-test").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for (rel, text) in files {
        write(&dir, rel, text);
    }
    dir
}

/// A source whose base is the epoch's end (nothing is stale for it).
fn source(name: &str, layers: Vec<PathBuf>) -> LayerSource {
    LayerSource {
        name: name.into(),
        layers,
        base: Timestamp {
            secs: i64::MAX / 2,
            nanos: 0,
        },
        rebased: Vec::new(),
    }
}

fn as_refs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect()
}

fn read(work: &Path, rel: &str) -> String {
    std::fs::read_to_string(work.join(rel)).unwrap()
}

#[test]
fn the_shared_layers_changes_go_in_once_and_a_path_one_source_changed_over_them_is_its_own() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let (_tmp, state, work) = dirs();
    write(&work, "kept.txt", "workdir\n");
    let shared = layer(
        &state,
        "shared",
        &[("setup.txt", "snap\n"), ("tuned.txt", "snap\n")],
    );
    let a = layer(&state, "a", &[("a.txt", "a\n")]);
    let b = layer(&state, "b", &[("b.txt", "b\n"), ("tuned.txt", "b\n")]);
    let prepared = LayerGather::new(&state, &work)
        .shared(vec![shared])
        .source(source("a", vec![a]))
        .source(source("b", vec![b]))
        .conflict_policy(ConflictPolicy::FirstWriterWins)
        .prepare()
        .unwrap();
    let own: Vec<Vec<String>> = prepared
        .contributions
        .iter()
        .map(|c| c.iter().map(|c| c.path.display().to_string()).collect())
        .collect();
    assert_eq!(own, [vec!["a.txt"], vec!["b.txt", "tuned.txt"]]);
    let outcome = prepared.commit(false).unwrap();
    assert!(outcome.committed && outcome.conflicts.is_empty());
    // `a` did not touch tuned.txt: `b`'s version goes in although `a` comes first.
    assert_eq!(read(&work, "tuned.txt"), "b\n");
    assert_eq!(read(&work, "setup.txt"), "snap\n");
    assert_eq!(read(&work, "a.txt"), "a\n");
    assert_eq!(read(&work, "b.txt"), "b\n");
    assert_eq!(read(&work, "kept.txt"), "workdir\n");
}

#[test]
fn a_conflict_under_fail_commits_nothing_and_a_stale_base_is_refused() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let (_tmp, state, work) = dirs();
    write(&work, "x.txt", "workdir\n");
    let a = layer(&state, "a", &[("x.txt", "a\n")]);
    let b = layer(&state, "b", &[("x.txt", "b\n")]);
    let pre = tree_hash(&work);
    let prepared = LayerGather::new(&state, &work)
        .source(source("a", vec![a.clone()]))
        .source(source("b", vec![b]))
        .prepare()
        .unwrap();
    let outcome = prepared.commit(false).unwrap();
    assert!(!outcome.committed);
    assert_eq!(outcome.conflicts.len(), 1);
    assert_eq!(outcome.conflicts[0].stages, ["a", "b"]);
    assert_eq!(tree_hash(&work), pre);
    // A source that began before the workdir's x.txt was written: stale, unless forced.
    let old = LayerSource {
        base: Timestamp { secs: 1, nanos: 0 },
        ..source("a", vec![a])
    };
    let stale = LayerGather::new(&state, &work)
        .source(old.clone())
        .prepare()
        .unwrap()
        .commit(false)
        .unwrap_err();
    assert!(matches!(stale, TxnError::Cow(_)), "{stale}");
    assert_eq!(stale.exit_code(), 5, "{stale}");
    assert_eq!(tree_hash(&work), pre);
    let forced = LayerGather::new(&state, &work)
        .source(old)
        .prepare()
        .unwrap()
        .commit(true)
        .unwrap();
    assert!(forced.committed);
    assert_eq!(read(&work, "x.txt"), "a\n");
    assert!(staging_leftovers(&work).is_empty());
}

/// The child side of the crash test ([`lockbox_testkit::child_role`]): commits the kept
/// transaction named by `spec` (`STATE\nID`).
fn commit_as_child(spec: &str) {
    let (state, id) = spec.split_once('\n').unwrap();
    let prepared = PreparedTxn::open(Path::new(state), &TxnId::parse(id).unwrap()).unwrap();
    assert!(prepared.commit_forced().unwrap().committed);
}

#[test]
fn a_gather_of_layers_killed_mid_commit_recovers_to_exactly_pre_or_post() {
    if let Some(spec) = lockbox_testkit::child_role(CHILD_ENV) {
        return commit_as_child(&spec);
    }
    let me = lockbox_testkit::test_name!(
        "a_gather_of_layers_killed_mid_commit_recovers_to_exactly_pre_or_post"
    );
    let shm = Path::new("/dev/shm");
    let (tmp, state, work) = if shm.is_dir() {
        common::dirs_in(shm)
    } else {
        dirs()
    };
    for f in 0..200 {
        write(&work, &format!("old/f{f}"), &format!("old {f}\n"));
    }
    let files = |tag: &str, n: usize| -> Vec<(String, String)> {
        (0..n)
            .map(|f| (format!("{tag}/d{}/f{f}", f % 10), format!("{tag} {f}\n")))
            .collect()
    };
    let shared_files = files("snap", 300);
    let mut a_files = files("a", 400);
    a_files.extend((0..100).map(|f| (format!("old/f{f}"), format!("a {f}\n"))));
    let b_files = files("b", 400);
    let shared = layer(&state, "shared", &as_refs(&shared_files));
    let a = layer(&state, "a", &as_refs(&a_files));
    let b = layer(&state, "b", &as_refs(&b_files));
    let prepared = LayerGather::new(&state, &work)
        .shared(vec![shared])
        .source(source("a", vec![a]))
        .source(source("b", vec![b]))
        .prepare()
        .unwrap();
    let id = prepared.txn.keep().unwrap();
    let (p_state, p_work) = (tmp.path().join("p-state"), tmp.path().join("p-work"));
    common::cp_a(&state, &p_state);
    common::cp_a(&work, &p_work);
    let pre = tree_hash(&work);
    let mut child = common::spawn_child(&me, CHILD_ENV, &state, &id);
    let started = Instant::now();
    assert!(child.wait().unwrap().success());
    let window = started.elapsed();
    let post = tree_hash(&work);
    assert_ne!(pre, post);
    assert_eq!(read(&work, "snap/d3/f3"), "snap 3\n");
    assert_eq!(read(&work, "old/f7"), "a 7\n");
    assert_eq!(read(&work, "b/d9/f399"), "b 399\n");

    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let first = seed;
    let (mut saw_pre, mut saw_post) = (0, 0);
    for trial in 0..40 {
        common::cp_a(&p_state, &state);
        common::cp_a(&p_work, &work);
        let mut child = common::spawn_child(&me, CHILD_ENV, &state, &id);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = seed % (window.as_micros() as u64 * 11 / 10).max(1);
        std::thread::sleep(Duration::from_micros(delay));
        let _ = child.kill();
        child.wait().unwrap();
        let report = recover(&state, Some(&work)).unwrap();
        let h = tree_hash(&work);
        assert!(
            h == pre || h == post,
            "trial {trial} (seed {first}, kill after {delay}us): neither pre nor post; {report:?}"
        );
        assert!(staging_leftovers(&work).is_empty(), "trial {trial}");
        if h == pre {
            saw_pre += 1;
        } else {
            saw_post += 1;
        }
    }
    eprintln!("layer gather crash: {saw_pre} pre, {saw_post} post over a {window:?} commit");
}
