//! Pre-armed starts for `lockbox run` and the Python SDK's plain runs (issue 34): a per-user
//! helper process keeps a few sandboxes set up and confined for the policies in recent use
//! ([`lockbox_confine::Spawn::armed`]), and hands one over, with the caller's stdio and
//! command, to a `lockbox run` (or an SDK run) whose policy has a spare. The run then pays
//! only for the `execve` of its command, not for namespaces, a root, Landlock and seccomp.
//!
//! - [`client`]: `lockbox run`'s side — whether a run may be handed over, the request, the
//!   forwarding of signals, the outcome — and the SDK's ([`client::hand_over`]).
//! - [`helper`]: the helper (`lockbox pre-arm start`), its spares and its runs.
//! - [`wire`]: their messages, over a Unix seqpacket socket.
//!
//! **Where the helper is.** One socket per user and per build (the `lockbox` executable, or
//! the SDK's extension module, whose helper is python running the wheel's CLI), in a private
//! directory ([`socket_dir`]): `$LOCKBOX_PRE_ARM_DIR`, else `$XDG_RUNTIME_DIR/lockbox`, else
//! `/tmp/lockbox-<uid>`; the directory must be the user's and closed to others. The
//! socket's name carries the identity of that file (device, inode, size, modification
//! time), so a helper of another build — an older `lockbox` still running after an upgrade
//! — is never used; its peer's uid is checked at every connection.

pub(crate) mod client;
pub(crate) mod helper;
pub(crate) mod wire;

use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The process the helper's code runs in, set by the program that links this crate: only
/// a program that says how to start its helper may start one.
#[derive(Debug)]
enum Host {
    /// The `lockbox` executable: the helper is `lockbox pre-arm start`.
    Binary,
    /// The Python SDK's extension module: the helper is the wheel's CLI, started by
    /// `launcher` (python with its arguments) followed by `pre-arm start ...`. `identity`:
    /// the module file's, taken when it was loaded (python is the executable whatever the
    /// build).
    Extension {
        launcher: Vec<OsString>,
        identity: String,
    },
}

static HOST: OnceLock<Host> = OnceLock::new();

/// Lets `lockbox run` use (and start) the pre-arm helper: called by the `lockbox` binary.
pub fn enable() {
    let _ = HOST.set(Host::Binary);
}

/// Lets the Python SDK's extension use (and start) a helper of its own build: `launcher`
/// runs the wheel's `lockbox` command (python and its arguments, before `pre-arm start`).
/// Without a launcher, or where the module's file cannot be told (its builds could not
/// be told apart), nothing is pre-armed.
pub fn enable_in_extension(launcher: Vec<OsString>) {
    let Some(identity) = loaded_from().as_deref().and_then(file_identity) else {
        return;
    };
    if !launcher.is_empty() {
        let _ = HOST.set(Host::Extension { launcher, identity });
    }
}

pub(crate) fn enabled() -> bool {
    HOST.get().is_some()
}

/// The command that starts this build's helper (before `pre-arm start ...`).
pub(crate) fn launcher() -> std::io::Result<Vec<OsString>> {
    match HOST.get() {
        Some(Host::Extension { launcher, .. }) => Ok(launcher.clone()),
        Some(Host::Binary) | None => Ok(vec![std::env::current_exe()?.into_os_string()]),
    }
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

/// The identity of the file this code was loaded from, as hex: a helper of another build
/// has another socket. The `lockbox` executable's, or the SDK's extension module's.
pub(crate) fn exe_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| match HOST.get() {
        Some(Host::Extension { identity, .. }) => identity.clone(),
        Some(Host::Binary) | None => file_identity(Path::new("/proc/self/exe")).unwrap_or_default(),
    })
}

/// A file's device, inode, size and modification time, hashed, as hex.
fn file_identity(file: &Path) -> Option<String> {
    use std::hash::{Hash, Hasher};
    let m = std::fs::metadata(file).ok()?;
    let mut h = std::hash::DefaultHasher::new();
    (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()).hash(&mut h);
    Some(format!("{:016x}", h.finish()))
}

/// The file mapped where this function's code is (`/proc/self/maps`): the extension
/// module, in the SDK.
fn loaded_from() -> Option<PathBuf> {
    let here = loaded_from as fn() -> Option<PathBuf> as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        // address perms offset dev inode, then the path (which may hold spaces).
        let mut fields = line.splitn(6, ' ');
        let (start, end) = fields.next()?.split_once('-')?;
        let start = usize::from_str_radix(start, 16).ok()?;
        let end = usize::from_str_radix(end, 16).ok()?;
        let path = fields.nth(4)?.trim_start();
        ((start..end).contains(&here) && path.starts_with('/')).then(|| PathBuf::from(path))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The SDK's helper is told apart by the file its code was loaded from: here, in a test
    /// executable, that is the executable itself.
    #[test]
    fn the_code_is_found_in_the_file_it_was_loaded_from() {
        let exe = std::fs::canonicalize("/proc/self/exe").unwrap();
        let found = loaded_from().expect("this function's mapping in /proc/self/maps");
        assert_eq!(std::fs::canonicalize(found).unwrap(), exe);
    }
}
