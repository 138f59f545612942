//! The in-sandbox agent this crate embeds (`crates/lockbox-agent`'s binary, built by
//! `build.rs`): long-lived sandboxes (`lockbox serve`, `lockbox mcp`, the Python SDK) run it
//! as their agent and their init rather than re-executing `lockbox`, whose relocated data
//! would cost each of those processes about 330 KB more (docs/benchmarks.md, "Live sandboxes
//! in one server"). It is embedded, not installed beside `lockbox`, so that `lockbox` stays
//! one file and its agent is always of its own build.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

static AGENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lockbox-agent"));

/// Writes the embedded agent to `STATE/agent/lockbox-agent-VERSION-HASH` (atomically, mode
/// 0755) unless an identical file is there, and returns its path: what to set
/// `RuntimeConfig::agent_exe` to.
pub fn install_agent(state_dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    AGENT.hash(&mut hasher);
    let dir = state_dir.join("agent");
    let path = dir.join(format!(
        "lockbox-agent-{}-{:016x}",
        env!("CARGO_PKG_VERSION"),
        hasher.finish()
    ));
    if std::fs::read(&path).is_ok_and(|bytes| bytes == AGENT) {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".lockbox-agent.{}.tmp", std::process::id()));
    std::fs::write(&tmp, AGENT)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The agent `lockbox serve` and `lockbox mcp` give their runtime: the embedded one, written
/// into `state_dir`; or, when `state_dir` is on a file system mounted `noexec` (where it could
/// not be executed), this executable re-executed (its `main` dispatches to the agent), which
/// costs each sandbox about 0.7 MB more: said once, on stderr.
pub(crate) fn for_runtime(state_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    use anyhow::Context;
    let noexec = rustix::fs::statvfs(state_dir)
        .is_ok_and(|s| s.f_flag.contains(rustix::fs::StatVfsMountFlags::NOEXEC));
    if noexec {
        crate::output::eoutln!(
            "lockbox: warning: {} is on a noexec file system: sandboxes run lockbox itself as \
             their agent (about 0.7 MB more memory each than the agent it embeds)",
            state_dir.display()
        );
        return Ok(None);
    }
    let path = install_agent(state_dir).with_context(|| {
        format!(
            "writing the sandbox agent into {}",
            state_dir.join("agent").display()
        )
    })?;
    Ok(Some(path))
}
