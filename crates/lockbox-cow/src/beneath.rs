//! Directory-fd helpers that never follow a symlink and never leave the directory they start
//! from: every path below the workdir is resolved one component at a time, each with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` (openat2(2)), so
//! paths longer than `PATH_MAX` work, and the last component is only ever touched through
//! `*at` calls that do not follow it (`renameat`, `unlinkat`, `mkdirat`, `symlinkat`,
//! `fstatat(AT_SYMLINK_NOFOLLOW)`, `openat(O_NOFOLLOW)`). [`OwnDir`] and [`open_own_file`]
//! read what a sandbox made unreadable in a layer only lockbox writes now.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// The resolve flags used for every path below the workdir.
pub(crate) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Opens a directory the caller named (the workdir, the state dir). Symlinks in *this* path
/// are followed: the caller chose it.
pub(crate) fn open_root(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the directory `rel` (relative, may be empty) beneath `root` as an `O_PATH` fd, usable
/// as the `dirfd` of `*at` calls. Fails with `ELOOP` if any component is a symlink. One
/// component at a time: `rel` may be longer than `PATH_MAX`, which one `openat2` refuses.
pub(crate) fn open_dir_beneath(root: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    let mut dir = open_component(root, OsStr::new("."))?;
    for name in components(rel)? {
        dir = open_component(dir.as_fd(), name)?;
    }
    Ok(dir)
}

/// Like [`open_dir_beneath`], opened for reading (listing, `fsync`).
pub(crate) fn open_dir_read_beneath(root: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    reopen_dir(open_dir_beneath(root, rel)?.as_fd())
}

/// The directory behind `dir` (possibly `O_PATH`), opened again for reading.
pub(crate) fn reopen_dir(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The (atime, mtime) of a `Stat`, to set on a copy.
pub(crate) fn times_of(st: &Stat) -> rustix::fs::Timestamps {
    let ts = |tv_sec, tv_nsec| rustix::fs::Timespec {
        tv_sec,
        tv_nsec: tv_nsec as _,
    };
    rustix::fs::Timestamps {
        last_access: ts(st.st_atime, st.st_atime_nsec),
        last_modification: ts(st.st_mtime, st.st_mtime_nsec),
    }
}

/// One component below `dir`, as an `O_PATH` directory, never through a symlink.
fn open_component(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    )?)
}

/// The names of a relative path's components; `EXDEV` (what `RESOLVE_BENEATH` answers) for
/// `..` or an absolute path.
fn components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(Errno::XDEV.into())
            }
        }
    }
    Ok(out)
}

/// Opens directories beneath a root one component at a time, like [`open_dir_beneath`], and
/// keeps the chain of the last one open: paths of a change set come sorted, parents first, so
/// consecutive paths share most of their ancestors and each directory is opened about once.
/// Holds one descriptor per level of the last path.
pub(crate) struct DirCursor<'a> {
    root: BorrowedFd<'a>,
    chain: Vec<(OsString, OwnedFd)>,
}

impl<'a> DirCursor<'a> {
    pub(crate) fn new(root: BorrowedFd<'a>) -> DirCursor<'a> {
        DirCursor {
            root,
            chain: Vec::new(),
        }
    }

    /// The `O_PATH` directory `rel` beneath the root (the root itself for an empty path).
    pub(crate) fn open(&mut self, rel: &Path) -> io::Result<BorrowedFd<'_>> {
        let names = components(rel)?;
        let shared = self
            .chain
            .iter()
            .zip(&names)
            .take_while(|((have, _), want)| have.as_os_str() == **want)
            .count();
        self.chain.truncate(shared);
        for name in &names[shared..] {
            let parent = self.chain.last().map_or(self.root, |(_, fd)| fd.as_fd());
            let fd = open_component(parent, name)?;
            self.chain.push(((*name).to_owned(), fd));
        }
        Ok(self.chain.last().map_or(self.root, |(_, fd)| fd.as_fd()))
    }
}

/// Opens an existing directory entry `name` of `dir` for reading, without following it.
pub(crate) fn open_child_dir(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the regular file `name` of `dir` for reading, without following it.
pub(crate) fn open_child_file(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(std::fs::File::from(fd))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`, with `ENOENT` as `None`.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<Stat>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The names in a directory (without `.` and `..`), sorted bytewise so walks are
/// deterministic.
pub(crate) fn sorted_names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Sets the mode of the inode behind `fd`, which may be an `O_PATH` fd (no read permission
/// needed, and the inode is already pinned so no symlink can be swapped in). Goes through the
/// `/proc/self/fd` magic link because `fchmod` refuses `O_PATH` fds and rustix has no
/// `fchmodat2`.
pub(crate) fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    match rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)) {
        Ok(()) => Ok(()),
        Err(Errno::BADF) => Ok(rustix::fs::chmod(
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
            Mode::from_raw_mode(mode),
        )?),
        Err(e) => Err(e.into()),
    }
}

/// Sets atime/mtime of the inode behind `fd` (possibly `O_PATH`), see [`chmod_fd`].
pub(crate) fn set_times_fd(fd: BorrowedFd<'_>, times: &rustix::fs::Timestamps) -> io::Result<()> {
    match rustix::fs::futimens(fd, times) {
        Ok(()) => Ok(()),
        Err(Errno::BADF) => Ok(rustix::fs::utimensat(
            rustix::fs::CWD,
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
            times,
            AtFlags::empty(),
        )?),
        Err(e) => Err(e.into()),
    }
}

/// Opens `name` in `dir` as an `O_PATH` fd without following it.
pub(crate) fn open_child_path(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Levels [`remove_tree_at`] descends before it moves a deeper directory up into the top of
/// the tree being removed: a sandbox can nest directories far deeper than the descriptors a
/// process may hold (one per level), and its branch must still be removable.
const REMOVE_DEPTH: usize = 32;

/// Removes `name` from `dir`: a file or symlink is unlinked (never followed); a directory is
/// emptied first, whatever its depth, with at most [`REMOVE_DEPTH`] descriptors open.
/// Directories we may not read or write (mode `000`, like overlayfs's `work/work`) are made
/// accessible first, which works for their owner without privilege. A missing `name` is not
/// an error.
pub(crate) fn remove_tree_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let Some(st) = lstat_at(dir, name)? else {
        return Ok(());
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return unlink_entry(dir, name, AtFlags::empty());
    }
    let top = open_for_removal(dir, name, &st)?;
    let mut hoisted = 0;
    // Each pass empties what lies within REMOVE_DEPTH levels and moves deeper directories up
    // into `top`, where the next pass finds them.
    while empty_dir(top.as_fd(), top.as_fd(), 1, &mut hoisted)? {}
    unlink_entry(dir, name, AtFlags::REMOVEDIR)
}

fn unlink_entry(dir: BorrowedFd<'_>, name: &OsStr, flags: AtFlags) -> io::Result<()> {
    match rustix::fs::unlinkat(dir, name, flags) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Gives the owner `rwx` on the directory `name` of `dir` if it lacks any (needed to list,
/// empty and move it), then opens it.
fn open_for_removal(dir: BorrowedFd<'_>, name: &OsStr, st: &Stat) -> io::Result<OwnedFd> {
    if st.st_mode & 0o700 != 0o700 {
        let pinned = open_child_path(dir, name)?;
        chmod_fd(pinned.as_fd(), (st.st_mode & 0o7777) | 0o700)?;
    }
    open_child_dir(dir, name)
}

/// Removes the entries of `d` (at `depth` below `top`); returns true if it moved a directory
/// into `top` instead of descending into it.
fn empty_dir(
    top: BorrowedFd<'_>,
    d: BorrowedFd<'_>,
    depth: usize,
    hoisted: &mut u64,
) -> io::Result<bool> {
    let mut again = false;
    for name in sorted_names(d)? {
        let Some(st) = lstat_at(d, &name)? else {
            continue;
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            unlink_entry(d, &name, AtFlags::empty())?;
            continue;
        }
        let child = open_for_removal(d, &name, &st)?;
        if depth >= REMOVE_DEPTH {
            hoist(d, &name, top, hoisted)?;
            again = true;
            continue;
        }
        again |= empty_dir(top, child.as_fd(), depth + 1, hoisted)?;
        drop(child);
        unlink_entry(d, &name, AtFlags::REMOVEDIR)?;
    }
    Ok(again)
}

/// Moves the directory `name` of `d` into `top` under a fresh name.
fn hoist(d: BorrowedFd<'_>, name: &OsStr, top: BorrowedFd<'_>, n: &mut u64) -> io::Result<()> {
    loop {
        *n += 1;
        let to = format!(".lockbox-rm-{n}");
        match rustix::fs::renameat_with(d, name, top, &to, rustix::fs::RenameFlags::NOREPLACE) {
            Err(Errno::EXIST) => continue,
            done => return Ok(done?),
        }
    }
}

/// A directory of a tree that only lockbox writes now (a branch's upper layer once its
/// sandbox has ended, a `--max-disk` upper being imported, a flattened layer), opened so that
/// it can be used even when the sandbox took its owner's permissions away (`chmod 000 d`,
/// `chmod 300 d`). The sandbox's root is the invoking user, so lockbox owns those entries and
/// may chmod them without privilege: a directory lacking the permissions asked for gets them
/// while this handle lives (lookups, listing, `user.*` xattr reads and writes check the mode
/// at each call) and its own mode back when the handle is dropped (or the mode given to
/// [`OwnDir::set_mode`]). Root needs none of this and is never granted anything.
///
/// Limits: a lockbox killed while it holds such a handle leaves the directory with the
/// owner's permissions added, and two processes walking the same upper at once can see each
/// other's grants.
pub(crate) struct OwnDir {
    fd: OwnedFd,
    /// The mode to give the directory back, if it was changed.
    restore: Option<u32>,
}

/// What reading a directory needs: list it and look up its entries.
pub(crate) const READ: u32 = 0o500;
/// What changing a directory needs: also add and remove entries, set xattrs.
pub(crate) const WRITE: u32 = 0o700;

impl OwnDir {
    /// Opens a directory the caller named (the root of a layer) with the owner permissions
    /// `need` ([`READ`] or [`WRITE`]); symlinks in `path` are followed, as in [`open_root`].
    pub(crate) fn open_root(path: &Path, need: u32) -> io::Result<OwnDir> {
        match open_root(path) {
            Ok(fd) => OwnDir::ensure(fd, need),
            Err(e) if Errno::from_io_error(&e) == Some(Errno::ACCESS) => {
                let pinned = rustix::fs::open(
                    path,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                OwnDir::grant_pinned(pinned, need, e)
            }
            Err(e) => Err(e),
        }
    }

    /// Opens the directory entry `name` of `parent` (not followed) with the owner
    /// permissions `need`.
    pub(crate) fn open_child(
        parent: BorrowedFd<'_>,
        name: &OsStr,
        need: u32,
    ) -> io::Result<OwnDir> {
        match open_child_dir(parent, name) {
            Ok(fd) => OwnDir::ensure(fd, need),
            Err(e) if Errno::from_io_error(&e) == Some(Errno::ACCESS) => {
                OwnDir::grant_pinned(open_child_path(parent, name)?, need, e)
            }
            Err(e) => Err(e),
        }
    }

    /// Opens `rel` below the layer root `root` for reading, one component at a time (never
    /// following a symlink), granting access on the way as needed.
    pub(crate) fn open_path(root: &Path, rel: &Path) -> io::Result<OwnDir> {
        let mut dir = OwnDir::open_root(root, READ)?;
        for name in components(rel)? {
            // The parent's grant ends once the child is open: lookups in the child only need
            // the child's search permission.
            dir = OwnDir::open_child(dir.as_fd(), name, READ)?;
        }
        Ok(dir)
    }

    /// Grants `need` on an opened directory that lacks it (opening needs only `r`; lookups
    /// need `x`, changes `w`).
    fn ensure(fd: OwnedFd, need: u32) -> io::Result<OwnDir> {
        let st = rustix::fs::fstat(&fd)?;
        let mode = st.st_mode & 0o7777;
        let euid = rustix::process::geteuid().as_raw();
        if mode & need == need || euid == 0 || st.st_uid != euid {
            return Ok(OwnDir { fd, restore: None });
        }
        chmod_fd(fd.as_fd(), mode | need)?;
        Ok(OwnDir {
            fd,
            restore: Some(mode),
        })
    }

    /// Grants `need` on a directory we may not open, pinned by an `O_PATH` descriptor; if it
    /// is not ours, the error is `denied`.
    fn grant_pinned(pinned: OwnedFd, need: u32, denied: io::Error) -> io::Result<OwnDir> {
        let st = rustix::fs::fstat(&pinned)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(Errno::NOTDIR.into());
        }
        if st.st_uid != rustix::process::geteuid().as_raw() {
            return Err(denied);
        }
        let mode = st.st_mode & 0o7777;
        chmod_fd(pinned.as_fd(), mode | need)?;
        match reopen_dir(pinned.as_fd()) {
            Ok(fd) => Ok(OwnDir {
                fd,
                restore: Some(mode),
            }),
            Err(e) => {
                let _ = chmod_fd(pinned.as_fd(), mode);
                Err(e)
            }
        }
    }

    /// Sets the directory's mode: now, or when the handle is dropped if access was granted
    /// (the mode may forbid what the holder still does).
    pub(crate) fn set_mode(&mut self, mode: u32) -> io::Result<()> {
        match &mut self.restore {
            Some(restore) => {
                *restore = mode;
                Ok(())
            }
            None => chmod_fd(self.fd.as_fd(), mode),
        }
    }
}

impl From<OwnedFd> for OwnDir {
    /// A directory used as it is, never granted anything.
    fn from(fd: OwnedFd) -> OwnDir {
        OwnDir { fd, restore: None }
    }
}

impl AsFd for OwnDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for OwnDir {
    fn drop(&mut self) {
        if let Some(mode) = self.restore {
            // Best effort: we own the inode and changed its mode a moment ago.
            let _ = chmod_fd(self.fd.as_fd(), mode);
        }
    }
}

/// Opens the regular file `name` of `dir` (a directory of a tree only lockbox writes now, see
/// [`OwnDir`]) for reading, without following it, even if the sandbox made it unreadable: its
/// owner is granted `u+r` for the `open` and the mode is restored at once (reading an open
/// descriptor checks no permission).
pub(crate) fn open_own_file(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<std::fs::File> {
    let denied = match open_child_file(dir, name) {
        Err(e) if Errno::from_io_error(&e) == Some(Errno::ACCESS) => e,
        other => return other,
    };
    let pinned = open_child_path(dir, name)?;
    let st = rustix::fs::fstat(&pinned)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || st.st_uid != rustix::process::geteuid().as_raw()
    {
        return Err(denied);
    }
    let mode = st.st_mode & 0o7777;
    chmod_fd(pinned.as_fd(), mode | 0o400)?;
    // The magic link names exactly the pinned inode.
    let opened = rustix::fs::open(
        format!("/proc/self/fd/{}", pinned.as_raw_fd()),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    );
    let restored = chmod_fd(pinned.as_fd(), mode);
    let file = std::fs::File::from(opened?);
    restored?;
    Ok(file)
}

/// The path that names the entry `name` of the directory open as `dir`, short whatever the
/// directory's own path: for the calls that have no `*at` form (`lgetxattr`, `llistxattr`).
/// The `/proc/self/fd` magic link is followed; `name` itself is not, with the `l*` calls.
pub(crate) fn fd_path(dir: BorrowedFd<'_>, name: &OsStr) -> std::path::PathBuf {
    let mut p = OsString::from(format!("/proc/self/fd/{}/", dir.as_raw_fd()));
    p.push(name);
    p.into()
}

/// Splits a relative path into its parent (possibly empty) and last component.
pub(crate) fn split(rel: &Path) -> (&Path, &OsStr) {
    let parent = rel.parent().unwrap_or(Path::new(""));
    let name = rel.file_name().unwrap_or(rel.as_os_str());
    (parent, name)
}
