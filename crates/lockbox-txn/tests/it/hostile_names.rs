//! Issue 15: a pipeline commits through the same engine as a branch (`flatten`,
//! `stage_upper`, `apply_staged`), so what a stage may do to names it owns commits whole:
//! paths longer than `PATH_MAX`, directories it made unreadable, files of holes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{dirs, rerun_as_nobody, stage, staging_leftovers};
use lockbox_txn::Pipeline;

/// `$N` is one 200-byte name; `godeep` enters `deep/` and 21 levels below it with `cd -P`
/// (a whole path that long is refused by the kernel).
const DEEP: &str = "N=$(printf '%0200d' 0 | tr 0 x); \
    godeep() { cd -P deep && i=0 && while [ $i -lt 21 ]; do cd -P $N || return 1; i=$((i+1)); done; }; \
    P=deep; i=0; while [ $i -lt 21 ]; do P=$P/$N; i=$((i+1)); done; ";

/// Reads `deep/<N>{21}/name` one component at a time.
fn read_deep(work: &Path, name: &str) -> String {
    use rustix::fs::{Mode, OFlags};
    let n = "x".repeat(200);
    let mut dir = rustix::fs::open(work.join("deep"), OFlags::PATH, Mode::empty()).unwrap();
    for _ in 0..21 {
        dir = rustix::fs::openat(dir.as_fd(), n.as_str(), OFlags::PATH, Mode::empty()).unwrap();
    }
    let f = rustix::fs::openat(dir.as_fd(), name, OFlags::RDONLY, Mode::empty()).unwrap();
    std::io::read_to_string(std::fs::File::from(f)).unwrap()
}

#[test]
fn a_pipeline_commits_long_paths_unreadable_directories_and_holes_whole() {
    let (_tmp, state, work) = dirs();
    std::fs::write(work.join("keep"), "keep\n").unwrap();
    let first = format!(
        "{DEEP}mkdir -p \"$P\" && (godeep && echo deep > f) && mkdir -p d/sub && echo x > d/sub/f && \
         chmod 000 d/sub && chmod 300 d && truncate -s 1G sparse.img"
    );
    let second = format!(
        "{DEEP}(godeep && cat f > g) && mkdir e && echo y > e/g && chmod 000 e && \
         printf x | dd of=holey bs=1 seek=50000000 status=none"
    );
    let outcome = Pipeline::new(&state, &work)
        .stage(stage(&work, &first))
        .stage(stage(&work, &second))
        .run()
        .unwrap();
    assert!(outcome.committed, "{outcome:?}");
    assert_eq!(read_deep(&work, "g"), "deep\n");
    let mode = |p: &str| std::fs::symlink_metadata(work.join(p)).unwrap().mode() & 0o7777;
    assert_eq!((mode("d"), mode("e")), (0o300, 0o000));
    let meta = |p: &str| std::fs::metadata(work.join(p)).unwrap();
    assert_eq!(
        (meta("sparse.img").len(), meta("sparse.img").blocks()),
        (1 << 30, 0)
    );
    assert!(
        meta("holey").blocks() <= 8,
        "holey: {} blocks",
        meta("holey").blocks()
    );
    assert!(staging_leftovers(&work).is_empty());
    for d in ["d", "d/sub", "e"] {
        std::fs::set_permissions(work.join(d), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    rerun_as_nobody(&lockbox_testkit::test_name!(
        "a_pipeline_commits_long_paths_unreadable_directories_and_holes_whole"
    ));
}
