//! The `lockbox-agent` executable (crate `lockbox-agent`) for the runtime's (and lockbox-e2b's) tests and
//! benchmarks. Cargo gives a package's tests only its own binaries (`CARGO_BIN_EXE_*`), and
//! the agent's binary lives in its own crate, so it comes from the outer build:
//! `$LOCKBOX_AGENT_EXE` if set, else `lockbox-agent` in the calling test's own target
//! directory and profile (`cargo build -p lockbox-agent`, which `scripts/test.sh` runs
//! first; `--release` for benchmarks). Never built from here: a nested `cargo build` cost a
//! second build of the agent's dependencies and raced the outer build's lock. A missing or
//! stale agent (older than a source file it is built from) is an error saying what to run.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Overrides where the agent is (a path to the executable).
pub const AGENT_EXE_VAR: &str = "LOCKBOX_AGENT_EXE";

/// The path of the built `lockbox-agent` binary; panics saying how to build it when it is
/// missing or older than its sources.
pub fn built_agent() -> PathBuf {
    if let Some(exe) = std::env::var_os(AGENT_EXE_VAR) {
        let exe = PathBuf::from(exe);
        assert!(
            exe.is_file(),
            "{AGENT_EXE_VAR}={} does not exist",
            exe.display()
        );
        return exe;
    }
    let exe = std::env::current_exe().unwrap();
    // TARGET/PROFILE/deps/NAME-HASH
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_owned();
    let flag = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => String::new(),
        Some("release") => " --release".to_owned(),
        Some(other) => format!(" --profile {other}"),
    };
    let agent = profile_dir.join("lockbox-agent");
    let built = std::fs::metadata(&agent).and_then(|m| m.modified()).ok();
    let Some(built) = built else {
        panic!(
            "the agent {} is not built: run `cargo build{flag} -p lockbox-agent` first \
             (scripts/test.sh does), or set {AGENT_EXE_VAR}",
            agent.display()
        );
    };
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // What the agent is built from (crates/lockbox-agent and its workspace dependencies).
    for dir in [
        "lockbox-agent",
        "lockbox-confine",
        "lockbox-policy",
        "lockbox-netsup",
        "lockbox-codes",
    ] {
        if let Some(newer) = newer_than(&crates.join(dir), built) {
            panic!(
                "the agent {} is older than {}: run `cargo build{flag} -p lockbox-agent` \
                 (scripts/test.sh does), or set {AGENT_EXE_VAR}",
                agent.display(),
                newer.display()
            );
        }
    }
    agent
}

/// A file under `dir` (its `src/` and `Cargo.toml`) modified after `t`, if any.
fn newer_than(dir: &Path, t: SystemTime) -> Option<PathBuf> {
    let mut stack = vec![dir.join("src"), dir.join("Cargo.toml")];
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::metadata(&p) else {
            continue;
        };
        if md.is_dir() {
            stack.extend(std::fs::read_dir(&p).ok()?.flatten().map(|e| e.path()));
        } else if md.modified().is_ok_and(|m| m > t) {
            return Some(p);
        }
    }
    None
}
