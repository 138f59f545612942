//! `lockbox image` end to end: pull from an OCI layout made here (a busybox layer from
//! busybox-static), ls, inspect, rm (refused while held, exit 5), prune; with --json; as the
//! current user and (as root) as uid 65534. Registry pulls are tested in lockbox-image.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{give, lockbox, scratch, text, users};
use lockbox_testkit::oci;
use serde_json::Value;
use std::path::Path;

/// An OCI layout at `dir`, tag `v1`: one uncompressed layer (busybox, a symlink, a setuid
/// file); returns the image id.
fn layout(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let root = dir.join("rootfs");
    oci::busybox_root(&root, &["sh"]);
    std::fs::write(root.join("bin/su"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(root.join("bin/su"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    oci::layout(
        dir,
        &root,
        serde_json::json!({"Env": ["PATH=/bin"], "Cmd": ["sh"], "WorkingDir": "/"}),
        "v1",
    )
}

fn json_of(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", text(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

#[test]
fn pull_ls_inspect_rm_and_prune_an_oci_layout_image() {
    for user in users() {
        let work = scratch();
        let id = layout(&work.path().join("lay"));
        give(work.path(), user);
        let state = work.path().join("state");
        let st = state.to_str().unwrap();
        let src = format!("oci:{}:v1", work.path().join("lay").display());
        let w = work.path();

        let pulled = json_of(&lockbox(
            user,
            w,
            &["image", "pull", &src, "--json", "--state-dir", st],
        ));
        assert_eq!(pulled["id"], id.as_str(), "{user:?}");
        assert_eq!(pulled["config"]["cmd"], serde_json::json!(["sh"]));
        let layer = pulled["layers"][0].as_str().unwrap().to_owned();
        assert!(Path::new(&layer).join("bin/busybox").exists());

        let ls = json_of(&lockbox(
            user,
            w,
            &["image", "ls", "--json", "--state-dir", st],
        ));
        assert_eq!(ls["images"][0]["id"], id.as_str());
        assert_eq!(ls["images"][0]["references"][0], src.as_str());
        let out = lockbox(user, w, &["image", "ls", "--state-dir", st]);
        assert!(text(&out).contains(&id[7..19]), "{}", text(&out));

        let out = lockbox(
            user,
            w,
            &["image", "inspect", &id[7..19], "--state-dir", st],
        );
        assert!(out.status.success(), "{}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains("setuid/setgid stripped: ./bin/su")
                || shown.contains("setuid/setgid stripped: bin/su"),
            "{shown}"
        );
        assert!(shown.contains("cmd         [\"sh\"]"), "{shown}");

        // Held (a hold file, as a sandbox of the lead's makes): rm refuses with exit 5.
        let hold = state.join("images/holds").join(&id[7..]);
        std::fs::create_dir_all(&hold).unwrap();
        std::fs::write(hold.join("sandbox-42"), "{}").unwrap();
        give(&state, user);
        let out = lockbox(user, w, &["image", "rm", &src, "--state-dir", st]);
        assert_eq!(out.status.code(), Some(5), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("in use by sandbox-42"),
            "{}",
            text(&out)
        );
        std::fs::remove_dir_all(&hold).unwrap();

        let removed = json_of(&lockbox(
            user,
            w,
            &["image", "rm", &src, "--json", "--state-dir", st],
        ));
        assert_eq!(removed["image_deleted"], true);
        assert!(!Path::new(&layer).exists());
        let out = lockbox(user, w, &["image", "rm", &src, "--state-dir", st]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no image"),
            "{}",
            text(&out)
        );

        let pruned = json_of(&lockbox(
            user,
            w,
            &["image", "prune", "--all", "--json", "--state-dir", st],
        ));
        assert_eq!(pruned["images_removed"], serde_json::json!([]));

        // A store bound: the least recently used image nothing holds goes.
        json_of(&lockbox(
            user,
            w,
            &["image", "pull", &src, "--json", "--state-dir", st],
        ));
        let pruned = json_of(&lockbox(
            user,
            w,
            &[
                "image",
                "prune",
                "--max-store",
                "0",
                "--json",
                "--state-dir",
                st,
            ],
        ));
        assert_eq!(pruned["images_removed"], serde_json::json!([id.as_str()]));
    }
}

#[test]
fn bad_references_and_platforms_are_usage_errors() {
    let work = scratch();
    let st = work.path().join("state");
    let st = st.to_str().unwrap();
    for args in [
        &["image", "pull", "UPPER/case", "--state-dir", st][..],
        &[
            "image",
            "pull",
            "busybox",
            "--platform",
            "linux",
            "--state-dir",
            st,
        ][..],
        &["image", "pull", "oci:", "--state-dir", st][..],
    ] {
        let out = lockbox(common::User::Current, work.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).starts_with("lockbox: "),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn run_image_uses_the_images_userland_config_and_store() {
    for user in users() {
        let work = scratch();
        let id = layout(&work.path().join("lay"));
        std::fs::create_dir_all(work.path().join("proj")).unwrap();
        give(work.path(), user);
        let state = work.path().join("state");
        let st = state.to_str().unwrap();
        let src = format!("oci:{}:v1", work.path().join("lay").display());
        let w = work.path();
        // `lockbox run` on the image, with this state directory, and `rest`.
        let on_image = |rest: &[&str]| {
            let mut args = vec!["run", "--image", &src, "--state-dir", st];
            args.extend_from_slice(rest);
            lockbox(user, w, &args)
        };

        // Not in the store and --pull never: the set-up fails (125) and says how to pull.
        let out = on_image(&["--pull", "never", "--", "true"]);
        assert_eq!(out.status.code(), Some(125), "{user:?} {}", text(&out));
        assert!(text(&out).contains("lockbox image pull"), "{}", text(&out));

        // Pulled on first use (--pull missing); the image's PATH and WorkingDir, uid 0
        // inside, nothing of the host's userland.
        let script = "echo path=$PATH; echo cwd=$(pwd); echo uid=$(busybox id -u); \
                      test -e /usr/bin || echo no-host-usr; echo hi > /etc/scratch && echo wrote";
        let out = on_image(&["--", "sh", "-c", script]);
        assert!(out.status.success(), "{user:?} {}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        for line in ["path=/bin", "cwd=/", "uid=0", "no-host-usr", "wrote"] {
            assert!(shown.contains(line), "{user:?} {line}: {shown}");
        }
        // The write to the image's /etc went to the sandbox's own layer.
        let image = json_of(&lockbox(
            user,
            w,
            &["image", "inspect", &id, "--json", "--state-dir", st],
        ));
        let layer = Path::new(image["layers"][0].as_str().unwrap());
        assert!(!layer.join("etc/scratch").exists());
        // The run's hold ended with it: the image can be removed.
        assert!(image["holders"].as_array().unwrap().is_empty(), "{image}");

        // A --workdir is mounted into the image at its own path, is the default cwd, and is
        // committed on success.
        let proj = w.join("proj");
        let out = on_image(&[
            "--workdir",
            proj.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo made > made.txt",
        ]);
        assert!(out.status.success(), "{user:?} {}", text(&out));
        assert_eq!(
            std::fs::read_to_string(proj.join("made.txt")).unwrap(),
            "made\n"
        );

        // No command: the image's Cmd (sh, reading an empty stdin) runs.
        let out = on_image(&[]);
        assert!(out.status.success(), "{user:?} {}", text(&out));

        // check --explain shows the image root's steps, from the store.
        let out = lockbox(
            user,
            w,
            &["check", "--explain", "--image", &src, "--state-dir", st],
        );
        assert!(
            text(&out).contains("enter the image root"),
            "{}",
            text(&out)
        );

        let out = lockbox(user, w, &["image", "rm", &id, "--state-dir", st]);
        assert!(out.status.success(), "{user:?} {}", text(&out));
    }
}

#[test]
fn run_without_a_command_or_an_image_is_a_usage_error() {
    let work = scratch();
    let out = lockbox(users()[0], work.path(), &["run"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no command"), "{}", text(&out));
}

#[test]
fn transaction_stages_run_on_an_image_and_commit_to_the_workdir() {
    for user in users() {
        let work = scratch();
        let id = layout(&work.path().join("lay"));
        let proj = work.path().join("proj");
        std::fs::create_dir_all(&proj).unwrap();
        give(work.path(), user);
        let state = work.path().join("state");
        let st = state.to_str().unwrap();
        let pj = proj.to_str().unwrap();
        let src = format!("oci:{}:v1", work.path().join("lay").display());
        let w = work.path();
        // `lockbox pipeline` or `gather` on the project, with this state directory, and `rest`.
        let txn = |kind: &str, rest: &[&str]| {
            let mut args = vec![kind, "--workdir", pj, "--state-dir", st];
            args.extend_from_slice(rest);
            lockbox(user, w, &args)
        };

        // Not in the store and --pull never: the stage's image is named, nothing ran.
        let out = txn(
            "pipeline",
            &["--image", &src, "--pull", "never", "--stage", "echo x > x"],
        );
        assert_eq!(out.status.code(), Some(2), "{user:?} {}", text(&out));
        assert!(
            text(&out).contains("stage 1") && text(&out).contains(&src),
            "{}",
            text(&out)
        );
        assert!(!proj.join("x").exists());

        // Every stage on the image (pulled on first use): its PATH, nothing of the host's
        // userland, the workdir at its own path and the stages' cwd; both commit.
        let out = txn(
            "pipeline",
            &[
                "--image",
                &src,
                "--stage",
                "echo $PATH > path; test -e /usr/bin || echo no-host-usr > host; pwd",
                "--stage",
                "busybox cat path host > seen; busybox cat",
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        let read = |name: &str| std::fs::read_to_string(proj.join(name)).unwrap();
        assert_eq!(read("seen"), "/bin\nno-host-usr\n", "{user:?}");

        // A gather mixing a source on the image (its --stage-opts) with one on the host.
        let image_opts = format!("img:--image {src}");
        let out = txn(
            "gather",
            &[
                "--source",
                "img=test -e /usr/bin || echo image > img.txt",
                "--source",
                "host=test -e /usr/bin && echo host > host.txt",
                "--stage-opts",
                &image_opts,
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        assert_eq!(read("img.txt"), "image\n");
        assert_eq!(read("host.txt"), "host\n");

        // The transactions' holds ended with them: the image can be removed.
        let out = lockbox(user, w, &["image", "rm", &id, "--state-dir", st]);
        assert!(out.status.success(), "{user:?} {}", text(&out));
    }
}
