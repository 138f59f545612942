//! Copy-on-write views on the real kernel: writes land in the upper layer, the real
//! directory does not change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_policy::{Overlay, OverlayUpper, Policy};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

fn sh(policy: &Policy, script: &str) -> i32 {
    let argv = ["sh".into(), "-c".into(), script.into()];
    lockbox_confine::run(policy, &argv).unwrap().exit_code()
}

#[test]
fn writes_to_an_overlay_land_in_the_upper_layer_only() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("project");
    let branch = dir.path().join("branch");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(branch.join("upper")).unwrap();
    std::fs::create_dir_all(branch.join("work")).unwrap();
    std::fs::write(work.join("keep.txt"), "original").unwrap();
    std::fs::write(work.join("gone.txt"), "delete me").unwrap();

    let mut policy = Policy::default();
    policy.fs.overlays.push(Overlay {
        target: work.clone(),
        lowers: vec![work.clone()],
        upper: Some(OverlayUpper {
            upper: branch.join("upper"),
            work: branch.join("work"),
            max_size: None,
        }),
    });
    let w = work.display();
    let script = format!(
        "cd {w} && echo changed > keep.txt && rm gone.txt && echo new > new.txt && cat keep.txt && test ! -e gone.txt"
    );
    assert_eq!(sh(&policy, &script), 0);

    // The real directory is untouched.
    assert_eq!(
        std::fs::read_to_string(work.join("keep.txt")).unwrap(),
        "original"
    );
    assert!(work.join("gone.txt").exists());
    assert!(!work.join("new.txt").exists());
    // The upper layer holds the changes: files and a whiteout for the deletion.
    let upper = branch.join("upper");
    assert_eq!(
        std::fs::read_to_string(upper.join("keep.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        std::fs::read_to_string(upper.join("new.txt")).unwrap(),
        "new\n"
    );
    let whiteout = std::fs::symlink_metadata(upper.join("gone.txt")).unwrap();
    assert!(whiteout.file_type().is_char_device(), "{whiteout:?}");
}

#[test]
fn a_stack_of_lowers_shows_the_top_layer_first_and_is_read_only_without_upper() {
    let dir = tempfile::tempdir().unwrap();
    let (base, layer) = (dir.path().join("base"), dir.path().join("layer"));
    std::fs::create_dir_all(&base).unwrap();
    std::fs::create_dir_all(&layer).unwrap();
    std::fs::write(base.join("a"), "base").unwrap();
    std::fs::write(layer.join("a"), "layer").unwrap();
    std::fs::write(base.join("b"), "base-only").unwrap();
    let mut policy = Policy::default();
    policy.fs.overlays.push(Overlay {
        target: base.clone(),
        lowers: vec![layer.clone(), base.clone()],
        upper: None,
    });
    let b = base.display();
    assert_eq!(
        sh(
            &policy,
            &format!("test \"$(cat {b}/a)$(cat {b}/b)\" = layerbase-only")
        ),
        0
    );
    assert_ne!(sh(&policy, &format!("echo x > {b}/c")), 0);
    assert!(!Path::new(&base.join("c")).exists());
}

#[test]
fn a_missing_layer_is_an_error_naming_it() {
    let mut policy = Policy::default();
    policy.fs.overlays.push(Overlay {
        target: "/nonexistent-target".into(),
        lowers: vec!["/nonexistent-lower".into()],
        upper: None,
    });
    let err = lockbox_confine::run(&policy, &["true".into()]).unwrap_err();
    assert!(err.to_string().contains("/nonexistent-lower"), "{err}");
}
