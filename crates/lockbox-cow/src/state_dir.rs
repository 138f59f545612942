//! Where lockbox keeps its state (branches, transactions, the server's sandboxes) when the
//! caller names no directory: one rule for the CLI, the server and the Python SDK.

use std::path::PathBuf;

/// The variable that names the state directory, above every default.
pub const STATE_DIR_ENV: &str = "LOCKBOX_STATE_DIR";

/// The state directory to use when none is given: `$LOCKBOX_STATE_DIR`; else
/// `/var/lib/lockbox` for root (effective uid 0); else the user's state directory
/// (`$XDG_STATE_HOME`, or `~/.local/state`) + `lockbox`. `None` only when no home directory
/// can be found (no `$HOME`, no passwd entry).
pub fn default_state_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(STATE_DIR_ENV).filter(|d| !d.is_empty()) {
        return Some(dir.into());
    }
    if rustix::process::geteuid().is_root() {
        return Some("/var/lib/lockbox".into());
    }
    dirs::state_dir().map(|d| d.join("lockbox"))
}
