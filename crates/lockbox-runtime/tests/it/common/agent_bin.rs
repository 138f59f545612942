//! The `lockbox-agent` executable (crate `lockbox-agent`) for the runtime's tests and
//! benchmarks. Cargo gives a package's tests only its own binaries
//! (`CARGO_BIN_EXE_*`), and the agent's binary lives in its own crate, so it is built here
//! with a nested `cargo build` into the same target directory and profile as the calling
//! test (a no-op when it is fresh; cargo holds no lock while tests run).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

/// Builds (if stale) and returns the path of the `lockbox-agent` binary.
pub fn build_agent() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // TARGET/PROFILE/deps/NAME-HASH
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_owned();
    let target_dir = profile_dir.parent().unwrap().to_owned();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../lockbox-agent/Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args([
            "--bin",
            "lockbox-agent",
            "--profile",
            &profile,
            "--target-dir",
        ])
        .arg(&target_dir)
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "building lockbox-agent: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    profile_dir.join("lockbox-agent")
}
