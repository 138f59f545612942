//! lockbox-image's integration tests: real tar streams, a real overlay mount in a user
//! namespace, a real `docker-registry` on loopback. Every test also runs as uid 65534
//! (`all_again_as_uid_65534`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod archive;
mod common;
mod local;
mod push;
mod registry;
mod unpack;

/// Re-runs every test of this binary as uid/gid 65534 (when we are root): nothing needs
/// privilege.
#[test]
fn all_again_as_uid_65534() {
    if std::env::var_os("LOCKBOX_IMAGE_AS_NOBODY").is_some() {
        return;
    }
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIP: not root, so this whole run is already unprivileged");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let st = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
        ])
        .arg(&exe)
        .args(["--test-threads", "4", "--skip", "all_again_as_uid_65534"])
        .env("LOCKBOX_IMAGE_AS_NOBODY", "1")
        .env("TMPDIR", "/tmp")
        .env("HOME", "/tmp")
        .status()
        .unwrap();
    assert!(st.success(), "tests failed as uid 65534: {st}");
}
