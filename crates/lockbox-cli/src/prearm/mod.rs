//! Pre-armed starts for `lockbox run` (issue 34): a per-user helper process keeps a few
//! sandboxes set up and confined for the policies in recent use
//! ([`lockbox_confine::Spawn::armed`]), and hands one over, with the caller's stdio and
//! command, to a `lockbox run` whose policy has a spare. The run then pays only for the
//! `execve` of its command, not for namespaces, a root, Landlock and seccomp.
//!
//! - [`client`]: `lockbox run`'s side — whether a run may be handed over, the request, the
//!   forwarding of signals, the outcome.
//! - [`helper`]: the helper (`lockbox pre-arm start`), its spares and its runs.
//! - [`wire`]: their messages, over a Unix seqpacket socket.
//!
//! **Where the helper is.** One socket per user and per `lockbox` executable, in a private
//! directory ([`socket_dir`]): `$LOCKBOX_PRE_ARM_DIR`, else `$XDG_RUNTIME_DIR/lockbox`, else
//! `/tmp/lockbox-<uid>`; the directory must be the user's and closed to others. The
//! socket's name carries the identity of the executable (device, inode, size, modification
//! time), so a helper of another build — an older `lockbox` still running after an upgrade
//! — is never used; its peer's uid is checked at every connection.

pub(crate) mod client;
pub(crate) mod helper;
pub(crate) mod wire;

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Set by the `lockbox` binary: only a process whose own executable is `lockbox` can start
/// the helper (the Python wheel's `lockbox` script runs in python).
static ENABLED: OnceLock<()> = OnceLock::new();

/// Lets `lockbox run` use (and start) the pre-arm helper: called by the `lockbox` binary.
pub fn enable() {
    let _ = ENABLED.set(());
}

pub(crate) fn enabled() -> bool {
    ENABLED.get().is_some()
}

/// The directory of the helper's socket, made (0700) if missing, refused if it is not a
/// directory of this user's closed to others.
pub(crate) fn socket_dir() -> Result<PathBuf, String> {
    let uid = rustix::process::getuid().as_raw();
    let dir = match (
        std::env::var_os("LOCKBOX_PRE_ARM_DIR"),
        std::env::var_os("XDG_RUNTIME_DIR"),
    ) {
        (Some(dir), _) if !dir.is_empty() => PathBuf::from(dir),
        (_, Some(run)) if Path::new(&run).is_absolute() => Path::new(&run).join("lockbox"),
        _ => PathBuf::from(format!("/tmp/lockbox-{uid}")),
    };
    // Absolute: the helper leaves its starter's directory.
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!(
                "{}: {}",
                dir.display(),
                crate::commands::os_error(&e)
            ))
        }
    }
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| format!("{}: {}", dir.display(), crate::commands::os_error(&e)))?;
    if !meta.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    if meta.uid() != uid {
        return Err(format!(
            "{}: owned by uid {}, not by this user (uid {uid})",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{}: open to other users (mode {:o}); it must be 0700",
            dir.display(),
            meta.mode() & 0o777
        ));
    }
    Ok(dir)
}

/// The identity of this process's executable, as hex: a helper of another build has
/// another socket.
pub(crate) fn exe_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        if let Ok(m) = std::fs::metadata("/proc/self/exe") {
            (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()).hash(&mut h);
        }
        format!("{:016x}", h.finish())
    })
}

/// The helper's socket in `dir`.
pub(crate) fn socket_path(dir: &Path) -> PathBuf {
    dir.join(format!("pre-arm-{}.sock", exe_identity()))
}

/// The lock the running helper holds (one helper per socket).
pub(crate) fn lock_path(dir: &Path) -> PathBuf {
    dir.join(format!("pre-arm-{}.lock", exe_identity()))
}

/// What `LOCKBOX_PRE_ARM` says: `Some(true)` for 1/on/yes, `Some(false)` for 0/off/no,
/// `None` unset or empty. Another value is a usage error.
pub(crate) fn env_switch() -> Result<Option<bool>, String> {
    let Some(value) = std::env::var_os("LOCKBOX_PRE_ARM") else {
        return Ok(None);
    };
    match value.to_str().map(str::to_ascii_lowercase).as_deref() {
        Some("") => Ok(None),
        Some("1" | "on" | "yes" | "true") => Ok(Some(true)),
        Some("0" | "off" | "no" | "false") => Ok(Some(false)),
        _ => Err(format!(
            "LOCKBOX_PRE_ARM={}: expected 1 (pre-arm) or 0 (never)",
            value.to_string_lossy()
        )),
    }
}
