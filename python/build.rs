//! Provides the agent executable (`crates/lockbox-agent`, bin `lockbox-agent`) that the
//! extension module embeds: `Sandbox.open()` needs a real executable to run inside each
//! sandbox, and a wheel built by maturin carries only the extension module.
//!
//! - `LOCKBOX_AGENT_EXE` set (what `scripts/test.sh` does, after `cargo build -p
//!   lockbox-agent` in the same target directory): that file is embedded; no nested build.
//!   A path that does not exist is an error naming it.
//! - Unset (a user's `pip install ./python`): the agent is compiled here by a nested `cargo
//!   build` into a target directory of its own under `OUT_DIR` (no lock shared with the outer
//!   build), as `pip install ./python` alone must be enough.
//!
//! `src/local.rs` includes the bytes.

use std::env;
use std::path::PathBuf;
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
    let release = env::var("PROFILE").as_deref() == Ok("release");
    let target = env::var("TARGET").unwrap_or_default();
    let host = env::var("HOST").unwrap_or_default();
    let target_dir = out.join("agent-target");

    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(manifest_dir.join("../crates/lockbox-agent/Cargo.toml"))
        .args(["--bin", "lockbox-agent", "--target-dir"])
        .arg(&target_dir);
    if release {
        cmd.arg("--release");
    }
    if target != host {
        cmd.args(["--target", &target]);
    }
    // A clippy or coverage wrapper of the outer build is not for the agent; no debug info
    // keeps the embedded binary (and so the extension) small.
    cmd.env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_PROFILE_DEV_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running cargo for the agent: {e}"));
    assert!(
        status.success(),
        "building the agent (crates/lockbox-agent) failed: {status}"
    );

    let mut built = target_dir;
    if target != host {
        built.push(&target);
    }
    built.push(if release { "release" } else { "debug" });
    built.push("lockbox-agent");
    std::fs::copy(&built, out.join("lockbox-agent"))
        .unwrap_or_else(|e| panic!("copying the agent {}: {e}", built.display()));

    for path in [
        "../crates/lockbox-agent/src",
        "../crates/lockbox-agent/Cargo.toml",
        "../crates/lockbox-confine/src",
        "../crates/lockbox-confine/Cargo.toml",
        "../crates/lockbox-policy/src",
        "../Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
}
