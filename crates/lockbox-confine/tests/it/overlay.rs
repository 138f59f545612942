//! Copy-on-write views on the real kernel: writes land in the upper layer, the real
//! directory does not change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_policy::{Overlay, OverlayUpper, Policy};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

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
        writable: None,
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
        writable: None,
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
        writable: None,
    });
    let err = lockbox_confine::run(&policy, &["true".into()]).unwrap_err();
    assert!(err.to_string().contains("/nonexistent-lower"), "{err}");
}

/// A view of `work` (under a fresh directory of `base`) whose upper is `branch/upper`,
/// writable only at `writable` (relative to the view).
fn restricted_view(base: &str, writable: &[&str]) -> (tempfile::TempDir, PathBuf, Policy) {
    let dir = tempfile::tempdir_in(base).unwrap();
    let work = dir.path().join("project");
    let branch = dir.path().join("branch");
    std::fs::create_dir_all(work.join("web")).unwrap();
    std::fs::create_dir_all(work.join("api")).unwrap();
    std::fs::write(work.join("api/main"), "api").unwrap();
    std::fs::create_dir_all(branch.join("upper")).unwrap();
    std::fs::create_dir_all(branch.join("work")).unwrap();
    let mut policy = Policy::default();
    policy.fs.overlays.push(Overlay {
        target: work.clone(),
        lowers: vec![work.clone()],
        upper: Some(OverlayUpper {
            upper: branch.join("upper"),
            work: branch.join("work"),
            max_size: None,
        }),
        writable: Some(writable.iter().map(|w| work.join(w)).collect()),
    });
    policy.cwd = Some(work.clone());
    (dir, work, policy)
}

/// A shell snippet that runs `script` and exits 0 only if it failed with EACCES (Landlock)
/// or EROFS (the read-only mount of the view).
fn denied(script: &str) -> String {
    format!("out=$( ({script}) 2>&1 ) && exit 1; case \"$out\" in *'Permission denied'*|*'Read-only file system'*) exit 0;; *) echo \"$out\" >&2; exit 1;; esac")
}

#[test]
fn a_restricted_view_is_writable_only_below_its_writable_paths() {
    let (_dir, work, policy) = restricted_view("/var/tmp", &["web", "out/dist"]);
    let wrote =
        "cat api/main && echo x > web/x && echo d > out/dist/d && echo t > /tmp/t && cat /tmp/t";
    assert_eq!(sh(&policy, wrote), 0);
    for script in [
        "echo y > api/y",
        "echo y > top",
        "echo y >> api/main",
        "rm api/main",
        "mv web/x api/x",
        "mkdir web2",
        "rmdir web",
    ] {
        assert_eq!(sh(&policy, &denied(script)), 0, "{script} was not denied");
    }
    assert_eq!(
        std::fs::read_to_string(work.join("api/main")).unwrap(),
        "api"
    );
    // The writes, and the missing directory made for them, are in the upper layer only.
    let upper = work.parent().unwrap().join("branch/upper");
    assert_eq!(std::fs::read_to_string(upper.join("web/x")).unwrap(), "x\n");
    assert_eq!(
        std::fs::read_to_string(upper.join("out/dist/d")).unwrap(),
        "d\n"
    );
    assert!(!work.join("out").exists());
}

#[test]
fn a_view_with_no_writable_paths_is_read_only_and_tmp_stays_writable() {
    let (_dir, _work, policy) = restricted_view("/var/tmp", &[]);
    assert_eq!(sh(&policy, "cat api/main && echo t > /tmp/t"), 0);
    for script in ["echo y > web/y", "echo y > api/main", "touch new"] {
        assert_eq!(sh(&policy, &denied(script)), 0, "{script} was not denied");
    }
}

#[test]
fn a_restricted_view_under_tmp_is_enforced_too() {
    // The sandbox's private /tmp is writable, and Landlock rules add up along the path: the
    // read-only mount of the view is what holds here.
    let (_dir, work, policy) = restricted_view("/tmp", &["web"]);
    assert_eq!(sh(&policy, "echo x > web/x"), 0);
    for script in ["echo y > api/y", "chmod 600 api/main", "touch top"] {
        assert_eq!(sh(&policy, &denied(script)), 0, "{script} was not denied");
    }
    assert!(!work.join("api/y").exists());
}
