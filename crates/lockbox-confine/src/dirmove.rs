//! Renaming a directory of an overlay view as one renames it outside (issue 32).
//!
//! overlayfs moves a directory that has a lower part (it came from the workdir, or merges
//! with it) only with `redirect_dir=on`, which an unprivileged mount cannot have: Linux
//! refuses it with `userxattr` ("conflicting options") and without `userxattr` in a user
//! namespace ("redirect_dir requires permission to access trusted xattrs"). Such a
//! `rename(2)` fails with `EXDEV`, and so do `git mv dir`, Rust's `fs::rename` and Python's
//! `os.rename`; `mv` copies instead, which fails on a directory its owner cannot search.
//!
//! The command of a sandbox with a writable overlay installs [`filter`], which hands
//! `rename`, `renameat` and `renameat2` to this supervisor, a thread of the parent. For
//! each call it resolves the paths in the caller's own view (`/proc/PID/root`, `/cwd`,
//! `/fd`, with `RESOLVE_IN_ROOT`). A directory on an overlay that the kernel will not move
//! (found by asking it: moving the directory aside and back, which `EXDEV` refuses without
//! changing anything) is made movable first, with the same content: a new directory is
//! made beside it in the upper layer, every entry is moved into it (an entry overlayfs
//! will not move either is made the same way, recursively; a file is copied up by the
//! kernel, as any rename of it would), it takes the directory's owner, mode, times and
//! xattrs, and replaces it. Then the kernel runs the caller's call itself
//! (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`), with every check it makes of the caller: what the
//! supervisor did only changed how the layers hold the same tree. If a step fails, what was
//! moved goes back and the caller gets the kernel's `EXDEV`, as before.
//!
//! Limits (docs/cow.md): the directory's inode is new (a process with its cwd inside it is
//! left in a removed directory), hard links between the files moved out of the lower layer
//! are not kept, the work is proportional to the directory's size in the lower layer, and
//! another process of the sandbox sees the directory's entries move while it is under way.

use crate::error::SetupError;
use crate::sys::Errno;
use lockbox_netsup::sys::{self as sysnet, Notif};
use rustix::fs::{
    AtFlags, Mode, OFlags, RenameFlags, ResolveFlags, Statx, StatxFlags, Timespec, Timestamps,
};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;

/// `OVERLAYFS_SUPER_MAGIC`.
const OVERLAYFS_MAGIC: i64 = 0x794c_7630;
/// `RENAME_EXCHANGE`, `RENAME_WHITEOUT` (linux/fs.h).
const RENAME_EXCHANGE: u64 = 1 << 1;
const RENAME_WHITEOUT: u64 = 1 << 2;
/// The capabilities the thread keeps: reading a caller's memory and `/proc/PID/root`
/// (`CAP_SYS_PTRACE`), and, when lockbox runs as root, moving entries whatever their modes
/// and giving the new directories their owners (`CAP_CHOWN`, `CAP_DAC_OVERRIDE`,
/// `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`, `CAP_FSETID`).
const KEEP_CAPS: [u32; 6] = [0, 1, 2, 3, 4, 19];

/// The calls handed over.
#[cfg(target_arch = "x86_64")]
pub(crate) const RENAMES: [i64; 3] = [libc::SYS_rename, libc::SYS_renameat, libc::SYS_renameat2];
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const RENAMES: [i64; 2] = [libc::SYS_renameat, libc::SYS_renameat2];

/// Whether a notification is a rename of the native ABI (the network supervisor's listener
/// receives them too, under a network list).
pub(crate) fn is_rename(notif: &Notif) -> bool {
    notif.arch == crate::seccomp::AUDIT_ARCH && RENAMES.contains(&i64::from(notif.nr))
}

/// The seccomp filter of the sandboxed command that hands directory renames to the
/// supervisor. Every rename is handed over (a filter cannot read paths); a rename of
/// anything else goes on at once (`CONTINUE`).
pub fn filter() -> Vec<seccompiler::sock_filter> {
    use crate::bpf::{ins, JEQ_K, LD_W_ABS, RET_ALLOW, RET_K};
    // Calls of another ABI are left to the main filter, which kills them.
    let mut program = vec![
        ins(LD_W_ABS, 0, 0, 4),
        ins(JEQ_K, 1, 0, crate::seccomp::AUDIT_ARCH),
        ins(RET_K, 0, 0, RET_ALLOW),
        ins(LD_W_ABS, 0, 0, 0),
    ];
    for nr in RENAMES {
        program.push(ins(JEQ_K, 0, 1, nr as u32));
        program.push(ins(RET_K, 0, 0, sysnet::RET_USER_NOTIF));
    }
    program.push(ins(RET_K, 0, 0, RET_ALLOW));
    program
}

/// A running rename supervisor; dropping it stops the thread.
#[derive(Debug)]
pub(crate) struct Supervisor {
    stop: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // Closing our end wakes the thread's poll (POLLHUP).
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the supervisor thread; `channel` is our end of the socket on which the command
/// announces its listener (the network supervisor's handover, without resolver sockets).
pub(crate) fn start(channel: OwnedFd) -> Result<Supervisor, SetupError> {
    let err = |errno| SetupError::Supervise {
        what: "starting the directory rename supervisor",
        errno,
    };
    if !crate::sys::seccomp_action_available(sysnet::RET_USER_NOTIF) {
        return Err(SetupError::FeatureMissing {
            feature: "seccomp user notification",
            problem: "is not available (Linux 5.9 or newer is required)".into(),
            needed_for: "renaming directories of a --workdir view",
        });
    }
    sysnet::set_passcred(&channel).map_err(|e| err(e.into()))?;
    let (stop, stop_rx) =
        UnixStream::pair().map_err(|e| err(Errno(e.raw_os_error().unwrap_or(libc::EIO))))?;
    let (dropped_tx, dropped_rx) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("lockbox-rename".into())
        .spawn(move || {
            let dropped = sysnet::drop_thread_capabilities(&KEEP_CAPS);
            let ok = dropped.is_ok();
            let _ = dropped_tx.send(dropped);
            if !ok {
                return;
            }
            serve(&channel, &stop_rx);
        })
        .map_err(|e| err(Errno(e.raw_os_error().unwrap_or(libc::EAGAIN))))?;
    match dropped_rx.recv() {
        Ok(Ok(())) => Ok(Supervisor {
            stop: Some(stop),
            thread: Some(thread),
        }),
        Ok(Err(errno)) => {
            let _ = thread.join();
            Err(SetupError::Supervise {
                what: "dropping the rename supervisor's capabilities",
                errno: errno.into(),
            })
        }
        Err(_) => Err(err(Errno(libc::EIO))),
    }
}

/// Takes the listener of each command that announces one on `channel` (every command of a
/// sequence does) and answers their calls, until told to stop or every command is gone.
fn serve(channel: &OwnedFd, stop: &UnixStream) {
    let privileged = rustix::process::geteuid().is_root();
    let pollfd = |fd: i32| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut listeners: Vec<OwnedFd> = Vec::new();
    let mut announcing = true;
    let mut fds = Vec::new();
    loop {
        fds.clear();
        fds.push(pollfd(stop.as_raw_fd()));
        // A negative descriptor is skipped by poll(2).
        fds.push(pollfd(if announcing { channel.as_raw_fd() } else { -1 }));
        fds.extend(listeners.iter().map(|l| pollfd(l.as_raw_fd())));
        match crate::sys::poll(&mut fds, -1) {
            Ok(_) | Err(Errno(libc::EINTR)) => {}
            Err(_) => return,
        }
        if fds[0].revents != 0 {
            return;
        }
        // Newest first, so a listener that is gone can be removed in place.
        for (i, pfd) in fds[2..].iter().enumerate().rev() {
            if pfd.revents & libc::POLLIN != 0 {
                answer(&listeners[i], privileged);
            } else if pfd.revents != 0 {
                // POLLHUP: every process under that filter is gone.
                listeners.remove(i);
            }
        }
        let channel_events = fds[1].revents;
        if channel_events & libc::POLLIN != 0 {
            if let Some((listener, _)) = lockbox_netsup::accept_listener(channel, stop) {
                listeners.push(listener);
            }
        }
        if channel_events & (libc::POLLHUP | libc::POLLERR) != 0 {
            // The init closed its end: no command is to come.
            announcing = false;
        }
        if !announcing && listeners.is_empty() {
            return;
        }
    }
}

fn answer(listener: &OwnedFd, privileged: bool) {
    // An error: the caller died or was interrupted before we got the call.
    if let Ok(notif) = sysnet::notif_recv(listener) {
        let result = handle(listener, &notif, privileged);
        let _ = sysnet::notif_respond(listener, notif.id, result, result.is_ok());
    }
}

/// One side of a rename, as the caller's call names it.
struct Side {
    dirfd: i32,
    path: u64,
}

/// Makes the directories of the call movable where they need it, and says how the kernel
/// is to go on: `Ok` lets it run the call, `Err` fails the call with that errno (only when
/// a directory was made movable and could not be put back under its name).
pub(crate) fn handle(listener: &OwnedFd, notif: &Notif, privileged: bool) -> Result<i64, i32> {
    if !is_rename(notif) {
        return Ok(0);
    }
    let a = notif.args;
    let at = |fd: u64| fd as i32;
    let (old, new, flags) = match i64::from(notif.nr) {
        #[cfg(target_arch = "x86_64")]
        libc::SYS_rename => (
            Side {
                dirfd: libc::AT_FDCWD,
                path: a[0],
            },
            Side {
                dirfd: libc::AT_FDCWD,
                path: a[1],
            },
            0,
        ),
        libc::SYS_renameat | libc::SYS_renameat2 => (
            Side {
                dirfd: at(a[0]),
                path: a[1],
            },
            Side {
                dirfd: at(a[2]),
                path: a[3],
            },
            if i64::from(notif.nr) == libc::SYS_renameat2 {
                a[4] & 0xffff_ffff
            } else {
                0
            },
        ),
        _ => return Ok(0),
    };
    if flags & RENAME_WHITEOUT != 0 {
        return Ok(0);
    }
    let mut sides = vec![old];
    if flags & RENAME_EXCHANGE != 0 {
        sides.push(new);
    }
    for side in sides {
        let Some((parent, name)) = resolve(notif.pid, &side) else {
            continue;
        };
        // The pid we read from was still the caller's (its thread has not died).
        if !sysnet::notif_id_valid(listener, notif.id) {
            return Ok(0);
        }
        make_movable(&parent, &name, privileged, (listener, notif.id))?;
    }
    Ok(0)
}

/// The directory (opened `O_PATH`) and last component a side names, in the caller's view,
/// if it names a directory on an overlay; `None` leaves the call to the kernel.
fn resolve(pid: u32, side: &Side) -> Option<(OwnedFd, OsString)> {
    let path = read_path(pid, side.path)?;
    let (dir, name) = split(&path)?;
    let open_path = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root = rustix::fs::open(format!("/proc/{pid}/root"), open_path, Mode::empty()).ok()?;
    let full = if dir.first() == Some(&b'/') {
        dir.to_vec()
    } else {
        // A relative path: the caller's cwd or dirfd, by the name it has in the caller's
        // view (the sandbox's root is the root of its mount namespace, so the link reads
        // as the caller would), checked to be that very directory. A dirfd is copied with
        // `pidfd_getfd`: `/proc/PID/fd` of a non-dumpable caller (the runtime's agent) is
        // root's, closed to an unprivileged lockbox.
        let there = if side.dirfd == libc::AT_FDCWD {
            rustix::fs::open(format!("/proc/{pid}/cwd"), open_path, Mode::empty()).ok()?
        } else {
            let tid = pid as libc::pid_t;
            let pidfd = sysnet::pidfd_open(tid, true)
                .or_else(|_| sysnet::pidfd_open(tid, false))
                .ok()?;
            sysnet::pidfd_getfd(&pidfd, side.dirfd).ok()?
        };
        let link = format!("/proc/self/fd/{}", there.as_raw_fd());
        let base = rustix::fs::readlink(&link, Vec::new()).ok()?.into_bytes();
        let named = in_root(&root, &base)?;
        if !same_dir(&there, &named) {
            return None;
        }
        let mut full = base;
        full.push(b'/');
        full.extend_from_slice(dir);
        full
    };
    let parent = in_root(&root, &full)?;
    let fs = rustix::fs::fstatfs(&parent).ok()?;
    if fs.f_type != OVERLAYFS_MAGIC {
        return None;
    }
    let st = stat_at(parent.as_fd(), OsStr::from_bytes(name)).ok()?;
    (is_dir(&st) && caller_may_write(pid, &parent))
        .then(|| (parent, OsStr::from_bytes(name).to_owned()))
}

/// Whether the caller's mode bits let it write and search `dir`, as a rename from it needs:
/// the sandbox's command holds no capability, so its permission is the mode's (ACLs aside,
/// which only a call the kernel then refuses gets wrong). What the supervisor does is
/// undone by nothing, so it is not done for a call the kernel will refuse anyway.
fn caller_may_write(pid: u32, dir: &OwnedFd) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    // The filesystem ids: the fourth of the `Uid:` and `Gid:` lines.
    let id = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|ids| ids.split_whitespace().nth(3))
            .and_then(|v| v.parse::<u32>().ok())
    };
    let (Some(uid), Some(gid)) = (id("Uid:"), id("Gid:")) else {
        return false;
    };
    let Ok(st) = rustix::fs::statx(dir, "", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS) else {
        return false;
    };
    let mode = u32::from(st.stx_mode);
    let bits = if st.stx_uid == uid {
        mode >> 6
    } else if st.stx_gid == gid {
        mode >> 3
    } else {
        mode
    };
    bits & 0o3 == 0o3
}

/// `path` of the sandbox, resolved as the sandbox would: absolute symlinks and `..` stay
/// inside `root`.
fn in_root(root: &OwnedFd, path: &[u8]) -> Option<OwnedFd> {
    rustix::fs::openat2(
        root,
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()
}

fn same_dir(a: &OwnedFd, b: &OwnedFd) -> bool {
    let id = |fd: &OwnedFd| {
        rustix::fs::statx(
            fd,
            "",
            AtFlags::EMPTY_PATH,
            StatxFlags::INO | StatxFlags::MNT_ID,
        )
        .ok()
        .map(|s| (s.stx_dev_major, s.stx_dev_minor, s.stx_ino, s.stx_mnt_id))
    };
    matches!((id(a), id(b)), (Some(x), Some(y)) if x == y)
}

/// The directory part and last component of a path as `rename(2)` sees them (trailing
/// slashes name the same entry); `.` and `..` are left to the kernel.
fn split(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = path.iter().rposition(|&b| b != b'/')? + 1;
    let path = &path[..end];
    let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
        Some(0) => (&b"/"[..], &path[1..]),
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&b"."[..], path),
    };
    (name != b"." && name != b"..").then_some((dir, name))
}

/// The NUL-terminated string at `addr` of thread `pid` (at most `PATH_MAX` bytes), read a
/// page at a time so a string at the end of a mapping is read too.
fn read_path(pid: u32, addr: u64) -> Option<Vec<u8>> {
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < libc::PATH_MAX as usize {
        let n = (PAGE - at % PAGE) as usize;
        let mut buf = vec![0u8; n];
        sysnet::vm_read(pid as libc::pid_t, at, &mut buf).ok()?;
        if let Some(end) = buf.iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..end]);
            return (!out.is_empty()).then_some(out);
        }
        out.extend_from_slice(&buf);
        at += n as u64;
    }
    None
}

fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<Statx, Errno> {
    rustix::fs::statx(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
    .map_err(errno)
}

fn is_dir(st: &Statx) -> bool {
    u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno(e.raw_os_error())
}

/// What the moves share: the mount they stay on, whether modes stand in our way, and the
/// call they are for (a caller that died or was killed stops them: all goes back).
struct Ctx<'a> {
    mnt_id: u64,
    privileged: bool,
    uid: u32,
    listener: &'a OwnedFd,
    id: u64,
}

/// A name for a new directory beside `name` that nothing in the sandbox uses.
fn spare_name(dir: BorrowedFd<'_>) -> Result<OsString, Errno> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    for _ in 0..16 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = OsString::from(format!(".lockbox-rename.{}.{n}", std::process::id()));
        match stat_at(dir, &name) {
            Err(Errno(libc::ENOENT)) => return Ok(name),
            Ok(_) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno(libc::EEXIST))
}

/// Makes directory `name` of `parent` one the kernel moves, if it is not; the tree it
/// holds stays the same. `Err` only if it was rebuilt and could not take its name back.
fn make_movable(
    parent: &OwnedFd,
    name: &OsStr,
    privileged: bool,
    (listener, id): (&OwnedFd, u64),
) -> Result<(), i32> {
    let Ok(spare) = spare_name(parent.as_fd()) else {
        return Ok(());
    };
    // Ask the kernel: overlayfs refuses with EXDEV before it changes anything.
    match rename(parent, name, parent, &spare) {
        Ok(()) => {
            tracing::debug!(?name, step = "probe", "directory is movable");
            return rename(parent, &spare, parent, name).map_err(|Errno(e)| e);
        }
        Err(Errno(libc::EXDEV)) => {}
        Err(_) => return Ok(()),
    }
    let Ok(st) = stat_at(parent.as_fd(), name) else {
        return Ok(());
    };
    let ctx = Ctx {
        mnt_id: st.stx_mnt_id,
        privileged,
        uid: rustix::process::geteuid().as_raw(),
        listener,
        id,
    };
    if let Err(e) = rebuild(parent, name, parent, &spare, &st, &ctx) {
        tracing::debug!(?name, ?e, step = "rebuild", "directory left as it was");
        return Ok(());
    }
    rename(parent, &spare, parent, name).map_err(|Errno(e)| e)
}

fn rename(from: &OwnedFd, from_name: &OsStr, to: &OwnedFd, to_name: &OsStr) -> Result<(), Errno> {
    rustix::fs::renameat_with(from, from_name, to, to_name, RenameFlags::NOREPLACE).map_err(errno)
}

/// Opens directory `name` of `dir` for reading and changing; without privilege, a
/// directory of ours that its mode closes to us is opened up first (through `O_PATH`, so
/// a swapped entry cannot redirect the change). Returns the mode to restore, if changed.
fn open_dir(dir: &OwnedFd, name: &OsStr, ctx: &Ctx<'_>) -> Result<(OwnedFd, Option<u32>), Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let path = rustix::fs::openat(dir, name, OFlags::PATH | flags, Mode::empty()).map_err(errno)?;
    let st = rustix::fs::statx(
        &path,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
    .map_err(errno)?;
    if st.stx_mnt_id != ctx.mnt_id {
        return Err(Errno(libc::EXDEV));
    }
    let mode = u32::from(st.stx_mode) & 0o7777;
    let proc_path = format!("/proc/self/fd/{}", path.as_raw_fd());
    let opened = !ctx.privileged && st.stx_uid == ctx.uid && mode & 0o700 != 0o700;
    if opened {
        rustix::fs::chmod(&proc_path, Mode::from_raw_mode(mode | 0o700)).map_err(errno)?;
    }
    // Reopened through its magic link, which names that very directory.
    let reopen = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::open(&proc_path, reopen, Mode::empty()) {
        Ok(fd) => Ok((fd, opened.then_some(mode))),
        Err(e) => {
            if opened {
                let _ = rustix::fs::chmod(&proc_path, Mode::from_raw_mode(mode));
            }
            Err(errno(e))
        }
    }
}

/// Builds `to_name` of `to` as a directory the kernel moves holding what directory
/// `name` of `from` holds (moving every entry), with its owner, mode, times and xattrs,
/// then removes `name`. On failure everything is moved back and `to_name` removed.
fn rebuild(
    from: &OwnedFd,
    name: &OsStr,
    to: &OwnedFd,
    to_name: &OsStr,
    st: &Statx,
    ctx: &Ctx<'_>,
) -> Result<(), Errno> {
    let (src, restore) = open_dir(from, name, ctx)?;
    let made = rustix::fs::mkdirat(to, to_name, Mode::from_raw_mode(0o700))
        .map_err(errno)
        .and_then(|()| {
            rustix::fs::openat(
                to,
                to_name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(errno)
        });
    let dst = match made {
        Ok(dst) => dst,
        Err(e) => {
            let _ = rustix::fs::unlinkat(to, to_name, AtFlags::REMOVEDIR);
            put_mode(&src, restore);
            return Err(e);
        }
    };
    let moved = move_entries(&src, &dst, ctx)
        .and_then(|()| copy_attributes(st, &src, &dst))
        .and_then(|()| rustix::fs::unlinkat(from, name, AtFlags::REMOVEDIR).map_err(errno));
    if moved.is_err() {
        let _ = rustix::fs::fchmod(&dst, Mode::from_raw_mode(0o700));
        move_back(&dst, &src, ctx);
        let _ = rustix::fs::unlinkat(to, to_name, AtFlags::REMOVEDIR);
        put_mode(&src, restore);
    }
    moved
}

fn put_mode(dir: &OwnedFd, mode: Option<u32>) {
    if let Some(mode) = mode {
        let _ = rustix::fs::fchmod(dir, Mode::from_raw_mode(mode));
    }
}

fn entries(dir: &OwnedFd) -> Result<Vec<OsString>, Errno> {
    let mut out = Vec::new();
    let mut d = rustix::fs::Dir::read_from(dir).map_err(errno)?;
    while let Some(entry) = d.read() {
        let name = entry.map_err(errno)?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            out.push(OsString::from_vec(name));
        }
    }
    Ok(out)
}

/// Moves every entry of `src` into `dst`; a directory the kernel will not move is rebuilt.
fn move_entries(src: &OwnedFd, dst: &OwnedFd, ctx: &Ctx<'_>) -> Result<(), Errno> {
    for name in entries(src)? {
        if !sysnet::notif_id_valid(ctx.listener, ctx.id) {
            return Err(Errno(libc::ECANCELED));
        }
        let mut moved = rename(src, &name, dst, &name);
        if !matches!(moved, Err(Errno(libc::EXDEV | libc::EACCES))) {
            moved?;
            continue;
        }
        let st = stat_at(src.as_fd(), &name)?;
        if !is_dir(&st) || st.stx_mnt_id != ctx.mnt_id {
            return Err(moved.err().unwrap_or(Errno(libc::EXDEV)));
        }
        if moved == Err(Errno(libc::EACCES)) && !ctx.privileged {
            // A directory moving to another parent must be writable (its `..` changes).
            let (fd, restore) = open_dir(src, &name, ctx)?;
            moved = rename(src, &name, dst, &name);
            put_mode(&fd, restore);
        }
        match moved {
            Err(Errno(libc::EXDEV)) => rebuild(src, &name, dst, &name, &st, ctx)?,
            other => other?,
        }
    }
    Ok(())
}

/// Puts back what [`move_entries`] moved, merging into the directories still there. Best
/// effort: it runs after a failure, which it cannot make worse.
fn move_back(from: &OwnedFd, to: &OwnedFd, ctx: &Ctx<'_>) {
    let Ok(names) = entries(from) else {
        return;
    };
    for name in names {
        match rename(from, &name, to, &name) {
            Err(Errno(libc::EEXIST)) => {
                let (Ok((inner_from, _)), Ok((inner_to, _))) =
                    (open_dir(from, &name, ctx), open_dir(to, &name, ctx))
                else {
                    continue;
                };
                move_back(&inner_from, &inner_to, ctx);
                let _ = rustix::fs::unlinkat(from, &name, AtFlags::REMOVEDIR);
            }
            Err(e) => tracing::debug!(?name, ?e, step = "move back", "entry left in place"),
            Ok(()) => {}
        }
    }
}

/// Gives `dst` the owner, xattrs (ACLs among them), mode and times of `st` / `src`; the
/// mode after the content, so a directory closed to its owner can still be filled.
fn copy_attributes(st: &Statx, src: &OwnedFd, dst: &OwnedFd) -> Result<(), Errno> {
    let uid = rustix::fs::Uid::from_raw(st.stx_uid);
    let gid = rustix::fs::Gid::from_raw(st.stx_gid);
    rustix::fs::fchown(dst, Some(uid), Some(gid)).map_err(errno)?;
    let size = rustix::fs::flistxattr_query(src).map_err(errno)?;
    let mut names = vec![0u8; size];
    let n = rustix::fs::flistxattr(src, &mut names[..]).map_err(errno)?;
    for xname in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let xname = OsStr::from_bytes(xname);
        let size = rustix::fs::fgetxattr_query(src, xname).map_err(errno)?;
        let mut value = vec![0u8; size];
        let n = rustix::fs::fgetxattr(src, xname, &mut value[..]).map_err(errno)?;
        rustix::fs::fsetxattr(dst, xname, &value[..n], rustix::fs::XattrFlags::empty())
            .map_err(errno)?;
    }
    rustix::fs::fchmod(dst, Mode::from_raw_mode(u32::from(st.stx_mode) & 0o7777)).map_err(errno)?;
    let ts = |t: rustix::fs::StatxTimestamp| Timespec {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_nsec.into(),
    };
    rustix::fs::futimens(
        dst,
        &Timestamps {
            last_access: ts(st.stx_atime),
            last_modification: ts(st.stx_mtime),
        },
    )
    .map_err(errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_notifies_each_rename_and_ends_in_a_return() {
        let p = filter();
        let notifying = p
            .iter()
            .filter(|i| i.code == 0x06 && i.k == sysnet::RET_USER_NOTIF)
            .count();
        assert_eq!(notifying, RENAMES.len());
        for (i, ins) in p.iter().enumerate() {
            if ins.code & 0x07 == 0x05 {
                assert!(i + 1 + (ins.jt.max(ins.jf) as usize) < p.len(), "at {i}");
            }
        }
        assert_eq!(p.last().map(|i| i.code), Some(0x06));
    }

    #[test]
    fn split_takes_the_last_component_as_rename_does() {
        assert_eq!(split(b"src"), Some((&b"."[..], &b"src"[..])));
        assert_eq!(split(b"a/b/"), Some((&b"a"[..], &b"b"[..])));
        assert_eq!(split(b"/src"), Some((&b"/"[..], &b"src"[..])));
        assert_eq!(split(b"a/.."), None);
        assert_eq!(split(b"/"), None);
    }
}
