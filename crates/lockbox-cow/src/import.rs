//! Importing an upper layer that was written elsewhere (a size-bounded tmpfs inside the
//! sandbox, `lockbox run --max-disk`) into a branch's `upper/`, faithfully: file contents,
//! modes and times, symlinks, whiteouts and the `overlay.*` xattrs that mark opaque
//! directories.

use crate::error::CowError;
use rustix::fs::{AtFlags, FileType, Mode, Timespec, Timestamps, CWD};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Copies the upper layer at `src` into the (empty) directory `dst`; returns the bytes of
/// file data copied. Special files other than whiteouts are refused, as in a commit.
pub fn import_upper(src: &Path, dst: &Path) -> Result<u64, CowError> {
    copy_dir(src, dst, true)
}

fn err(path: &Path) -> impl Fn(std::io::Error) -> CowError + '_ {
    move |source| CowError::ImportUpper {
        path: path.to_owned(),
        source,
    }
}

fn copy_dir(src: &Path, dst: &Path, is_root: bool) -> Result<u64, CowError> {
    if !is_root {
        std::fs::create_dir(dst).map_err(err(src))?;
    }
    let mut bytes = 0;
    readable(src, 0o500).map_err(err(src))?;
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .map_err(err(src))?
        .collect::<Result<_, _>>()
        .map_err(err(src))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let st = rustix::fs::lstat(&from).map_err(|e| err(&from)(e.into()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => bytes += copy_dir(&from, &to, false)?,
            FileType::RegularFile => bytes += copy_file(&from, &to).map_err(err(&from))?,
            FileType::Symlink => {
                let target = std::fs::read_link(&from).map_err(err(&from))?;
                std::os::unix::fs::symlink(target, &to).map_err(err(&from))?;
            }
            // A whiteout: unprivileged users may create 0/0 character devices (Linux >= 5.8).
            FileType::CharacterDevice if st.st_rdev == 0 => {
                rustix::fs::mknodat(CWD, &to, FileType::CharacterDevice, Mode::empty(), 0)
                    .map_err(|e| err(&from)(e.into()))?;
            }
            _ => {
                return Err(err(&from)(std::io::Error::other(
                    "special files cannot be part of a branch",
                )))
            }
        }
        finish_entry(&from, &to, &st)?;
    }
    if is_root {
        let st = rustix::fs::lstat(src).map_err(|e| err(src)(e.into()))?;
        finish_entry(src, dst, &st)?;
    }
    Ok(bytes)
}

/// Grants the owner `bits` on a source entry that lacks them (a sandbox may `chmod 000`
/// what it wrote). The source is lockbox's private copy of the layer, discarded after the
/// import, and the destination gets the original mode from the `Stat` taken before.
fn readable(path: &Path, bits: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::symlink_metadata(path)?.permissions().mode();
    if mode & bits != bits {
        std::fs::set_permissions(
            path,
            std::fs::Permissions::from_mode((mode | bits) & 0o7777),
        )?;
    }
    Ok(())
}

/// Copies a file's data into a new file that stays writable until [`finish_entry`] has set
/// its xattrs (setting `user.*` xattrs needs write access) and then its real mode.
fn copy_file(from: &Path, to: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::OpenOptionsExt;
    readable(from, 0o400)?;
    let mut src = std::fs::File::open(from)?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    std::io::copy(&mut src, &mut dst)
}

/// Copies the `overlay.*` xattrs (first, while the entry is still writable), the mode (not for symlinks) and the times of `from`.
fn finish_entry(from: &Path, to: &Path, st: &rustix::fs::Stat) -> Result<(), CowError> {
    let fail = |e: rustix::io::Errno| err(from)(e.into());
    let mut names = vec![0u8; 4096];
    let n = rustix::fs::llistxattr(from, &mut names[..]).unwrap_or(0);
    for name in names[..n]
        .split(|&b| b == 0)
        .filter(|n| n.starts_with(b"user.overlay."))
    {
        // The exact bytes: a lossy copy would name another attribute.
        let name = std::ffi::OsStr::from_bytes(name);
        let mut value = vec![0u8; 4096];
        let len = rustix::fs::lgetxattr(from, name, &mut value[..]).map_err(fail)?;
        rustix::fs::lsetxattr(to, name, &value[..len], rustix::fs::XattrFlags::empty())
            .map_err(fail)?;
    }
    let file_type = FileType::from_raw_mode(st.st_mode);
    if file_type != FileType::Symlink {
        rustix::fs::chmod(to, Mode::from_raw_mode(st.st_mode & 0o7777)).map_err(fail)?;
    }
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec as _,
        },
        last_modification: Timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec as _,
        },
    };
    rustix::fs::utimensat(CWD, to, &times, AtFlags::SYMLINK_NOFOLLOW).map_err(fail)
}
