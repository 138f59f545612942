//! Provides the agent executable (`crates/lockbox-agent`, bin `lockbox-agent`) that this crate
//! embeds (`src/agent.rs`): each long-lived sandbox of `lockbox serve`, `lockbox mcp` and the
//! Python SDK runs it as its agent and its init. A binary of its own, not `lockbox` re-executed,
//! because each process that executes a binary pays for that binary's relocated data: about
//! 330 KB for `lockbox`, 12 KB for the agent, in two processes of every sandbox
//! (docs/benchmarks.md, "Live sandboxes in one server").
//!
//! - `LOCKBOX_AGENT_EXE` set (what `scripts/test.sh` does, after `cargo build -p
//!   lockbox-agent` in the same target directory): that file is embedded; no nested build.
//!   A path that does not exist is an error naming it.
//! - Unset (`cargo build`, `cargo install`, `pip install ./python`): the agent is compiled here
//!   by a nested `cargo build` into a target directory of its own under `OUT_DIR` (no lock
//!   shared with the outer build), with the outer build's profile and target.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    println!("cargo:rerun-if-env-changed=LOCKBOX_AGENT_EXE");
    if let Some(agent) = env::var_os("LOCKBOX_AGENT_EXE") {
        let agent = PathBuf::from(agent);
        println!("cargo:rerun-if-changed={}", agent.display());
        if let Err(e) = std::fs::copy(&agent, out.join("lockbox-agent")) {
            panic!(
                "LOCKBOX_AGENT_EXE={}: {e} (build it with `cargo build -p lockbox-agent`, or \
                 unset LOCKBOX_AGENT_EXE to have it built here)",
                agent.display()
            );
        }
        return;
    }

    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = env::var("TARGET").unwrap_or_default();
    let (profile, profile_dir, explicit_target) = outer_build(&out, &target);
    let target_dir = out.join("agent-target");

    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(manifest_dir.join("../lockbox-agent/Cargo.toml"))
        .args([
            "--bin",
            "lockbox-agent",
            "--profile",
            &profile,
            "--target-dir",
        ])
        .arg(&target_dir);
    if explicit_target {
        // As the outer build was (`scripts/build-static.sh`): its RUSTFLAGS, which this build
        // inherits, then apply to the agent and not to build scripts and proc macros.
        cmd.args(["--target", &target]);
    }
    // A clippy or coverage wrapper of the outer build is not for the agent; no debug info
    // keeps the embedded binary (and so `lockbox`) small.
    cmd.env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_PROFILE_DEV_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_DIST_STRIP", "symbols");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running cargo for the agent: {e}"));
    assert!(
        status.success(),
        "building the agent (crates/lockbox-agent) failed: {status}"
    );

    let mut built = target_dir;
    if explicit_target {
        built.push(&target);
    }
    built.push(profile_dir);
    built.push("lockbox-agent");
    std::fs::copy(&built, out.join("lockbox-agent"))
        .unwrap_or_else(|e| panic!("copying the agent {}: {e}", built.display()));

    for path in [
        "../lockbox-agent/src",
        "../lockbox-agent/Cargo.toml",
        "../lockbox-confine/src",
        "../lockbox-confine/Cargo.toml",
        "../lockbox-policy/src",
        "../lockbox-policy/Cargo.toml",
        "../../Cargo.lock",
        "../../Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
}

/// The outer build's profile (as `--profile` takes it), the directory it builds into, and
/// whether it was given `--target`, read from `OUT_DIR`:
/// `TARGET_DIR/[TRIPLE/]PROFILE_DIR/build/PACKAGE-HASH/out`. Cargo names no custom profile to
/// build scripts (`PROFILE` is only `debug` or `release`), so `dist` is known from its
/// directory; a layout not like this one falls back to `PROFILE`.
fn outer_build(out: &Path, target: &str) -> (String, String, bool) {
    let profile_dir = out.ancestors().nth(3);
    let dir_name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .map(str::to_owned)
    };
    let explicit_target = dir_name(profile_dir.and_then(Path::parent)).as_deref() == Some(target);
    let release = env::var("PROFILE").as_deref() == Ok("release");
    match dir_name(profile_dir).as_deref() {
        Some("debug") => ("dev".into(), "debug".into(), explicit_target),
        Some(dir @ ("release" | "dist")) => (dir.into(), dir.into(), explicit_target),
        _ if release => ("release".into(), "release".into(), explicit_target),
        _ => ("dev".into(), "debug".into(), explicit_target),
    }
}
