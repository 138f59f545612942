//! Image roots ([`lockbox_confine::Spawn::image_root`], issue 29) on the real kernel: the
//! sandbox's `/` is an overlay of read-only layer directories (overlayfs format: whiteouts
//! are 0/0 character devices, opaque directories carry `user.overlay.opaque=y`) with the
//! sandbox's own writable tmpfs on top.
//!
//! The layers are made here: layer 1 is Debian's busybox-static (`/bin/busybox`, from the
//! host) with its applets, `/etc/passwd` and `/etc/group`; layer 2 deletes a file of layer 1
//! and makes a directory of it opaque. Every test also runs as uid 65534 when run as root:
//! the test re-executes itself (this test only) as that user, who then makes its own layers,
//! as a user's unpacked image belongs to that user.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::AS_NOBODY;
use lockbox_confine::{ImageRoot, Spawn, Stdio, Waited};
use lockbox_policy::{Overlay, OverlayUpper, Policy};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A directory of the current user's that uid 65534 (and the sandbox) can enter.
fn scratch() -> lockbox_testkit::sandboxes::Scratch {
    lockbox_testkit::scratch("lockbox-image-test")
}

/// The two layers described in the module doc, under `dir`; top first.
fn layers(dir: &Path) -> Vec<PathBuf> {
    let base = dir.join("layer1");
    for d in ["bin", "etc", "root", "data/old", "usr"] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    lockbox_testkit::oci::busybox_root(
        &base,
        &[
            "sh", "cat", "echo", "id", "ls", "stat", "test", "chown", "touch", "rm", "mkdir",
            "true",
        ],
    );
    std::fs::write(base.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::write(base.join("etc/group"), "root:x:0:\n").unwrap();
    std::fs::write(base.join("etc/gone"), "deleted by layer 2\n").unwrap();
    std::fs::write(base.join("etc/image-file"), "from layer 1\n").unwrap();
    std::fs::write(
        base.join("data/old/lower-only"),
        "hidden by the opaque dir\n",
    )
    .unwrap();
    std::fs::write(base.join("usr/image-usr"), "the image's /usr\n").unwrap();

    let top = dir.join("layer2");
    std::fs::create_dir_all(top.join("etc")).unwrap();
    std::fs::create_dir_all(top.join("data/old")).unwrap();
    let whiteout =
        std::ffi::CString::new(top.join("etc/gone").into_os_string().into_encoded_bytes()).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        whiteout.as_c_str(),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        0,
    )
    .unwrap();
    rustix::fs::setxattr(
        top.join("data/old"),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    std::fs::write(top.join("data/old/upper-only"), "from layer 2\n").unwrap();
    vec![top, base]
}

/// What a sandbox printed and how it ended.
struct Ran {
    code: i32,
    out: String,
}

/// Runs `script` with the image's `/bin/sh` on the image root `layers`, stdout and stderr
/// into a file of `dir`.
fn run(dir: &Path, layers: &[PathBuf], policy: &Policy, script: &str) -> Ran {
    run_as(dir, ImageRoot::new(layers.to_vec()), policy, script)
}

/// [`run`] on `root`.
fn run_as(dir: &Path, root: ImageRoot, policy: &Policy, script: &str) -> Ran {
    let out_path = dir.join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let err = out.try_clone().unwrap();
    let argv = ["/bin/sh".into(), "-c".into(), script.into()];
    let mut running = Spawn::command(policy, &argv)
        .image_root(root)
        .stdio(Stdio {
            stdin: None,
            stdout: Some(out.into()),
            stderr: Some(err.into()),
        })
        .start()
        .unwrap();
    let code = match running.wait(None, None).unwrap() {
        Waited::Exited(o) => o.exit_code(),
        other => panic!("{other:?}"),
    };
    Ran {
        code,
        out: std::fs::read_to_string(&out_path).unwrap(),
    }
}

fn image_policy() -> Policy {
    let mut policy = Policy::default();
    policy.env.set.insert("PATH".into(), "/bin".into());
    policy
}

#[test]
fn busybox_runs_from_the_image_root_and_the_hosts_userland_is_not_there() {
    as_root_and_nobody!(
        "busybox_runs_from_the_image_root_and_the_hosts_userland_is_not_there",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let ran = run(
                dir.path(),
                &layers,
                &image_policy(),
                "echo hello; ls /usr; test -e /usr/bin/env && echo host-usr-visible; cat /etc/image-file",
            );
            assert_eq!(ran.code, 0, "{}", ran.out);
            assert_eq!(ran.out, "hello\nimage-usr\nfrom layer 1\n");
        },
    );
}

#[test]
fn a_whiteout_deletes_and_an_opaque_directory_hides_the_lower_layers() {
    as_root_and_nobody!(
        "a_whiteout_deletes_and_an_opaque_directory_hides_the_lower_layers",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let ran = run(
                dir.path(),
                &layers,
                &image_policy(),
                "test ! -e /etc/gone && echo gone; ls /data/old",
            );
            assert_eq!(ran.code, 0, "{}", ran.out);
            assert_eq!(ran.out, "gone\nupper-only\n");
        },
    );
}

#[test]
fn writes_to_the_image_root_succeed_and_vanish_with_the_sandbox() {
    as_root_and_nobody!(
        "writes_to_the_image_root_succeed_and_vanish_with_the_sandbox",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let script = "test ! -e /etc/foo && echo fresh > /etc/foo && cat /etc/foo && \
                          echo changed > /etc/image-file && rm /etc/passwd && mkdir /app && touch /app/x && ls /app";
            for _ in 0..2 {
                let ran = run(dir.path(), &layers, &image_policy(), script);
                assert_eq!(ran.code, 0, "{}", ran.out);
                assert_eq!(ran.out, "fresh\nx\n");
            }
            // The layers are untouched.
            assert!(!layers[0].join("etc/foo").exists());
            assert!(!layers[1].join("etc/foo").exists());
            assert_eq!(
                std::fs::read_to_string(layers[1].join("etc/image-file")).unwrap(),
                "from layer 1\n"
            );
            assert!(layers[1].join("etc/passwd").exists());
        },
    );
}

#[test]
fn the_caller_is_root_of_the_image_and_chown_succeeds_as_a_no_op() {
    as_root_and_nobody!(
        "the_caller_is_root_of_the_image_and_chown_succeeds_as_a_no_op",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let ran = run(
                dir.path(),
                &layers,
                &image_policy(),
                "id -u; id -g; stat -c %u:%g /etc/passwd; touch /tmp/f && chown 123:456 /tmp/f && \
                 chown 7 /etc/passwd && stat -c %u:%g /tmp/f /etc/passwd",
            );
            assert_eq!(ran.code, 0, "{}", ran.out);
            // The image's files (the caller's on the host) are root's inside; chown says
            // yes and changes nothing: the sandbox has one uid, and it is 0.
            assert_eq!(ran.out, "0\n0\n0:0\n0:0\n0:0\n");
        },
    );
}

#[test]
fn an_images_user_is_presented_as_the_callers_only_ids() {
    as_root_and_nobody!(
        "an_images_user_is_presented_as_the_callers_only_ids",
        || {
            let dir = scratch();
            let mut root = ImageRoot::new(layers(dir.path()));
            root.ids = (1000, 1001);
            let rw = dir.path().join("rw");
            std::fs::create_dir(&rw).unwrap();
            let mut policy = image_policy();
            policy.fs.write.push(rw.clone());
            let script = format!(
            "id -u; id -g; stat -c %u:%g /etc/passwd; chown 0:0 /tmp && echo chown-ok; echo x > {}/f",
            rw.display()
        );
            let ran = run_as(dir.path(), root, &policy, &script);
            assert_eq!(ran.code, 0, "{}", ran.out);
            assert_eq!(ran.out, "1000\n1001\n1000:1001\nchown-ok\n");
            let made = std::fs::metadata(rw.join("f")).unwrap();
            assert_eq!(made.uid(), rustix::process::getuid().as_raw());
        },
    );
}

#[test]
fn grants_are_mounted_into_the_image_root_and_read_only_ones_stay_read_only() {
    as_root_and_nobody!(
        "grants_are_mounted_into_the_image_root_and_read_only_ones_stay_read_only",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let (ro, rw) = (dir.path().join("ro"), dir.path().join("rw"));
            std::fs::create_dir(&ro).unwrap();
            std::fs::create_dir(&rw).unwrap();
            std::fs::write(ro.join("in"), "input\n").unwrap();
            let mut policy = image_policy();
            policy.fs.read.push(ro.clone());
            policy.fs.write.push(rw.clone());
            let script = format!(
                "cat {ro}/in; echo x > {ro}/new || echo read-only; echo out > {rw}/made && echo written",
                ro = ro.display(),
                rw = rw.display()
            );
            let ran = run(dir.path(), &layers, &policy, &script);
            assert_eq!(ran.code, 0, "{}", ran.out);
            assert!(ran.out.starts_with("input\n"), "{}", ran.out);
            assert!(ran.out.contains("read-only\n"), "{}", ran.out);
            assert!(ran.out.ends_with("written\n"), "{}", ran.out);
            assert!(!ro.join("new").exists());
            // Written as uid 0 inside, owned by the caller on the host.
            let made = std::fs::metadata(rw.join("made")).unwrap();
            assert_eq!(made.uid(), rustix::process::getuid().as_raw());
            assert_eq!(made.gid(), rustix::process::getgid().as_raw());
        },
    );
}

#[test]
fn lockbox_provides_dev_proc_tmp_and_its_etc_files_in_the_image_root() {
    as_root_and_nobody!(
        "lockbox_provides_dev_proc_tmp_and_its_etc_files_in_the_image_root",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let mut policy = image_policy();
            policy.hostname = "imagebox".into();
            let ran = run(
                dir.path(),
                &layers,
                &policy,
                "cat /etc/hostname; test -c /dev/null && echo dev; test -e /proc/self/status && echo proc; \
                 echo t > /tmp/t && echo tmp; busybox grep -q imagebox /etc/hosts && echo hosts; \
                 echo x 2>/dev/null > /etc/hostname || echo etc-files-read-only; \
                 busybox grep -q ' /proc/sys ro,' /proc/self/mountinfo && echo proc-sys-read-only; \
                 echo 500 2>/dev/null > /proc/self/oom_score_adj || echo proc-read-only; \
                 exec 3> /tmp/fd3; echo via-proc-fd > /proc/self/fd/3; cat /tmp/fd3",
            );
            assert_eq!(ran.code, 0, "{}", ran.out);
            assert_eq!(
                ran.out,
                "imagebox\ndev\nproc\ntmp\nhosts\netc-files-read-only\nproc-sys-read-only\n\
                 proc-read-only\nvia-proc-fd\n"
            );
        },
    );
}

#[test]
fn the_command_can_start_in_a_directory_of_the_image() {
    as_root_and_nobody!("the_command_can_start_in_a_directory_of_the_image", || {
        let dir = scratch();
        let layers = layers(dir.path());
        let mut policy = image_policy();
        policy.cwd = Some("/root".into());
        let ran = run(dir.path(), &layers, &policy, "busybox pwd");
        assert_eq!(ran.code, 0, "{}", ran.out);
        assert_eq!(ran.out, "/root\n");
    });
}

#[test]
fn a_copy_on_write_workdir_works_inside_an_image_root() {
    as_root_and_nobody!("a_copy_on_write_workdir_works_inside_an_image_root", || {
        let dir = scratch();
        let layers = layers(dir.path());
        let work = dir.path().join("project");
        let branch = dir.path().join("branch");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(branch.join("upper")).unwrap();
        std::fs::create_dir_all(branch.join("work")).unwrap();
        std::fs::write(work.join("keep"), "original\n").unwrap();
        std::fs::create_dir(work.join("sub")).unwrap();
        std::fs::write(work.join("sub/file"), "in sub\n").unwrap();
        let mut policy = image_policy();
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
        policy.cwd = Some(work.clone());
        let ran = run(
            dir.path(),
            &layers,
            &policy,
            "cat keep; echo new > keep; echo made > added; busybox mv sub moved && cat moved/file; busybox pwd",
        );
        assert_eq!(ran.code, 0, "{}", ran.out);
        assert_eq!(ran.out, format!("original\nin sub\n{}\n", work.display()));
        assert!(work.join("sub/file").exists());
        assert_eq!(
            std::fs::read_to_string(work.join("keep")).unwrap(),
            "original\n"
        );
        assert_eq!(
            std::fs::read_to_string(branch.join("upper/added")).unwrap(),
            "made\n"
        );
    });
}

#[test]
fn a_bounded_workdir_layer_is_handed_over_from_an_image_root() {
    as_root_and_nobody!(
        "a_bounded_workdir_layer_is_handed_over_from_an_image_root",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let work = dir.path().join("project");
            let branch = dir.path().join("branch");
            std::fs::create_dir_all(&work).unwrap();
            std::fs::create_dir_all(branch.join("upper")).unwrap();
            std::fs::create_dir_all(branch.join("work")).unwrap();
            let mut policy = image_policy();
            policy.mount_copy_on_write(
                &work,
                &[],
                branch.join("upper"),
                branch.join("work"),
                Some(lockbox_policy::ByteSize(1 << 20)),
            );
            let argv = ["/bin/sh".into(), "-c".into(), "echo made > added".into()];
            let mut running = Spawn::command(&policy, &argv)
                .image_root(ImageRoot::new(layers))
                .start()
                .unwrap();
            let outcome = match running.wait(None, None).unwrap() {
                Waited::Exited(o) => o,
                other => panic!("{other:?}"),
            };
            assert_eq!(outcome.exit_code(), 0);
            let upper = outcome.upper_mounts[0].upper();
            assert_eq!(
                std::fs::read_to_string(upper.join("added")).unwrap(),
                "made\n"
            );
        },
    );
}

#[test]
fn a_missing_layer_is_an_error_naming_it() {
    let dir = scratch();
    let mut layers = layers(dir.path());
    layers.push(dir.path().join("no-such-layer"));
    let argv = ["/bin/true".into()];
    let err = Spawn::command(&image_policy(), &argv)
        .image_root(ImageRoot::new(layers))
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("no-such-layer"), "{err}");
}

#[test]
fn too_many_layers_are_refused_before_the_sandbox_starts() {
    let dir = scratch();
    let layers = vec![dir.path().to_owned(); lockbox_confine::MAX_IMAGE_LAYERS + 1];
    let argv = ["/bin/true".into()];
    let err = Spawn::command(&image_policy(), &argv)
        .image_root(ImageRoot::new(layers))
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("layers"), "{err}");
}

#[test]
fn an_image_reference_without_its_layers_is_refused() {
    let mut policy = image_policy();
    policy.image = Some("docker.io/library/busybox:1".into());
    let argv = ["/bin/true".into()];
    let err = Spawn::command(&policy, &argv).start().unwrap_err();
    assert!(err.to_string().contains("image"), "{err}");
}

#[test]
fn the_commands_of_a_sequence_share_the_image_roots_writes_and_get_fresh_scratch() {
    as_root_and_nobody!(
        "the_commands_of_a_sequence_share_the_image_roots_writes_and_get_fresh_scratch",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let commands: Vec<Vec<std::ffi::OsString>> = [
                "echo one > /etc/foo; echo t > /tmp/t",
                "cat /etc/foo; test ! -e /tmp/t && echo fresh-tmp",
            ]
            .iter()
            .map(|s| vec!["/bin/sh".into(), "-c".into(), (*s).into()])
            .collect();
            let out_path = dir.path().join("out");
            let out = std::fs::File::create(&out_path).unwrap();
            let stdout = || Stdio {
                stdin: None,
                stdout: Some(out.try_clone().unwrap().into()),
                stderr: None,
            };
            let policy = image_policy();
            let mut gated = Spawn::sequence(&policy, &commands)
                .image_root(ImageRoot::new(layers))
                .gated()
                .unwrap();
            for step in 0..2 {
                let mut running = gated.release(stdout()).unwrap();
                match running.wait(None, None).unwrap() {
                    Waited::Exited(o) => assert_eq!(o.exit_code(), 0, "command {step}"),
                    other => panic!("{other:?}"),
                }
                match running.next() {
                    Some(next) => gated = next,
                    None => break,
                }
            }
            assert_eq!(
                std::fs::read_to_string(&out_path).unwrap(),
                "one\nfresh-tmp\n"
            );
        },
    );
}

#[test]
fn writes_kept_on_the_host_are_the_next_layer_of_the_image() {
    as_root_and_nobody!(
        "writes_kept_on_the_host_are_the_next_layer_of_the_image",
        || {
            let dir = scratch();
            let mut layers = layers(dir.path());
            let step = dir.path().join("step");
            std::fs::create_dir_all(step.join("upper")).unwrap();
            std::fs::create_dir_all(step.join("work")).unwrap();
            let mut root = ImageRoot::new(layers.clone());
            root.upper = Some(lockbox_confine::RootUpper {
                upper: step.join("upper"),
                work: step.join("work"),
            });
            // What a Dockerfile's RUN does: add, change, delete, replace a directory.
            let script = "mkdir /app && echo built > /app/out && rm /etc/image-file && \
                      busybox rm -r /data/old && mkdir /data/old && echo new > /data/old/only";
            let ran = run_as(dir.path(), root, &image_policy(), script);
            assert_eq!(ran.code, 0, "{}", ran.out);
            let upper = step.join("upper");
            assert_eq!(
                std::fs::read_to_string(upper.join("app/out")).unwrap(),
                "built\n"
            );
            // The next layer, on top of the others: the step's writes, deletions included.
            layers.insert(0, upper);
            let ran = run(
                dir.path(),
                &layers,
                &image_policy(),
                "cat /app/out; test ! -e /etc/image-file && echo deleted; ls /data/old",
            );
            assert_eq!(ran.code, 0, "{}", ran.out);
            assert_eq!(ran.out, "built\ndeleted\nonly\n");
        },
    );
}

#[test]
fn explain_shows_how_an_image_root_is_built() {
    let dir = scratch();
    let layers = layers(dir.path());
    let mut policy = image_policy();
    policy.fs.read.push(dir.path().to_owned());
    let plan = lockbox_confine::explain_image(&policy, &ImageRoot::new(layers)).unwrap();
    let text = plan.to_string();
    println!("{text}");
    for expected in [
        "mount overlay on /.lockbox-root (lowerdir=.i/0:.i/1,upperdir=.lockbox-root-upper/upper,workdir=.lockbox-root-upper/work,userxattr)",
        "keep a copy of the mounts at /proc as source #",
        "enter the image root at /.lockbox-root",
        "landlock: ImageRoot beneath /",
    ] {
        assert!(text.contains(expected), "{expected}:\n{text}");
    }
    assert!(!text.contains("/usr"), "{text}");
}

#[test]
fn setuid_modes_work_in_a_private_image_root_and_are_refused_when_a_host_dir_is_writable() {
    as_root_and_nobody!(
        "setuid_modes_work_in_a_private_image_root_and_are_refused_when_a_host_dir_is_writable",
        || {
            let dir = scratch();
            let layers = layers(dir.path());
            let script = "echo x > /etc/tool && busybox chmod 4755 /etc/tool && busybox chmod g+s /etc/tool && \
                          stat -c %a /etc/tool";
            // Nothing the sandbox writes reaches the host: the bits are harmless there (every
            // mount nosuid, no_new_privs) and dpkg sets them.
            let ran = run(dir.path(), &layers, &image_policy(), script);
            assert_eq!(ran.code, 0, "{}", ran.out);
            assert_eq!(ran.out, "6755\n");
            // A writable grant could carry a setuid file of the caller's to the host: both
            // bits are refused, in the grant and in the image root alike.
            let rw = dir.path().join("rw");
            std::fs::create_dir(&rw).unwrap();
            let mut policy = image_policy();
            policy.fs.write.push(rw.clone());
            let script = format!(
                "echo x > {rw}/tool; busybox chmod u+s {rw}/tool 2>/dev/null || echo grant-refused; \
                 echo x > /etc/tool; busybox chmod g+s /etc/tool 2>/dev/null || echo root-refused",
                rw = rw.display()
            );
            let ran = run(dir.path(), &layers, &policy, &script);
            assert_eq!(ran.code, 0, "{}", ran.out);
            assert_eq!(ran.out, "grant-refused\nroot-refused\n");
            let mode = std::fs::metadata(rw.join("tool")).unwrap().mode();
            assert_eq!(mode & 0o6000, 0, "{mode:o}");
        },
    );
}

// ---- Package managers in a Debian image (issue 29: apt-get, pip and npm install) ----
//
// A Debian bookworm minbase root file system made by mmdebstrap (from Debian's package
// mirror: the only network these tests use) is one layer; the packages installed come from
// a local apt repository, a wheel directory and an npm tarball the tests make, granted
// read-only. The root file system is made once, as a tarball kept in the target directory
// (keyed by what it includes; a later run reuses it), and unpacked once per uid next to it
// with the unpacker's ownership, as an image store unpacks a layer.

/// Set to `1` to run the tests that need the heaviest image (npm: Debian's `npm` pulls in
/// some 400 packages, about 450 MB).
const HEAVY: &str = "LOCKBOX_TEST_HEAVY";

/// What the base image includes besides minbase: pip for the pip test (apt needs nothing).
const WITH_PIP: &str = "python3-pip";
/// What the npm test's image includes.
const WITH_NPM: &str = "npm";

/// Serialises the making of one image by this process's tests.
static IMAGE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The tarball of a bookworm minbase with `include`, made by mmdebstrap if it is not there
/// yet (by the root process: uid 65534 finds the one root made before re-executing it).
/// `scripts/test.sh` makes the `python3-pip` one ahead, while Rust builds, with the same
/// command: keep the two alike.
fn debian_tar(include: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("lockbox-debian");
    let tar = dir.join(format!("bookworm-minbase-{include}.tar"));
    let _made_once = IMAGE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if std::env::var_os(AS_NOBODY).is_some() {
        assert!(
            tar.exists(),
            "{} is missing: the root process makes it before running this test as uid 65534",
            tar.display()
        );
        return tar;
    }
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Where each uid unpacks its own copy ([`debian_layer`]): writable by all, sticky.
    let layers = dir.join("layers");
    std::fs::create_dir_all(&layers).unwrap();
    std::fs::set_permissions(&layers, std::fs::Permissions::from_mode(0o1777)).unwrap();
    if tar.exists() {
        return tar;
    }
    let partial = dir.join(format!(".{include}.{}.tar", std::process::id()));
    // As root, mmdebstrap's root mode; as a user, its unshare mode (which needs a
    // subordinate id range in /etc/subuid).
    let mode = if rustix::process::getuid().is_root() {
        "--mode=root"
    } else {
        "--mode=unshare"
    };
    let started = std::time::Instant::now();
    let out = std::process::Command::new("mmdebstrap")
        .args(["--quiet", "--variant=minbase", mode, "--format=tar"])
        .arg(format!("--include={include}"))
        .args(["bookworm"])
        .arg(&partial)
        .output()
        .expect("mmdebstrap (Debian's mmdebstrap package; scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "mmdebstrap (it needs Debian's package mirror) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("made {} in {:.0?}", tar.display(), started.elapsed());
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&partial, &tar).unwrap();
    tar
}

/// The image layer of [`debian_tar`]`(include)`, unpacked by the current user (so its
/// files are the caller's, set-id bits dropped) once per uid; device nodes are left out
/// (lockbox provides `/dev`).
fn debian_layer(include: &str) -> PathBuf {
    let tar = debian_tar(include);
    let uid = rustix::process::getuid().as_raw();
    let dir = tar.parent().unwrap().join("layers");
    let layer = dir.join(format!(
        "{}.uid{uid}",
        tar.file_stem().unwrap().to_str().unwrap()
    ));
    let _unpacked_once = IMAGE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if layer.exists() {
        return layer;
    }
    let started = std::time::Instant::now();
    let partial = tempfile::Builder::new()
        .prefix(".unpacking")
        .tempdir_in(&dir)
        .unwrap();
    let out = std::process::Command::new("tar")
        .args([
            "--extract",
            "--no-same-owner",
            "--no-same-permissions",
            "--exclude=./dev/*",
        ])
        .arg("--file")
        .arg(&tar)
        .arg("--directory")
        .arg(partial.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "unpacking {}: {}",
        tar.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(partial.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Another process (a test run as uid 65534 at the same time) may have won.
    if std::fs::rename(partial.path(), &layer).is_ok() {
        let _ = partial.keep();
    }
    eprintln!(
        "uid {uid}: unpacked {} in {:.1?}",
        layer.display(),
        started.elapsed()
    );
    layer
}

/// A policy for a Debian image: its PATH, a HOME, no questions asked.
fn debian_policy() -> Policy {
    let mut policy = Policy::default();
    let env = &mut policy.env.set;
    env.insert(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    env.insert("HOME".into(), "/root".into());
    env.insert("DEBIAN_FRONTEND".into(), "noninteractive".into());
    policy
}

/// Runs `script` in the image whose one layer is `layer`, in `dir`, timed.
fn run_in_debian(dir: &Path, layer: &Path, policy: &Policy, script: &str) -> Ran {
    let started = std::time::Instant::now();
    let ran = run_as(dir, ImageRoot::new(vec![layer.to_owned()]), policy, script);
    eprintln!(
        "uid {}: sandbox ran in {:.1?}",
        rustix::process::getuid().as_raw(),
        started.elapsed()
    );
    ran
}

/// Runs `cmd` on the host, which must succeed.
fn host(cmd: &mut std::process::Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds `name`'s .deb into `repo` from `files` (path, mode, content).
fn build_deb(dir: &Path, repo: &Path, name: &str, files: &[(&str, u32, &str)]) {
    let tree = dir.join(format!("deb-{name}"));
    std::fs::create_dir_all(tree.join("DEBIAN")).unwrap();
    std::fs::write(
        tree.join("DEBIAN/control"),
        format!(
            "Package: {name}\nVersion: 1.0\nArchitecture: all\n\
             Maintainer: lockbox tests <tests@lockbox.invalid>\n\
             Description: made by lockbox's image tests\n"
        ),
    )
    .unwrap();
    for (path, mode, content) in files {
        let file = tree.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, content).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    host(
        std::process::Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "--build"])
            .arg(&tree)
            .arg(repo.join(format!("{name}_1.0_all.deb"))),
    );
}

/// A flat apt repository in `repo` of its .debs: `Packages` written from each package's
/// control fields, its size and SHA-256.
fn write_packages_index(repo: &Path) {
    let mut index = String::new();
    let mut debs: Vec<PathBuf> = std::fs::read_dir(repo)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    debs.sort();
    for deb in debs {
        let control = std::process::Command::new("dpkg-deb")
            .arg("--field")
            .arg(&deb)
            .output()
            .unwrap();
        assert!(control.status.success());
        let sum = std::process::Command::new("sha256sum")
            .arg(&deb)
            .output()
            .unwrap();
        let sum = String::from_utf8(sum.stdout).unwrap();
        index.push_str(&String::from_utf8(control.stdout).unwrap());
        index.push_str(&format!(
            "Filename: ./{}\nSize: {}\nSHA256: {}\n\n",
            deb.file_name().unwrap().to_str().unwrap(),
            std::fs::metadata(&deb).unwrap().len(),
            sum.split_whitespace().next().unwrap()
        ));
    }
    std::fs::write(repo.join("Packages"), index).unwrap();
}

#[test]
fn apt_get_installs_from_a_local_repository_in_an_unmodified_debian_image() {
    as_root_and_nobody!(
        "apt_get_installs_from_a_local_repository_in_an_unmodified_debian_image",
        || {
            let layer = debian_layer(WITH_PIP);
            let dir = scratch();
            let repo = dir.path().join("repo");
            std::fs::create_dir(&repo).unwrap();
            build_deb(
                dir.path(),
                &repo,
                "hello-lockbox",
                &[(
                    "usr/share/hello-lockbox/hello.txt",
                    0o644,
                    "hello from a local apt repository\n",
                )],
            );
            // A setuid and a setgid program, as `passwd` and `util-linux` ship.
            build_deb(
                dir.path(),
                &repo,
                "setid-lockbox",
                &[
                    ("usr/bin/setuid-lockbox", 0o4755, "#!/bin/sh\necho setuid\n"),
                    ("usr/bin/setgid-lockbox", 0o2755, "#!/bin/sh\necho setgid\n"),
                ],
            );
            write_packages_index(&repo);
            // Unmodified: lockbox's apt.conf.d file turns off apt's drop to `_apt`, which
            // fails with "Could not switch group" where the set*id calls are no-ops.
            let mut policy = debian_policy();
            policy.fs.read.push(repo.clone());
            let script = format!(
                "echo 'deb [trusted=yes] file:{repo} ./' > /etc/apt/sources.list && \
                 rm -f /etc/apt/sources.list.d/* && \
                 apt-get update -q && apt-get install -y -q hello-lockbox setid-lockbox && \
                 echo ---- && cat /usr/share/hello-lockbox/hello.txt && \
                 stat -c '%a %u:%g' /usr/bin/setuid-lockbox /usr/bin/setgid-lockbox && \
                 dpkg-query -W -f '${{Package}} ${{Status}}\\n' hello-lockbox setid-lockbox && \
                 apt-config dump | grep '^APT::Sandbox::User'",
                repo = repo.display()
            );
            let ran = run_in_debian(dir.path(), &layer, &policy, &script);
            assert_eq!(ran.code, 0, "{}", ran.out);
            let after = ran.out.split("----\n").nth(1).unwrap_or_default();
            assert_eq!(
                after,
                "hello from a local apt repository\n4755 0:0\n2755 0:0\n\
                 hello-lockbox install ok installed\nsetid-lockbox install ok installed\n\
                 APT::Sandbox::User \"root\";\n",
                "{}",
                ran.out
            );
        },
    );
}

/// Writes a pure-Python wheel of module `lockbox_hello` (version 1.0) into `wheels`, with
/// the host's python3 (zipfile and hashlib: a wheel is a zip with METADATA, WHEEL and a
/// RECORD of every file's hash).
fn build_wheel(wheels: &Path) {
    const WRITE_WHEEL: &str = r#"
import base64, hashlib, sys, zipfile
files = {
    "lockbox_hello/__init__.py": "GREETING = 'hello from a local wheel'\n",
    "lockbox_hello-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: lockbox-hello\nVersion: 1.0\n",
    "lockbox_hello-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: lockbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, text in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(text.encode())}")
record.append("lockbox_hello-1.0.dist-info/RECORD,,")
files["lockbox_hello-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(sys.argv[1] + "/lockbox_hello-1.0-py3-none-any.whl", "w") as whl:
    for name, text in files.items():
        whl.writestr(name, text)
"#;
    host(
        std::process::Command::new("/usr/bin/python3")
            .args(["-c", WRITE_WHEEL])
            .arg(wheels),
    );
}

#[test]
fn pip_installs_a_local_wheel_in_a_debian_image() {
    as_root_and_nobody!("pip_installs_a_local_wheel_in_a_debian_image", || {
        let layer = debian_layer(WITH_PIP);
        let dir = scratch();
        let wheels = dir.path().join("wheels");
        std::fs::create_dir(&wheels).unwrap();
        build_wheel(&wheels);
        let mut policy = debian_policy();
        policy.fs.read.push(wheels.clone());
        // Debian marks its python "externally managed" (PEP 668): an image's root installs
        // system-wide only when told to, as in Docker.
        let script = format!(
            "pip install --no-index --find-links {wheels} --break-system-packages lockbox-hello && \
             echo ---- && python3 -c 'import lockbox_hello; print(lockbox_hello.GREETING)' && \
             pip show lockbox-hello | grep ^Version",
            wheels = wheels.display()
        );
        let ran = run_in_debian(dir.path(), &layer, &policy, &script);
        assert_eq!(ran.code, 0, "{}", ran.out);
        let after = ran.out.split("----\n").nth(1).unwrap_or_default();
        assert_eq!(
            after, "hello from a local wheel\nVersion: 1.0\n",
            "{}",
            ran.out
        );
    });
}

/// Writes `lockbox-hello-1.0.0.tgz` into `dir` as `npm pack` makes it (a gzipped tar of
/// `package/`), with a `bin` command.
fn build_npm_tarball(dir: &Path) -> PathBuf {
    let package = dir.join("npm/package");
    std::fs::create_dir_all(package.join("bin")).unwrap();
    std::fs::write(
        package.join("package.json"),
        r#"{"name": "lockbox-hello", "version": "1.0.0", "bin": {"lockbox-hello": "bin/hello.js"}}"#,
    )
    .unwrap();
    std::fs::write(
        package.join("bin/hello.js"),
        "#!/usr/bin/env node\nconsole.log('hello from a local npm tarball');\n",
    )
    .unwrap();
    std::fs::set_permissions(
        package.join("bin/hello.js"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let tarball = dir.join("npm/lockbox-hello-1.0.0.tgz");
    host(
        std::process::Command::new("tar")
            .arg("-czf")
            .arg(&tarball)
            .arg("-C")
            .arg(dir.join("npm"))
            .arg("package"),
    );
    tarball
}

#[test]
fn npm_installs_a_local_tarball_globally_in_a_debian_image() {
    if std::env::var(HEAVY).as_deref() != Ok("1") {
        eprintln!(
            "SKIP npm_installs_a_local_tarball_globally_in_a_debian_image: set {HEAVY}=1 \
             (its image is about 450 MB)"
        );
        return;
    }
    as_root_and_nobody!(
        "npm_installs_a_local_tarball_globally_in_a_debian_image",
        || {
            let layer = debian_layer(WITH_NPM);
            let dir = scratch();
            let tarball = build_npm_tarball(dir.path());
            let mut policy = debian_policy();
            policy.fs.read.push(tarball.clone());
            let script = format!(
                "npm install -g --offline --no-audit --no-fund {tarball} && echo ---- && \
             lockbox-hello && test -d /usr/local/lib/node_modules/lockbox-hello && echo global",
                tarball = tarball.display()
            );
            let ran = run_in_debian(dir.path(), &layer, &policy, &script);
            assert_eq!(ran.code, 0, "{}", ran.out);
            let after = ran.out.split("----\n").nth(1).unwrap_or_default();
            assert_eq!(
                after, "hello from a local npm tarball\nglobal\n",
                "{}",
                ran.out
            );
        },
    );
}
