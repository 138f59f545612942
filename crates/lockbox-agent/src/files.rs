//! File operations inside the sandbox, resolved so that nothing leaves it: the path is
//! normalised lexically (a `..` above the start is refused), then opened with `openat2`:
//! relative paths `RESOLVE_BENEATH` the working directory (a symlink pointing out of it is
//! refused), absolute paths `RESOLVE_IN_ROOT` of the sandbox's root (absolute symlinks
//! stay inside). Magic links (`/proc/*/fd`, `/proc/*/root`) are never followed. The agent
//! runs behind the sandbox's Landlock rules, so writes to read-only places fail as they
//! would for any process in it. Errors are `errno`s; `EXDEV` means "outside".

use rustix::fs::{
    fstat, mkdirat, openat2, readlinkat, renameat_with, statat, unlinkat, AtFlags, Dir, FileType,
    Mode, OFlags, RenameFlags, ResolveFlags, Stat, XattrFlags,
};
use rustix::io::Errno;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::proto::EntryStat;
use std::collections::BTreeMap;

/// The two starting points of resolution.
pub(crate) struct Roots {
    root: OwnedFd,
    work: OwnedFd,
    work_path: String,
}

/// A resolved path: where to start, how, and the components below it.
struct Target<'a> {
    base: BorrowedFd<'a>,
    flags: ResolveFlags,
    comps: Vec<String>,
    display: String,
}

impl Roots {
    pub fn open() -> Result<Roots, Errno> {
        let dir = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let work_path = std::env::current_dir()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/".to_owned());
        Ok(Roots {
            root: rustix::fs::open("/", dir, Mode::empty())?,
            work: rustix::fs::open(".", dir, Mode::empty())?,
            work_path,
        })
    }

    pub fn work_path(&self) -> &str {
        &self.work_path
    }

    fn target(&self, path: &str) -> Result<Target<'_>, Errno> {
        if path.is_empty() || path.contains('\0') {
            return Err(Errno::INVAL);
        }
        let absolute = path.starts_with('/');
        let mut comps: Vec<String> = Vec::new();
        for c in path.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    if comps.pop().is_none() {
                        return Err(Errno::XDEV);
                    }
                }
                c => comps.push(c.to_owned()),
            }
        }
        let magic = ResolveFlags::NO_MAGICLINKS;
        let (base, flags, prefix) = if absolute {
            (self.root.as_fd(), ResolveFlags::IN_ROOT | magic, "")
        } else {
            (
                self.work.as_fd(),
                ResolveFlags::BENEATH | magic,
                self.work_path.trim_end_matches('/'),
            )
        };
        let display = format!("{prefix}/{}", comps.join("/"));
        Ok(Target {
            base,
            flags,
            comps,
            display,
        })
    }
}

/// How often a lookup is retried after a racing rename or mount (EAGAIN) before the
/// error is returned: a busy host mounts often, but not on every try.
const OPENAT2_RETRIES: u32 = 64;

impl Target<'_> {
    fn open(&self, comps: &[String], oflags: OFlags) -> Result<OwnedFd, Errno> {
        let rel = if comps.is_empty() {
            ".".to_owned()
        } else {
            comps.join("/")
        };
        // openat2 refuses O_PATH with flags other than O_DIRECTORY/O_NOFOLLOW/O_CLOEXEC.
        let extra = if oflags.contains(OFlags::PATH) {
            OFlags::CLOEXEC
        } else {
            OFlags::CLOEXEC | OFlags::NOCTTY
        };
        // With `..` in the lookup, the kernel answers EAGAIN when a rename or a mount
        // anywhere on the system raced it, and asks the caller to retry (openat2(2)).
        let mut tries = 0;
        loop {
            match openat2(
                self.base,
                rel.as_str(),
                oflags | extra,
                Mode::empty(),
                self.flags,
            ) {
                Err(Errno::AGAIN) if tries < OPENAT2_RETRIES => {
                    tries += 1;
                    std::thread::yield_now();
                }
                result => return result,
            }
        }
    }

    /// The parent directory (`O_PATH`) and the last name. The root itself has no name.
    fn parent(&self, create: bool) -> Result<(OwnedFd, &str), Errno> {
        let (name, dirs) = self.comps.split_last().ok_or(Errno::INVAL)?;
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        if !create {
            return Ok((self.open(dirs, dir_flags)?, name));
        }
        for i in 0..dirs.len() {
            match self.open(&dirs[..=i], dir_flags) {
                Ok(_) => {}
                Err(Errno::NOENT) => {
                    let parent = self.open(&dirs[..i], dir_flags)?;
                    match mkdirat(&parent, dirs[i].as_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok((self.open(dirs, dir_flags)?, name))
    }
}

impl Roots {
    /// Opens `path` (`O_PATH`, symlinks followed inside the sandbox): the descriptor and the
    /// path as the sandbox sees it.
    pub fn open_path(&self, path: &str) -> Result<(OwnedFd, String), Errno> {
        let t = self.target(path)?;
        let fd = t.open(&t.comps, OFlags::PATH)?;
        Ok((fd, t.display))
    }
}

/// A regular file opened for reading.
pub(crate) struct Opened {
    pub file: OwnedFd,
    /// Its size at open, or the bytes copied.
    pub size: u64,
    /// `file` is a copy made here (see [`open_read`]).
    pub copied: bool,
}

/// `statfs` magic numbers of the kernel's pseudo filesystems whose `st_size` says nothing
/// of the content (`/proc` says 0, `/sys` says 4096 whatever an attribute holds).
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYSFS_MAGIC: i64 = 0x6265_6572;

/// Whether `fd`'s `stat` size cannot be trusted as its length: 0 (procfs, or an empty
/// file, which reads the same either way) or a file on `/proc` or `/sys`.
fn unsized_file(fd: &OwnedFd, size: u64) -> bool {
    size == 0
        || rustix::fs::fstatfs(fd).is_ok_and(|fs| {
            // `f_type` is an i64 here, an i32 or u32 on some other targets.
            #[allow(clippy::useless_conversion)]
            let kind = i64::from(fs.f_type);
            kind == PROC_SUPER_MAGIC || kind == SYSFS_MAGIC
        })
}

/// Opens a regular file for reading. A file whose `stat` size is not its length (`/proc`,
/// `/sys`, or 0) is read here to its end, at most `max_unsized + 1` bytes (the caller
/// refuses more), into a memfd sent in its place: what such a file shows can depend on the
/// task that reads it (a `/proc/sys/kernel/hostname` read by the server shows the host's
/// name, not the sandbox's), so only a process inside the sandbox reads it.
pub(crate) fn open_read(roots: &Roots, path: &str, max_unsized: u64) -> Result<Opened, Errno> {
    let t = roots.target(path)?;
    let fd = t.open(&t.comps, OFlags::RDONLY | OFlags::NONBLOCK)?;
    let st = fstat(&fd)?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => return Err(Errno::ISDIR),
        _ => return Err(Errno::INVAL),
    }
    let size = st.st_size as u64;
    if !unsized_file(&fd, size) {
        return Ok(Opened {
            file: fd,
            size,
            copied: false,
        });
    }
    let copy = rustix::fs::memfd_create("lockbox-read", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut from = std::fs::File::from(fd);
    let mut to = std::fs::File::from(copy);
    let copied = std::io::copy(
        &mut std::io::Read::take(&mut from, max_unsized.saturating_add(1)),
        &mut to,
    )
    .map_err(io_errno)?;
    rustix::fs::seek(&to, rustix::fs::SeekFrom::Start(0))?;
    Ok(Opened {
        file: to.into(),
        size: copied,
        copied: true,
    })
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_io_error(&e).unwrap_or(Errno::IO)
}

/// A write in progress: the temporary file's directory and names.
pub(crate) struct PendingWrite {
    dir: OwnedFd,
    tmp: String,
    name: String,
    display: String,
}

/// Creates the temporary file of an atomic write.
pub(crate) fn write_begin(
    roots: &Roots,
    path: &str,
    mode: u32,
    create_parents: bool,
    xattrs: &BTreeMap<String, String>,
    token: u64,
) -> Result<(OwnedFd, PendingWrite), Errno> {
    if xattrs.keys().any(|name| !name.starts_with(USER_XATTRS)) {
        return Err(Errno::INVAL);
    }
    let t = roots.target(path)?;
    let (dir, name) = t.parent(create_parents)?;
    if let Ok(st) = statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            return Err(Errno::ISDIR);
        }
    }
    let tmp = format!(".{name}.lockbox-{token}.tmp");
    let dir = reopen_dir(&dir)?;
    let file = rustix::fs::openat(
        &dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(mode & 0o7777),
    )?;
    // The umask narrowed the mode; set exactly what was asked.
    let set = rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & 0o7777)).and_then(|()| {
        xattrs.iter().try_for_each(|(name, value)| {
            rustix::fs::fsetxattr(&file, name.as_str(), value.as_bytes(), XattrFlags::empty())
        })
    });
    if let Err(e) = set {
        let _ = unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        return Err(e);
    }
    let pending = PendingWrite {
        dir,
        tmp,
        name: name.to_owned(),
        display: t.display.clone(),
    };
    Ok((file, pending))
}

/// Renames the temporary file into place, or removes it.
pub(crate) fn write_end(w: PendingWrite, commit: bool) -> Result<Option<EntryStat>, Errno> {
    if !commit {
        unlinkat(&w.dir, w.tmp.as_str(), AtFlags::empty())?;
        return Ok(None);
    }
    if let Err(e) = renameat_with(
        &w.dir,
        w.tmp.as_str(),
        &w.dir,
        w.name.as_str(),
        RenameFlags::empty(),
    ) {
        let _ = unlinkat(&w.dir, w.tmp.as_str(), AtFlags::empty());
        return Err(e);
    }
    let st = statat(&w.dir, w.name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(Some(entry(&w.dir, &w.name, w.display, &st)))
}

/// Stats a path without following a final symlink.
pub(crate) fn stat(roots: &Roots, path: &str) -> Result<EntryStat, Errno> {
    let t = roots.target(path)?;
    if t.comps.is_empty() {
        let fd = t.open(&[], OFlags::PATH | OFlags::DIRECTORY)?;
        let st = fstat(&fd)?;
        return Ok(entry(&fd, "", t.display.clone(), &st));
    }
    let (dir, name) = t.parent(false)?;
    let st = statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(entry(&dir, name, t.display.clone(), &st))
}

/// Creates a directory.
pub(crate) fn mkdir(roots: &Roots, path: &str, parents: bool) -> Result<EntryStat, Errno> {
    let t = roots.target(path)?;
    let (dir, name) = t.parent(parents)?;
    match mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
        Ok(()) => {}
        Err(Errno::EXIST) if parents => {
            let st = statat(&dir, name, AtFlags::empty())?;
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                return Err(Errno::EXIST);
            }
        }
        Err(e) => return Err(e),
    }
    let st = statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(entry(&dir, name, t.display.clone(), &st))
}

/// A real descriptor of the directory `dir` (an `O_PATH` one) refers to: an `O_PATH`
/// descriptor cannot be a base for creating, reading or removing entries.
fn reopen_dir(dir: &OwnedFd) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Removes an entry (a directory only if empty or `recursive`).
pub(crate) fn remove(roots: &Roots, path: &str, recursive: bool) -> Result<(), Errno> {
    let t = roots.target(path)?;
    let (dir, name) = t.parent(false)?;
    let dir = reopen_dir(&dir)?;
    let st = statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return unlinkat(&dir, name, AtFlags::empty());
    }
    if recursive {
        remove_contents(&dir, name)?;
    }
    unlinkat(&dir, name, AtFlags::REMOVEDIR)
}

fn remove_contents(parent: &OwnedFd, name: &str) -> Result<(), Errno> {
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let names = dir_names(&fd)?;
    for n in names {
        let st = statat(&fd, n.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            remove_contents(&fd, &n)?;
            unlinkat(&fd, n.as_str(), AtFlags::REMOVEDIR)?;
        } else {
            unlinkat(&fd, n.as_str(), AtFlags::empty())?;
        }
    }
    Ok(())
}

/// Renames `from` to `to`.
pub(crate) fn rename(
    roots: &Roots,
    from: &str,
    to: &str,
    overwrite: bool,
) -> Result<EntryStat, Errno> {
    let f = roots.target(from)?;
    let t = roots.target(to)?;
    let (fdir, fname) = f.parent(false)?;
    let (tdir, tname) = t.parent(false)?;
    let flags = if overwrite {
        RenameFlags::empty()
    } else {
        RenameFlags::NOREPLACE
    };
    renameat_with(&fdir, fname, &tdir, tname, flags)?;
    let st = statat(&tdir, tname, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(entry(&tdir, tname, t.display.clone(), &st))
}

/// Lists a directory into `out` as JSON lines; returns the count.
pub(crate) fn list(
    roots: &Roots,
    path: &str,
    recursive: bool,
    hidden: bool,
    out: &mut impl Write,
) -> Result<u64, Errno> {
    let t = roots.target(path)?;
    let fd = t.open(&t.comps, OFlags::RDONLY | OFlags::DIRECTORY)?;
    let mut count = 0;
    list_dir(&fd, &t.display, recursive, hidden, out, &mut count)?;
    Ok(count)
}

fn list_dir(
    fd: &OwnedFd,
    display: &str,
    recursive: bool,
    hidden: bool,
    out: &mut impl Write,
    count: &mut u64,
) -> Result<(), Errno> {
    let mut names = dir_names(fd)?;
    names.sort();
    for name in names {
        if !hidden && name.starts_with('.') {
            continue;
        }
        let Ok(st) = statat(fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue; // removed meanwhile
        };
        let path = format!("{}/{name}", display.trim_end_matches('/'));
        let e = entry(fd, &name, path.clone(), &st);
        let line = serde_json::to_vec(&e).map_err(|_| Errno::INVAL)?;
        out.write_all(&line)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::IO))?;
        *count += 1;
        if recursive && e.kind == "dir" {
            if let Ok(sub) = rustix::fs::openat(
                fd,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                list_dir(&sub, &path, recursive, hidden, out, count)?;
            }
        }
    }
    Ok(())
}

fn dir_names(fd: &OwnedFd) -> Result<Vec<String>, Errno> {
    let mut names = Vec::new();
    for e in Dir::read_from(fd)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    Ok(names)
}

fn entry(dir: &impl AsFd, name: &str, path: String, st: &Stat) -> EntryStat {
    let ft = FileType::from_raw_mode(st.st_mode);
    let kind = match ft {
        FileType::RegularFile => "file",
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        _ => "other",
    };
    let target = (ft == FileType::Symlink)
        .then(|| readlinkat(dir, name, Vec::new()).ok())
        .flatten()
        .map(|t| t.to_string_lossy().into_owned());
    let xattrs = match ft {
        FileType::RegularFile | FileType::Directory => user_xattrs(dir, name),
        _ => BTreeMap::new(),
    };
    EntryStat {
        path,
        kind: kind.to_owned(),
        size: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        mtime: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec as u32,
        target,
        xattrs,
    }
}

/// The namespace of the extended attributes the agent reads and writes: those a process
/// without capabilities may set (xattr(7)).
const USER_XATTRS: &str = "user.";

/// The `user.` extended attributes of `name` in `dir` (`""`: `dir` itself) whose values
/// are UTF-8. Read through a descriptor of the entry (opened without following a symlink
/// swapped in since its stat); none if it cannot be opened (no read permission).
fn user_xattrs(dir: &impl AsFd, name: &str) -> BTreeMap<String, String> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let Ok(fd) = rustix::fs::openat(
        dir,
        if name.is_empty() { "." } else { name },
        flags | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return BTreeMap::new();
    };
    let mut names = vec![0u8; 4096];
    let Ok(n) = rustix::fs::flistxattr(&fd, &mut names[..]) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    let mut value = vec![0u8; 4096];
    for xname in names[..n].split(|&b| b == 0) {
        let Ok(xname) = std::str::from_utf8(xname) else {
            continue;
        };
        if !xname.starts_with(USER_XATTRS) {
            continue;
        }
        // A value larger than 4 KiB is not metadata to show in a listing.
        if let Ok(len) = rustix::fs::fgetxattr(&fd, xname, &mut value[..]) {
            if let Ok(v) = std::str::from_utf8(&value[..len]) {
                out.insert(xname.to_owned(), v.to_owned());
            }
        }
    }
    out
}
