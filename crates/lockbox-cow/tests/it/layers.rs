//! Layer chains and the split commit ([`flatten`], [`stage_upper`], [`apply_staged`]): the
//! union of several upper layers commits as one change set, and the apply can be redone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_cow::{apply_staged, discard_staging, flatten, stage_upper, ChangeSet, CommitOptions};
use std::fs;
use std::path::Path;

fn whiteout(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        0,
    )
    .unwrap();
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap()
}

/// Workdir {keep, gone, dir/{x, y}}; layer 1 (bottom) adds a.txt, deletes gone, writes dir/x;
/// layer 2 (top) adds b.txt, overwrites a.txt, deletes the whole dir then recreates it with z.
fn setup(root: &Path) -> (std::path::PathBuf, Vec<std::path::PathBuf>) {
    let work = root.join("work");
    fs::create_dir_all(work.join("dir")).unwrap();
    fs::write(work.join("keep"), "keep").unwrap();
    fs::write(work.join("gone"), "gone").unwrap();
    fs::write(work.join("dir/x"), "x0").unwrap();
    fs::write(work.join("dir/y"), "y0").unwrap();
    let l1 = root.join("l1");
    let l2 = root.join("l2");
    fs::create_dir_all(l1.join("dir")).unwrap();
    fs::write(l1.join("a.txt"), "a1").unwrap();
    whiteout(&l1.join("gone"));
    fs::write(l1.join("dir/x"), "x1").unwrap();
    fs::create_dir_all(l2.join("dir")).unwrap();
    fs::write(l2.join("a.txt"), "a2").unwrap();
    fs::write(l2.join("b.txt"), "b2").unwrap();
    rustix::fs::setxattr(
        l2.join("dir"),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    fs::write(l2.join("dir/z"), "z2").unwrap();
    (work, vec![l2, l1])
}

#[test]
fn flattened_layers_commit_their_union_in_one_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let (work, layers) = setup(tmp.path());
    let merged = tmp.path().join("merged");
    fs::create_dir(&merged).unwrap();
    flatten(&layers, &merged).unwrap();
    let lines = ChangeSet::compute(&merged, &work).unwrap().to_lines();
    assert_eq!(
        lines, "A a.txt\nA b.txt\nD dir/x\nD dir/y\nA dir/z\nD gone\n",
        "{lines}"
    );
    let (plan, report) =
        stage_upper(&merged, &work, "t1", None, &CommitOptions::default()).unwrap();
    assert_eq!(report.added, 3);
    // Staged, not applied: the workdir only gained the staging directory.
    assert!(!work.join("a.txt").exists());
    apply_staged(&work, "t1", &plan).unwrap();
    assert_eq!(read(&work.join("a.txt")), "a2");
    assert_eq!(read(&work.join("b.txt")), "b2");
    assert_eq!(read(&work.join("dir/z")), "z2");
    assert!(!work.join("dir/x").exists() && !work.join("dir/y").exists());
    assert!(!work.join("gone").exists());
    assert_eq!(read(&work.join("keep")), "keep");
    let names: Vec<_> = fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 4, "no staging leftover: {names:?}");
    // Redoing a finished apply is a no-op.
    apply_staged(&work, "t1", &plan).unwrap();
    assert_eq!(read(&work.join("a.txt")), "a2");
}

#[test]
fn an_apply_interrupted_halfway_finishes_when_redone() {
    let tmp = tempfile::tempdir().unwrap();
    let (work, layers) = setup(tmp.path());
    let merged = tmp.path().join("merged");
    fs::create_dir(&merged).unwrap();
    flatten(&layers, &merged).unwrap();
    let (plan, _) = stage_upper(&merged, &work, "t2", None, &CommitOptions::default()).unwrap();
    // Simulate a crash after the first placement: do that one rename by hand.
    let staging = work.join(".lockbox-commit-t2");
    let first = match &plan.ops[0] {
        lockbox_cow::PlanOp::Place { path, seq } => (path.clone(), *seq),
        other => panic!("{other:?}"),
    };
    fs::rename(staging.join(first.1.to_string()), work.join(&first.0)).unwrap();
    apply_staged(&work, "t2", &plan).unwrap();
    assert_eq!(read(&work.join("a.txt")), "a2");
    assert_eq!(read(&work.join("b.txt")), "b2");
    assert!(!staging.exists());
}

#[test]
fn discarding_staging_leaves_the_workdir_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let (work, layers) = setup(tmp.path());
    let merged = tmp.path().join("merged");
    fs::create_dir(&merged).unwrap();
    flatten(&layers, &merged).unwrap();
    stage_upper(&merged, &work, "t3", None, &CommitOptions::default()).unwrap();
    discard_staging(&work, "t3").unwrap();
    let mut names: Vec<_> = fs::read_dir(&work)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["dir", "gone", "keep"]);
    assert_eq!(read(&work.join("dir/x")), "x0");
}

#[test]
fn a_directory_over_a_whiteout_hides_the_old_contents() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    fs::create_dir_all(work.join("d")).unwrap();
    fs::write(work.join("d/old"), "old").unwrap();
    let (l1, l2) = (tmp.path().join("l1"), tmp.path().join("l2"));
    fs::create_dir_all(&l1).unwrap();
    whiteout(&l1.join("d"));
    fs::create_dir_all(l2.join("d")).unwrap();
    fs::write(l2.join("d/new"), "new").unwrap();
    let merged = tmp.path().join("merged");
    fs::create_dir(&merged).unwrap();
    flatten(&[l2, l1], &merged).unwrap();
    let lines = ChangeSet::compute(&merged, &work).unwrap().to_lines();
    assert_eq!(lines, "A d/new\nD d/old\n");
}

fn layer_with(root: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let work = root.join("work");
    fs::create_dir_all(work.join("src")).unwrap();
    fs::write(work.join("src/lib"), "old").unwrap();
    let up = root.join("up");
    fs::create_dir_all(up.join("src")).unwrap();
    fs::write(up.join("src/lib"), "new").unwrap();
    fs::write(up.join("src/extra"), "x").unwrap();
    fs::create_dir_all(up.join("out/deep")).unwrap();
    fs::write(up.join("out/deep/a"), "a").unwrap();
    fs::write(up.join("scratch"), "s").unwrap();
    (work, up)
}

#[test]
fn restrict_keeps_only_the_selected_paths_and_their_new_parents() {
    let tmp = tempfile::tempdir().unwrap();
    let (work, up) = layer_with(tmp.path());
    lockbox_cow::restrict(&up, &["out/deep/a".into(), "src/lib".into()], &[]).unwrap();
    let lines = ChangeSet::compute(&up, &work).unwrap().to_lines();
    assert_eq!(lines, "A out\nA out/deep\nA out/deep/a\nM src/lib\n");
}

#[test]
fn restrict_drops_excluded_subtrees() {
    let tmp = tempfile::tempdir().unwrap();
    let (work, up) = layer_with(tmp.path());
    lockbox_cow::restrict(&up, &[], &["out".into(), "src/extra".into()]).unwrap();
    let lines = ChangeSet::compute(&up, &work).unwrap().to_lines();
    assert_eq!(lines, "A scratch\nM src/lib\n");
}

#[test]
fn restrict_refuses_a_path_below_a_deleted_or_opaque_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let up = tmp.path().join("up");
    fs::create_dir_all(&up).unwrap();
    whiteout(&up.join("gone"));
    let err = lockbox_cow::restrict(&up, &[], &["gone/x".into()]).unwrap_err();
    assert_eq!(err.code(), "BAD_PATH", "{err}");
    let err = lockbox_cow::restrict(&up, &["gone/x".into()], &[]).unwrap_err();
    assert_eq!(err.code(), "BAD_PATH", "{err}");
    assert!(lockbox_cow::restrict(&up, &["../x".into()], &[]).is_err());
}

#[test]
fn fifos_of_any_layer_are_carried_through_flatten_and_skipped_by_the_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let (work, layers) = setup(tmp.path());
    let fifo = |p: &Path| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            p,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap()
    };
    fifo(&layers[1].join("pipe"));
    fifo(&layers[0].join("dir/pipe"));
    let merged = tmp.path().join("merged");
    fs::create_dir(&merged).unwrap();
    flatten(&layers, &merged).unwrap();
    let (plan, report) =
        stage_upper(&merged, &work, "t1", None, &CommitOptions::default()).unwrap();
    let skipped: Vec<_> = report
        .skipped
        .iter()
        .map(|s| (s.path.display().to_string(), s.reason))
        .collect();
    assert_eq!(
        skipped,
        [
            ("dir/pipe".to_owned(), lockbox_cow::SkipReason::Fifo),
            ("pipe".to_owned(), lockbox_cow::SkipReason::Fifo),
        ]
    );
    apply_staged(&work, "t1", &plan).unwrap();
    assert_eq!(read(&work.join("dir/z")), "z2");
    assert!(!work.join("pipe").exists() && !work.join("dir/pipe").exists());
}
