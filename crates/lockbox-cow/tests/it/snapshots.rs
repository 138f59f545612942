//! Snapshots on real overlay mounts (`unshare -Urm`): a fork's view is its snapshot's view
//! plus its own changes, checked against a model over a tree three levels deep; deletes
//! refused while forks or snapshots use a snapshot; crashes leave nothing half-made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use lockbox_cow::{CowError, NewSnapshot, SnapshotId, SnapshotStore, Timestamp};

/// The model of a view: path → `None` for a directory, `Some(content)` for a file.
type Model = BTreeMap<String, Option<String>>;

fn q(p: &Path) -> String {
    format!("'{}'", p.display())
}

/// Mounts an overlay of `upper` over `lowers` (top first) and runs `script` in it, then
/// prints the view: `d PATH` or `f PATH CONTENT`, one per line, sorted.
fn in_view(lowers: &[PathBuf], upper: &Path, work: &Path, mnt: &Path, script: &str) -> Model {
    let lowerdir: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
    let full = format!(
        "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={},userxattr {} || exit 99\n\
         cd {} || exit 98\n{PRELUDE}\n{script}\n\
         find . -mindepth 1 | sort | while read -r p; do\n\
           if [ -d \"$p\" ]; then echo \"d ${{p#./}}\"; else echo \"f ${{p#./}} $(tr '\\n' + < \"$p\")\"; fi\n\
         done",
        lowerdir.join(":"),
        q(upper),
        q(work),
        q(mnt),
        q(mnt),
    );
    let out = Command::new("timeout")
        .args(["120", "unshare", "-Urm", "sh", "-ec", &full])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (kind, rest) = l.split_at(2);
            match kind {
                "d " => (rest.to_owned(), None),
                _ => {
                    let (p, c) = rest.split_once(' ').unwrap_or((rest, ""));
                    (p.to_owned(), Some(c.to_owned()))
                }
            }
        })
        .collect()
}

/// `w PATH TEXT` writes a file, `m PATH` makes a directory, each replacing whatever is at
/// the path and turning files on the way into directories (as the model does).
const PRELUDE: &str = r#"
parents() {
  a=""
  for part in $(echo "$1" | tr / ' '); do
    a="${a:+$a/}$part"
    if [ -e "$a" ] && [ ! -d "$a" ]; then rm -f "$a"; fi
    [ -d "$a" ] || mkdir "$a"
  done
}
w() { d=$(dirname "$1"); [ "$d" = . ] || parents "$d"; rm -rf "$1"; echo "$2" > "$1"; }
m() { rm -rf "$1"; parents "$1"; }
"#;

/// A sandbox's branch-like directories: upper, work, mount point.
struct Sandbox {
    lowers: Vec<PathBuf>,
    upper: PathBuf,
    work: PathBuf,
    mnt: PathBuf,
    model: Model,
}

impl Sandbox {
    fn new(root: &Path, name: &str, lowers: Vec<PathBuf>, model: Model) -> Sandbox {
        let d = root.join(name);
        for sub in ["upper", "work", "mnt"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        Sandbox {
            lowers,
            upper: d.join("upper"),
            work: d.join("work"),
            mnt: d.join("mnt"),
            model,
        }
    }

    /// Runs `ops` in the view and in the model; checks the view equals the model.
    fn apply(&mut self, ops: &[Op]) {
        let script: Vec<String> = ops.iter().map(Op::script).collect();
        for op in ops {
            op.model(&mut self.model);
        }
        let seen = in_view(
            &self.lowers,
            &self.upper,
            &self.work,
            &self.mnt,
            &script.join("\n"),
        );
        assert_eq!(seen, self.model, "after {ops:?}");
    }

    fn view(&self) -> Model {
        in_view(&self.lowers, &self.upper, &self.work, &self.mnt, ":")
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write(String, String),
    Remove(String),
    Mkdir(String),
    /// Appends to a file in place (the same inode: a snapshot must not share it).
    Append(String, String),
}

impl Op {
    fn script(&self) -> String {
        match self {
            Op::Write(p, c) => format!("w {p} {c}"),
            Op::Remove(p) => format!("rm -rf {p}"),
            Op::Mkdir(p) => format!("m {p}"),
            Op::Append(p, c) => format!("if [ -f {p} ]; then echo {c} >> {p}; fi"),
        }
    }

    fn model(&self, m: &mut Model) {
        let below = |p: &str| format!("{p}/");
        match self {
            Op::Write(p, c) => {
                m.retain(|k, _| !k.starts_with(&below(p)));
                let mut parent = String::new();
                for part in p.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
                    parent = if parent.is_empty() {
                        (*part).to_owned()
                    } else {
                        format!("{parent}/{part}")
                    };
                    m.insert(parent.clone(), None);
                }
                m.insert(p.clone(), Some(format!("{c}+")));
            }
            Op::Append(p, c) => {
                if let Some(Some(old)) = m.get_mut(p) {
                    old.push_str(&format!("{c}+"));
                }
            }
            Op::Remove(p) => {
                m.retain(|k, _| k != p && !k.starts_with(&below(p)));
            }
            Op::Mkdir(p) => {
                m.retain(|k, _| k != p && !k.starts_with(&below(p)));
                let mut parent = String::new();
                for part in p.split('/') {
                    parent = if parent.is_empty() {
                        part.to_owned()
                    } else {
                        format!("{parent}/{part}")
                    };
                    m.insert(parent.clone(), None);
                }
            }
        }
    }
}

/// Deterministic pseudo-random operations over a small name space, so that levels write,
/// delete and replace each other's (and the workdir's) paths.
fn ops(seed: u64, n: usize, tag: &str) -> Vec<Op> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let paths = [
        "a", "b", "d1/x", "d1/y", "d1/sub/z", "d2/w", "d2", "d1", "e/f/g",
    ];
    (0..n)
        .map(|i| {
            let p = paths[(next() % paths.len() as u64) as usize].to_owned();
            match next() % 5 {
                0 => Op::Remove(p),
                1 => Op::Mkdir(p),
                2 => Op::Append(p, format!("{tag}{i}")),
                _ => Op::Write(p, format!("{tag}{i}")),
            }
        })
        .collect()
}

fn new_snapshot(parent: Option<SnapshotId>, wd: &Path) -> NewSnapshot {
    NewSnapshot {
        name: Some("test".into()),
        parent,
        workdir: wd.to_owned(),
        base_ctime: Timestamp { secs: 1, nanos: 0 },
        context: serde_json::json!({"sessions": []}),
        scratch: Vec::new(),
        limits: lockbox_cow::SnapshotLimits::default(),
    }
}

fn workdir_model(wd: &Path) -> Model {
    let mut m = Model::new();
    for (p, c) in [
        ("a", "wa"),
        ("b", "wb"),
        ("d1/x", "wx"),
        ("d1/sub/z", "wz"),
        ("d2/w", "ww"),
    ] {
        std::fs::create_dir_all(wd.join(p).parent().unwrap()).unwrap();
        std::fs::write(wd.join(p), format!("{c}\n")).unwrap();
        Op::Write(p.into(), c.into()).model(&mut m);
    }
    m
}

#[test]
fn fork_trees_three_levels_deep_see_their_snapshot_plus_their_own_changes() {
    if !require_overlay() {
        return;
    }
    for seed in 1..=4u64 {
        let s = Scratch::new();
        let root = s.tmp.path().join("sandboxes");
        let base = workdir_model(&s.wd);
        let store = SnapshotStore::open(&s.state).unwrap();

        // Level 0: a sandbox on the workdir, snapshotted.
        let mut a = Sandbox::new(&root, "a", vec![s.wd.clone()], base.clone());
        a.apply(&ops(seed, 12, "a"));
        let s1 = store.capture(&a.upper, new_snapshot(None, &s.wd)).unwrap();
        let l1 = store.layers(&s1.id).unwrap();
        // The sandbox goes on writing: the snapshot does not change.
        let at_s1 = a.model.clone();
        a.apply(&ops(seed + 100, 6, "a2"));

        // Level 1: two forks of S1, each with its own changes.
        let fork_lowers = |layers: &[PathBuf]| {
            let mut l = layers.to_vec();
            l.push(s.wd.clone());
            l
        };
        let mut f1 = Sandbox::new(&root, "f1", fork_lowers(&l1), at_s1.clone());
        let mut f2 = Sandbox::new(&root, "f2", fork_lowers(&l1), at_s1.clone());
        assert_eq!(f1.view(), at_s1, "a fork starts with its snapshot's view");
        f1.apply(&ops(seed + 200, 12, "f1"));
        f2.apply(&ops(seed + 300, 12, "f2"));
        store.hold(&s1.id, "f1").unwrap();
        store.hold(&s1.id, "f2").unwrap();
        let s2 = store
            .capture(&f1.upper, new_snapshot(Some(s1.id.clone()), &s.wd))
            .unwrap();
        assert_eq!(s2.parent.as_ref(), Some(&s1.id));
        let l2 = store.layers(&s2.id).unwrap();
        assert_eq!(l2.len(), 2);
        let at_s2 = f1.model.clone();

        // Level 2: a fork of S2, snapshotted again, and a fork of that.
        let mut g = Sandbox::new(&root, "g", fork_lowers(&l2), at_s2.clone());
        g.apply(&ops(seed + 400, 12, "g"));
        let s3 = store
            .capture(&g.upper, new_snapshot(Some(s2.id.clone()), &s.wd))
            .unwrap();
        let l3 = store.layers(&s3.id).unwrap();
        let mut h = Sandbox::new(&root, "h", fork_lowers(&l3), g.model.clone());
        h.apply(&ops(seed + 500, 12, "h"));

        // Every snapshot's view is what its sandbox saw when it was taken, however the
        // sandboxes went on; siblings never see each other.
        for (layers, want) in [(&l1, &at_s1), (&l2, &at_s2), (&l3, &g.model)] {
            let v = Sandbox::new(
                &root,
                &format!("v{}", layers.len()),
                fork_lowers(layers),
                Model::new(),
            );
            assert_eq!(
                &v.view(),
                want,
                "seed {seed}: snapshot of depth {}",
                layers.len()
            );
        }
        assert_eq!(f2.view(), f2.model);
        assert_eq!(a.view(), a.model);
        // The workdir itself was never written.
        let mut wd_now = Model::new();
        for (p, c) in base.iter() {
            let on_disk = s.wd.join(p);
            match c {
                None => assert!(on_disk.is_dir(), "{p}"),
                Some(c) => {
                    let text = std::fs::read_to_string(&on_disk).unwrap();
                    assert_eq!(text.replace('\n', "+"), *c)
                }
            }
            wd_now.insert(p.clone(), c.clone());
        }
        assert_eq!(wd_now, base);
    }
}

#[test]
fn a_snapshot_in_use_is_not_deleted_and_deleting_all_leaves_nothing() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    let root = s.tmp.path().join("sandboxes");
    let base = workdir_model(&s.wd);
    let store = SnapshotStore::open(&s.state).unwrap();
    let mut a = Sandbox::new(&root, "a", vec![s.wd.clone()], base);
    a.apply(&[Op::Write("new".into(), "1".into()), Op::Remove("a".into())]);
    let s1 = store.capture(&a.upper, new_snapshot(None, &s.wd)).unwrap();
    let s2 = store
        .capture(&a.upper, new_snapshot(Some(s1.id.clone()), &s.wd))
        .unwrap();
    store.hold(&s2.id, "fork-1").unwrap();

    match store.delete(&s1.id).unwrap_err() {
        CowError::SnapshotInUse {
            holders, children, ..
        } => {
            assert!(holders.is_empty());
            assert_eq!(children, vec![s2.id.to_string()]);
        }
        e => panic!("{e}"),
    }
    let e = store.delete(&s2.id).unwrap_err();
    assert_eq!(e.code().as_str(), "SNAPSHOT_IN_USE");
    assert!(e.to_string().contains("fork-1"), "{e}");
    assert_eq!(store.holders(&s2.id).unwrap(), vec!["fork-1".to_owned()]);

    store.release(&s2.id, "fork-1").unwrap();
    store.delete(&s2.id).unwrap();
    store.delete(&s1.id).unwrap();
    let e = store.get(&s1.id).unwrap_err();
    assert_eq!(e.code().as_str(), "SNAPSHOT_NOT_FOUND");
    assert_eq!(e.exit_code(), 2);
    assert!(store.list().unwrap().is_empty());
    let left: Vec<_> = std::fs::read_dir(store.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(std::fs::read_dir(store.dir().join(".new"))
        .unwrap()
        .next()
        .is_none());
    // A hold on a snapshot that is gone is refused; bad names too.
    assert_eq!(
        store.hold(&s1.id, "x").unwrap_err().code().as_str(),
        "SNAPSHOT_NOT_FOUND"
    );
    assert_eq!(
        SnapshotId::parse("../x").unwrap_err().code().as_str(),
        "INVALID_SNAPSHOT_ID"
    );
}

#[test]
fn a_crash_leaves_no_half_made_snapshot_and_the_next_open_sweeps_it() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    let store = SnapshotStore::open(&s.state).unwrap();
    let upper = s.tmp.path().join("upper");
    std::fs::create_dir(&upper).unwrap();
    std::fs::write(upper.join("f"), "x").unwrap();
    let kept = store.capture(&upper, new_snapshot(None, &s.wd)).unwrap();

    // A creator killed mid-copy (its pid is gone) and a removal killed after its record went.
    let dead = store
        .dir()
        .join(".new")
        .join(format!("{}-s1-2-3", i32::MAX));
    std::fs::create_dir_all(dead.join("layer/deep")).unwrap();
    std::fs::write(dead.join("layer/deep/f"), "half").unwrap();
    let half_gone = store.dir().join("s2-3-4");
    std::fs::create_dir_all(half_gone.join("layer")).unwrap();
    assert_eq!(store.list().unwrap().len(), 1, "neither is listed");

    let store = SnapshotStore::open(&s.state).unwrap();
    assert!(!dead.exists());
    assert!(!half_gone.exists());
    assert_eq!(store.list().unwrap(), vec![kept.clone()]);
    assert_eq!(store.get(&kept.id).unwrap().entries, 1);
}

/// A snapshot received from another store (a fleet's other node) is published under its own
/// id only with its parent here; one dropped unpublished leaves nothing, and one whose
/// receiver was killed is swept by the next open; a second receive of it keeps the first.
#[test]
fn a_received_snapshot_is_published_whole_or_leaves_nothing() {
    let s = Scratch::new();
    let store = SnapshotStore::open(&s.state).unwrap();
    let unfinished = || std::fs::read_dir(store.dir().join(".new")).unwrap().count();
    let id = SnapshotId::parse("s-moved").unwrap();
    let meta = |id: &SnapshotId, parent: Option<&str>| lockbox_cow::SnapshotMeta {
        format_version: lockbox_cow::SNAPSHOT_FORMAT_VERSION,
        id: id.clone(),
        name: Some("moved".into()),
        parent: parent.map(|p| SnapshotId::parse(p).unwrap()),
        workdir: s.wd.clone(),
        base_ctime: Timestamp { secs: 1, nanos: 0 },
        created: Timestamp { secs: 2, nanos: 0 },
        bytes: 0,
        entries: 0,
        context: serde_json::json!({}),
    };
    let fill = |incoming: &lockbox_cow::IncomingSnapshot| {
        std::fs::create_dir(incoming.layer_dir().join("d")).unwrap();
        std::fs::write(incoming.layer_dir().join("d/f"), "moved").unwrap();
        std::fs::write(incoming.scratch_dir("tmp").unwrap().join("t"), "tmp").unwrap();
    };
    let limits = lockbox_cow::SnapshotLimits::default();

    // Dropped unpublished (its artifact refused): nothing left.
    let incoming = store.incoming(&id).unwrap();
    fill(&incoming);
    assert_eq!(unfinished(), 1);
    drop(incoming);
    assert_eq!(unfinished(), 0);
    // Its parent is not here: refused, nothing left.
    let incoming = store.incoming(&id).unwrap();
    fill(&incoming);
    let e = incoming
        .publish(meta(&id, Some("s-absent")), 0o755, limits)
        .unwrap_err();
    assert!(
        matches!(e, CowError::SnapshotNotFound { ref id } if id == "s-absent"),
        "{e}"
    );
    assert_eq!(unfinished(), 0);
    assert!(store.list().unwrap().is_empty());
    // Beyond the store's bound: refused, nothing left.
    let incoming = store.incoming(&id).unwrap();
    fill(&incoming);
    let tight = lockbox_cow::SnapshotLimits {
        max_entries: Some(2),
        ..limits
    };
    let e = incoming.publish(meta(&id, None), 0o755, tight).unwrap_err();
    assert!(matches!(e, CowError::SnapshotLimit { .. }), "{e}");
    assert_eq!(unfinished(), 0);

    let incoming = store.incoming(&id).unwrap();
    fill(&incoming);
    let got = incoming.publish(meta(&id, None), 0o751, limits).unwrap();
    let lockbox_cow::Received::Published(published) = got else {
        panic!("{got:?}");
    };
    // layer, layer/d, layer/d/f, scratch, scratch/tmp, scratch/tmp/t
    assert_eq!(published.entries, 6);
    assert_eq!(store.get(&id).unwrap(), published);
    let layer = &store.layers(&id).unwrap()[0];
    assert_eq!(std::fs::read_to_string(layer.join("d/f")).unwrap(), "moved");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(layer).unwrap().permissions())
            & 0o7777,
        0o751
    );
    assert_eq!(
        std::fs::read_to_string(store.scratch(&id, "tmp").unwrap().join("t")).unwrap(),
        "tmp"
    );
    // Received again (two copies raced): the store keeps its own.
    let incoming = store.incoming(&id).unwrap();
    let again = incoming.publish(meta(&id, None), 0o700, limits).unwrap();
    assert_eq!(again, lockbox_cow::Received::AlreadyHad(published));
    assert_eq!(unfinished(), 0);

    // A receiver killed midway (its pid is gone): the next open sweeps what it made.
    let dead = store
        .dir()
        .join(".new")
        .join(format!("{}-0-s-other", i32::MAX));
    std::fs::create_dir_all(dead.join("layer/deep")).unwrap();
    let store = SnapshotStore::open(&s.state).unwrap();
    assert!(!dead.exists());
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn snapshot_tests_pass_as_uid_65534() {
    if std::env::var_os("LOCKBOX_SNAPSHOT_AS_NOBODY").is_some() {
        return;
    }
    if !rustix::process::geteuid().is_root() || !require_overlay() {
        return;
    }
    let st = lockbox_testkit::as_uid_65534("LOCKBOX_SNAPSHOT_AS_NOBODY")
        .args(["--test-threads", "2"])
        .args(
            [
                "fork_trees",
                "a_snapshot_in_use",
                "a_crash",
                "a_fork_commits",
                "a_received_snapshot_is_published_whole_or_leaves_nothing",
            ]
            .map(|f| lockbox_testkit::test_name!(f)),
        )
        .status()
        .unwrap();
    assert!(st.success(), "as uid 65534: {st}");
}

/// Runs `script` in an overlay of `branch` as a sandbox of it sees it: its upper over its
/// snapshot layers over the workdir.
fn run_in_fork(branch: &lockbox_cow::Branch, script: &str) {
    let mut lowers = branch.layers().to_vec();
    lowers.push(branch.workdir().to_owned());
    let mnt = branch.dir().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    in_view(
        &lowers,
        &branch.upper_dir(),
        &branch.work_dir(),
        &mnt,
        script,
    );
}

#[test]
fn a_fork_commits_its_snapshot_and_its_own_changes_and_then_its_sibling_is_stale() {
    if !require_overlay() {
        return;
    }
    let s = Scratch::new();
    workdir_model(&s.wd);
    let store = SnapshotStore::open(&s.state).unwrap();
    let a = s.branch();
    assert!(run_in_branch(
        &a,
        "echo from-a > made.txt && rm b && echo a2 >> a"
    ));
    let snap = store
        .capture(
            &a.upper_dir(),
            NewSnapshot {
                base_ctime: a.meta().base_ctime,
                ..new_snapshot(None, &s.wd)
            },
        )
        .unwrap();
    // The first sandbox goes on; its later writes are not the snapshot's.
    assert!(run_in_branch(&a, "echo later > later.txt"));
    let layers = store.layers(&snap.id).unwrap();
    let fork = |n: &str| {
        lockbox_cow::Branch::create_fork(
            &s.state,
            &s.wd,
            layers.clone(),
            snap.base_ctime,
            serde_json::json!({ "fork": n }),
        )
        .unwrap()
    };
    let f1 = fork("f1");
    let f2 = fork("f2");
    run_in_fork(&f1, "echo f1 > f1.txt && echo f1 >> a");
    run_in_fork(&f2, "echo f2 >> a");

    // A fork's changes are its snapshot's and its own, against the workdir.
    let paths = |b: &lockbox_cow::Branch| -> Vec<String> {
        b.change_set()
            .unwrap()
            .changes()
            .iter()
            .map(|c| c.path.display().to_string())
            .collect()
    };
    assert_eq!(paths(&f1), ["a", "b", "f1.txt", "made.txt"]);
    assert_eq!(paths(&f2), ["a", "b", "made.txt"]);
    let streamed: Vec<String> = f1
        .changes()
        .unwrap()
        .map(|c| c.unwrap().path.display().to_string())
        .collect();
    assert_eq!(streamed, paths(&f1));
    match f1.diff(Path::new("a")).unwrap() {
        lockbox_cow::FileDiff::Text { unified } => {
            assert!(
                unified.contains("+a2") && unified.contains("+f1"),
                "{unified}"
            )
        }
        d => panic!("{d:?}"),
    }
    // Forks use the snapshot: it cannot go.
    match store.delete(&snap.id).unwrap_err() {
        CowError::SnapshotInUse { holders, .. } => {
            let mut want = vec![f1.id().to_string(), f2.id().to_string()];
            want.sort();
            let mut got = holders.clone();
            got.sort();
            assert_eq!(got, want);
        }
        e => panic!("{e}"),
    }

    // Committing one fork applies the snapshot's changes and its own.
    let f2_id = f2.id().clone();
    f1.commit(&lockbox_cow::CommitOptions::default()).unwrap();
    assert_eq!(
        std::fs::read_to_string(s.wd.join("a")).unwrap(),
        "wa\na2\nf1\n"
    );
    assert_eq!(
        std::fs::read_to_string(s.wd.join("made.txt")).unwrap(),
        "from-a\n"
    );
    assert!(s.wd.join("f1.txt").exists() && !s.wd.join("b").exists());
    assert!(!s.wd.join("later.txt").exists());
    // Its sibling wrote the same path from the same snapshot: stale (exit 5).
    let f2 = lockbox_cow::Branch::open(&s.state, &f2_id).unwrap();
    let e = f2
        .commit(&lockbox_cow::CommitOptions::default())
        .unwrap_err();
    assert_eq!(e.exit_code(), 5, "{e}");
    assert_eq!(
        std::fs::read_to_string(s.wd.join("a")).unwrap(),
        "wa\na2\nf1\n"
    );
    // Once no fork uses it, the snapshot goes; no view directory is left behind.
    lockbox_cow::abort_id(&s.state, &f2_id).unwrap();
    store.delete(&snap.id).unwrap();
    let views: Vec<_> = walkdir(&s.state)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".view-"))
        })
        .collect();
    assert!(views.is_empty(), "{views:?}");
}

fn walkdir(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

#[test]
fn a_spare_fork_keeps_its_snapshot_from_nothing_and_goes_with_it() {
    let s = Scratch::new();
    workdir_model(&s.wd);
    let store = SnapshotStore::open(&s.state).unwrap();
    let a = s.branch();
    let snap = store
        .capture(
            &a.upper_dir(),
            NewSnapshot {
                base_ctime: a.meta().base_ctime,
                ..new_snapshot(None, &s.wd)
            },
        )
        .unwrap();
    let layers = store.layers(&snap.id).unwrap();
    let fork = |context| {
        lockbox_cow::Branch::create_fork(&s.state, &s.wd, layers.clone(), snap.base_ctime, context)
            .unwrap()
    };
    let spare = fork(serde_json::json!({ "sandbox": "sb-1", lockbox_cow::SPARE: true }));
    let mut used = fork(serde_json::json!({ "sandbox": "sb-2", lockbox_cow::SPARE: true }));
    // Handed out: no longer a spare, so it holds the snapshot.
    used.set_context(serde_json::json!({ "sandbox": "sb-2" }))
        .unwrap();
    assert_eq!(
        store.forks(&snap.id).unwrap(),
        [format!("{} (sandbox sb-2)", used.id())]
    );
    match store.delete(&snap.id).unwrap_err() {
        CowError::SnapshotInUse { holders, .. } => {
            assert_eq!(holders, [format!("{} (sandbox sb-2)", used.id())])
        }
        e => panic!("{e}"),
    }
    assert!(spare.dir().is_dir(), "a refused delete removes nothing");
    used.abort().unwrap();
    // Only the spare is left: the snapshot goes, and the spare with it.
    store.delete(&snap.id).unwrap();
    assert!(!spare.dir().exists());
    assert!(store.list().unwrap().is_empty());
}
