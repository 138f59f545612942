//! Unpacking a layer's tar stream into an overlayfs-format directory, without privilege and
//! without ever writing through a symlink.
//!
//! Every path is resolved beneath the layer's root with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, and the last component is created with an `*at` call on that
//! parent (`O_NOFOLLOW | O_EXCL` for files): an entry named `..`, an absolute name, or one
//! whose parent is a symlink (CVE-2019-14271-style tar tricks) is an error naming the entry.
//! Symlinks are stored as they are (they are resolved inside the sandbox's root, never by
//! this code). Hard links may only point at an entry already written into this layer.
//! OCI whiteouts become what overlayfs reads as whiteouts in an unprivileged (`userxattr`)
//! mount: `.wh.NAME` a character device 0:0 (`mknod` of 0:0 needs no privilege since Linux
//! 5.8), `.wh..wh..opq` the xattr `user.overlay.opaque=y` on its directory.
//! Device nodes and FIFOs are skipped and reported; setuid/setgid bits are stripped and
//! reported. Files belong to the caller (an unprivileged caller cannot chown); directory
//! modes are applied at the end, deepest first, so a read-only directory can still be filled.

use crate::error::ImageError;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use serde::{Deserialize, Serialize};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// What an unpack did besides writing the entries as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnpackReport {
    /// Entries written.
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Entries whose setuid/setgid bits were stripped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setid_stripped: Vec<String>,
    /// Entries not written: device nodes and FIFOs (`path (kind)`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Whiteouts and opaque directories made.
    pub whiteouts: u64,
}

const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// The overlay whiteout marker name for an opaque directory, in a `userxattr` mount.
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";

struct Unpacker<'a> {
    root: OwnedFd,
    root_path: &'a Path,
    layer: &'a str,
    report: UnpackReport,
    /// Directories and their final modes/mtimes, applied at the end.
    dirs: Vec<(PathBuf, u32, i64)>,
}

/// Unpacks the (already decompressed) tar stream `reader` into the empty directory `root`.
/// `layer` names the layer in errors.
pub fn unpack(
    reader: impl std::io::Read,
    root: &Path,
    layer: &str,
) -> Result<UnpackReport, ImageError> {
    let root_fd = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ImageError::io("open the layer directory", root, e.into()))?;
    let mut u = Unpacker {
        root: root_fd,
        root_path: root,
        layer,
        report: UnpackReport::default(),
        dirs: Vec::new(),
    };
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| u.bad(format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| u.bad(format!("reading the tar stream: {e}")))?;
        u.entry(&mut entry)?;
    }
    u.finish_dirs()?;
    Ok(u.report)
}

impl Unpacker<'_> {
    fn bad(&self, reason: String) -> ImageError {
        ImageError::BadLayer {
            layer: self.layer.to_owned(),
            reason,
        }
    }

    fn hostile(&self, entry: &Path, reason: impl Into<String>) -> ImageError {
        ImageError::HostileEntry {
            layer: self.layer.to_owned(),
            entry: entry.display().to_string(),
            reason: reason.into(),
        }
    }

    fn io(&self, step: &'static str, rel: &Path, e: rustix::io::Errno) -> ImageError {
        ImageError::io(step, self.root_path.join(rel), e.into())
    }

    /// An entry's name as components beneath the root: `..` and absolute names refused.
    fn components(&self, raw: &Path) -> Result<Vec<OsString>, ImageError> {
        let mut out = Vec::new();
        for c in raw.components() {
            match c {
                Component::Normal(n) => out.push(n.to_owned()),
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(self.hostile(raw, "a name with `..` (it would leave the layer)"))
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(self.hostile(
                        raw,
                        "an absolute name (names are relative to the layer's root)",
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Opens (creating as needed) the directory `comps` beneath the root, never following a
    /// symlink.
    fn dir(&self, entry: &Path, comps: &[OsString]) -> Result<OwnedFd, ImageError> {
        let mut fd = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.io("open the layer directory", Path::new(""), e))?;
        for c in comps {
            let open = |fd: &OwnedFd| {
                rustix::fs::openat2(
                    fd,
                    c.as_os_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    BENEATH,
                )
            };
            fd = match open(&fd) {
                Ok(next) => next,
                Err(rustix::io::Errno::NOENT) => {
                    match rustix::fs::mkdirat(&fd, c.as_os_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(self.io("create a parent directory", entry, e)),
                    }
                    open(&fd).map_err(|e| self.parent_error(entry, e))?
                }
                Err(e) => return Err(self.parent_error(entry, e)),
            };
        }
        Ok(fd)
    }

    fn parent_error(&self, entry: &Path, e: rustix::io::Errno) -> ImageError {
        match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => self.hostile(
                entry,
                "a parent directory is a symlink (nothing is written through a symlink)",
            ),
            rustix::io::Errno::NOTDIR => self.hostile(entry, "a parent is not a directory"),
            e => self.io("open a parent directory", entry, e),
        }
    }

    /// Removes whatever is at `name` (not a directory with content: that is an error).
    fn clear(
        &self,
        parent: &OwnedFd,
        name: &OsStr,
        entry: &Path,
        keep_dir: bool,
    ) -> Result<bool, ImageError> {
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(self.io("stat an existing entry", entry, e)),
            Ok(st) => {
                if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                    if keep_dir {
                        return Ok(true);
                    }
                    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR).map_err(|_| {
                        self.hostile(entry, "replaces a non-empty directory of the same layer")
                    })?;
                } else {
                    rustix::fs::unlinkat(parent, name, AtFlags::empty())
                        .map_err(|e| self.io("replace an earlier entry", entry, e))?;
                }
                Ok(false)
            }
        }
    }

    fn mode(&mut self, entry: &Path, mode: u32) -> u32 {
        if mode & 0o6000 != 0 {
            self.report.setid_stripped.push(entry.display().to_string());
        }
        mode & 0o1777
    }

    fn entry<R: std::io::Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        let raw: PathBuf = entry
            .path()
            .map_err(|e| self.bad(format!("an entry name: {e}")))?
            .into_owned();
        let comps = self.components(&raw)?;
        let Some((name, parents)) = comps.split_last() else {
            return Ok(()); // the root itself: its mode is the store's
        };
        let kind = entry.header().entry_type();
        let mode = entry
            .header()
            .mode()
            .map_err(|e| self.bad(format!("{}: mode: {e}", raw.display())))?;
        let mtime = entry.header().mtime().unwrap_or(0) as i64;
        let rel: PathBuf = comps.iter().collect();
        let name_bytes = name.as_bytes();
        // Whiteouts (OCI image spec, "Representing Changes").
        if let Some(hidden) = name_bytes.strip_prefix(b".wh.") {
            let parent = self.dir(&raw, parents)?;
            self.report.whiteouts += 1;
            if hidden == b".wh..opq" {
                let dir = parent;
                return rustix::fs::fsetxattr(
                    &dir,
                    OPAQUE_XATTR,
                    b"y",
                    rustix::fs::XattrFlags::empty(),
                )
                .map_err(|e| self.io("mark an opaque directory (user.overlay.opaque)", &rel, e));
            }
            if hidden.starts_with(b".wh.") {
                self.report.whiteouts -= 1;
                return Ok(()); // aufs bookkeeping (.wh..wh.plnk, ...): no meaning in a layer
            }
            let hidden = OsStr::from_bytes(hidden);
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(self.hostile(&raw, "a whiteout of no name, `.` or `..`"));
            }
            self.clear(&parent, hidden, &raw, false)?;
            rustix::fs::mknodat(
                &parent,
                hidden,
                FileType::CharacterDevice,
                Mode::empty(),
                rustix::fs::makedev(0, 0),
            )
            .map_err(|e| self.io("make a whiteout (character device 0:0)", &rel, e))?;
            // Its time, as for every entry: the layer written again as a tar stream is
            // then the same (a snapshot moved between nodes keeps its digest).
            let _ =
                rustix::fs::utimensat(&parent, hidden, &times(mtime), AtFlags::SYMLINK_NOFOLLOW);
            return Ok(());
        }
        let parent = self.dir(&raw, parents)?;
        match kind {
            tar::EntryType::Directory => {
                if !self.clear(&parent, name, &raw, true)? {
                    rustix::fs::mkdirat(&parent, name.as_os_str(), Mode::from_raw_mode(0o700))
                        .map_err(|e| self.io("create a directory", &rel, e))?;
                }
                let mode = self.mode(&raw, mode);
                self.dirs.push((rel, mode, mtime));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                self.clear(&parent, name, &raw, false)?;
                let fd = rustix::fs::openat(
                    &parent,
                    name.as_os_str(),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| self.io("create a file", &rel, e))?;
                let mut file = std::fs::File::from(fd);
                let n = std::io::copy(entry, &mut file).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::Other
                        || e.kind() == std::io::ErrorKind::UnexpectedEof
                    {
                        self.bad(format!("{}: {e}", raw.display()))
                    } else {
                        ImageError::io("write a file", self.root_path.join(&rel), e)
                    }
                })?;
                self.report.bytes += n;
                let mode = self.mode(&raw, mode);
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))
                    .map_err(|e| self.io("set a file's mode", &rel, e))?;
                let _ = rustix::fs::futimens(&file, &times(mtime));
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| self.bad(format!("{}: link name: {e}", raw.display())))?
                    .ok_or_else(|| self.hostile(&raw, "a symlink without a target"))?
                    .into_owned();
                self.clear(&parent, name, &raw, false)?;
                rustix::fs::symlinkat(target.as_os_str(), &parent, name.as_os_str())
                    .map_err(|e| self.io("create a symlink", &rel, e))?;
                let _ = rustix::fs::utimensat(
                    &parent,
                    name.as_os_str(),
                    &times(mtime),
                    AtFlags::SYMLINK_NOFOLLOW,
                );
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| self.bad(format!("{}: link name: {e}", raw.display())))?
                    .ok_or_else(|| self.hostile(&raw, "a hard link without a target"))?
                    .into_owned();
                let tcomps = self.components(&target).map_err(|_| {
                    self.hostile(
                        &raw,
                        format!(
                            "a hard link to {:?}, outside the layer",
                            target.display().to_string()
                        ),
                    )
                })?;
                let Some((tname, tparents)) = tcomps.split_last() else {
                    return Err(self.hostile(&raw, "a hard link to the layer's root"));
                };
                let missing = || {
                    self.hostile(
                        &raw,
                        format!(
                            "a hard link to {:?}, which is not an earlier entry of this layer",
                            target.display().to_string()
                        ),
                    )
                };
                let tparent = self.dir_existing(&raw, tparents).map_err(|_| missing())?;
                let tst =
                    rustix::fs::statat(&tparent, tname.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|_| missing())?;
                if FileType::from_raw_mode(tst.st_mode) == FileType::Directory {
                    return Err(self.hostile(&raw, "a hard link to a directory"));
                }
                if tcomps != comps {
                    self.clear(&parent, name, &raw, false)?;
                    rustix::fs::linkat(
                        &tparent,
                        tname.as_os_str(),
                        &parent,
                        name.as_os_str(),
                        AtFlags::empty(),
                    )
                    .map_err(|e| self.io("create a hard link", &rel, e))?;
                }
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                let what = match kind {
                    tar::EntryType::Char => "character device",
                    tar::EntryType::Block => "block device",
                    _ => "fifo",
                };
                self.report
                    .skipped
                    .push(format!("{} ({what})", raw.display()));
                return Ok(());
            }
            // Global pax headers and the like carry nothing to write.
            _ => return Ok(()),
        }
        self.report.entries += 1;
        Ok(())
    }

    /// Opens an existing directory beneath the root, never following a symlink.
    fn dir_existing(&self, entry: &Path, comps: &[OsString]) -> Result<OwnedFd, ImageError> {
        let rel: PathBuf = if comps.is_empty() {
            PathBuf::from(".")
        } else {
            comps.iter().collect()
        };
        rustix::fs::openat2(
            &self.root,
            &rel,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )
        .map_err(|e| self.parent_error(entry, e))
    }

    /// Applies the directories' modes and mtimes, deepest first.
    fn finish_dirs(&mut self) -> Result<(), ImageError> {
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by_key(|(p, _, _)| std::cmp::Reverse(p.components().count()));
        for (rel, mode, mtime) in dirs {
            let comps: Vec<OsString> = rel.iter().map(OsStr::to_owned).collect();
            let fd = self.dir_existing(&rel, &comps)?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                .map_err(|e| self.io("set a directory's mode", &rel, e))?;
            let _ = rustix::fs::futimens(fd.as_fd(), &times(mtime));
        }
        Ok(())
    }
}

fn times(mtime: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Removes a tree this process unpacked, even where directories were made read-only
/// (their owner may add the write bit back; nothing is followed through a symlink).
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(path);
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                r => r,
            }
        }
    }
}

fn make_writable(dir: &Path) {
    let Ok(md) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !md.is_dir() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            }
        }
    }
}
