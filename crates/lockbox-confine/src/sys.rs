//! The raw syscall layer: the only module of lockbox that uses `unsafe`.
//!
//! One small safe function per kernel call. Every function here is safe to call in the
//! child of a `clone` made by a multi-threaded process: none allocates, locks or logs.
//! Paths are `&CStr` built by the caller before the clone.
//!
//! Descriptors: calls made by the parent take `BorrowedFd` and return `OwnedFd`; calls the
//! init and the command child make still pass `RawFd`, because `child` manages its
//! descriptors by number (it closes them by hand, and `close_range` the rest). The socket
//! calls use rustix (its Linux backend makes the syscall directly: no allocation, no lock,
//! safe after the clone); `Errno` stays ours, as `child` reports it in a record.

use rustix::net;
use std::ffi::CStr;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::ptr;

/// An `errno` value returned by a failed syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    fn last() -> Errno {
        // SAFETY: __errno_location returns this thread's errno slot, always valid.
        Errno(unsafe { *libc::__errno_location() })
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

fn check(rc: libc::c_long) -> Result<libc::c_long, Errno> {
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(rc)
    }
}

fn check_int(rc: libc::c_int) -> Result<libc::c_int, Errno> {
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(rc)
    }
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno(e.raw_os_error())
}

fn opt_ptr(s: Option<&CStr>) -> *const libc::c_char {
    s.map_or(ptr::null(), CStr::as_ptr)
}

/// Result of [`clone3_fork`].
#[derive(Debug)]
pub enum Forked {
    /// We are the new child.
    Child,
    /// We are the parent; the child has this pid and pidfd.
    Parent {
        /// The child's pid (in our pid namespace).
        pid: libc::pid_t,
        /// A pidfd for the child, close-on-exec.
        pidfd: RawFd,
    },
}

/// `clone3(2)` with fork semantics (no new stack) and `CLONE_PIDFD`.
pub fn clone3_fork(flags: u64) -> Result<Forked, Errno> {
    let mut pidfd: libc::c_int = -1;
    let mut args: libc::clone_args = libc::clone_args {
        flags: flags | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        stack: 0,
        stack_size: 0,
        tls: 0,
        set_tid: 0,
        set_tid_size: 0,
        cgroup: 0,
    };
    // SAFETY: `args` is a valid clone_args of the size passed; with no stack the child
    // continues on a copy of our stack, like fork(2). `pidfd` outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    match check(rc)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent {
            pid: pid as libc::pid_t,
            pidfd,
        }),
    }
}

/// Runs `run(arg)` in a child that shares our memory, on `stack`, while we are suspended
/// until it calls `execve` or exits (`CLONE_VM | CLONE_VFORK`, as posix_spawn does): no page
/// tables are copied. Returns the child's pid.
///
/// `run` must end in `execve` or [`exit`], and write nothing but its own stack (and errno).
pub fn spawn_vfork<T>(stack: &mut [u8], run: fn(&T) -> !, arg: &T) -> Result<libc::pid_t, Errno> {
    clone_on(stack, run, arg, libc::CLONE_VM | libc::CLONE_VFORK)
}

/// Runs `run(arg)` in a child that shares our memory and descriptor table, on `stack`,
/// *alongside* us (`CLONE_VM | CLONE_FILES`, no `CLONE_VFORK`): work done in parallel with
/// ours, without copying page tables. Returns the child's pid; reap it with [`wait4`]
/// before `stack` or `arg` go away.
///
/// `run` must end in [`exit`], and write nothing but its own stack and atomics in `arg`.
pub fn spawn_alongside<T: Sync>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
) -> Result<libc::pid_t, Errno> {
    clone_on(stack, run, arg, libc::CLONE_VM | libc::CLONE_FILES)
}

/// `clone(flags | SIGCHLD)` of a child that runs `run(arg)` on `stack`. The child finds
/// `run` and `arg` at the top of its own stack (ours may have moved on by the time it runs
/// unless `CLONE_VFORK` suspends us); the caller keeps `stack` and `arg` alive until the
/// child has exited or exec'd.
fn clone_on<T>(
    stack: &mut [u8],
    run: fn(&T) -> !,
    arg: &T,
    flags: libc::c_int,
) -> Result<libc::pid_t, Errno> {
    struct Start<'a, T> {
        run: fn(&T) -> !,
        arg: &'a T,
    }
    extern "C" fn entry<T>(start: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `start` points into the child's stack (below), which the caller keeps
        // alive and untouched until the child has exited or exec'd.
        let start = unsafe { &*(start as *const Start<'_, T>) };
        (start.run)(start.arg)
    }
    let slot = std::mem::size_of::<Start<'_, T>>().next_multiple_of(16);
    if stack.len() < slot + 4096 {
        return Err(Errno(libc::EINVAL));
    }
    // The stack grows down on every architecture lockbox supports; align the top to 16.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let start_at = (top - slot) as *mut Start<'_, T>;
    // SAFETY: `start_at` is 16-aligned and inside `stack`, which is live and writable.
    unsafe { start_at.write(Start { run, arg }) };
    // SAFETY: the child runs on `stack` below its `Start`, which the caller keeps alive
    // (and `arg` with it) until the child has exited or exec'd.
    let rc = unsafe {
        libc::clone(
            entry::<T>,
            start_at as *mut libc::c_void,
            flags | libc::SIGCHLD,
            start_at as *mut libc::c_void,
        )
    };
    check_int(rc)
}

/// `mount(2)`.
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> Result<(), Errno> {
    // SAFETY: all pointers are live C strings or null; mount(2) does not keep them.
    let rc = unsafe {
        libc::mount(
            opt_ptr(source),
            target.as_ptr(),
            opt_ptr(fstype),
            flags,
            opt_ptr(data).cast(),
        )
    };
    check_int(rc).map(drop)
}

/// `umount2(target, MNT_DETACH)`.
pub fn umount_detach(target: &CStr) -> Result<(), Errno> {
    // SAFETY: `target` is a live C string.
    check_int(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

/// `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`: a detached copy of the mount tree at `path`.
pub fn open_tree_clone(path: &CStr) -> Result<RawFd, Errno> {
    // SAFETY: `path` is a live C string; the returned fd is owned by the caller.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    check(rc).map(|fd| fd as RawFd)
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH [| AT_RECURSIVE])` making the mount(s) read-only,
/// nosuid and nodev.
pub fn mount_set_readonly(fd: RawFd, recursive: bool) -> Result<(), Errno> {
    let mut attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = libc::AT_EMPTY_PATH as libc::c_uint | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `attr` is a valid mount_attr of the size passed; "" is a static C string.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c"".as_ptr(),
            flags,
            &mut attr as *mut MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc).map(drop)
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attach a detached tree.
pub fn move_mount_to(fd: RawFd, target: &CStr) -> Result<(), Errno> {
    // SAFETY: pointers are live C strings; `fd` is a mount fd owned by the caller.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(rc).map(drop)
}

/// `pivot_root(".", ".")`: the current directory becomes the root, the old root is stacked
/// on top of it and must then be detached with `umount2(".", MNT_DETACH)`.
pub fn pivot_root_here() -> Result<(), Errno> {
    // SAFETY: static C strings.
    let rc = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    check(rc).map(drop)
}

/// `open(path, flags, mode)`.
pub fn open(path: &CStr, flags: libc::c_int, mode: libc::mode_t) -> Result<RawFd, Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode) })
}

/// `mkdir(path, mode)`; an existing entry is not an error.
pub fn mkdir_exist_ok(path: &CStr, mode: libc::mode_t) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    match check_int(unsafe { libc::mkdir(path.as_ptr(), mode) }) {
        Err(Errno(libc::EEXIST)) | Ok(_) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `chmod(path, mode)` (mkdir's mode is filtered by the umask; this is not).
pub fn chmod(path: &CStr, mode: libc::mode_t) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::chmod(path.as_ptr(), mode) }).map(drop)
}

/// `rmdir(path)`.
pub fn rmdir(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::rmdir(path.as_ptr()) }).map(drop)
}

/// Creates an overlayfs whiteout (a 0/0 character device; unprivileged since Linux 5.8).
pub fn mknod_whiteout(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR, 0) }).map(drop)
}

/// `symlink(target, path)`; an existing entry is not an error.
pub fn symlink_exist_ok(target: &CStr, path: &CStr) -> Result<(), Errno> {
    // SAFETY: both are live C strings.
    match check_int(unsafe { libc::symlink(target.as_ptr(), path.as_ptr()) }) {
        Err(Errno(libc::EEXIST)) | Ok(_) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes all of `data` to `fd`.
pub fn write_all(fd: RawFd, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        // SAFETY: `data` is a live slice of the given length.
        let rc = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
        match check(rc as libc::c_long) {
            Ok(n) => data = &data[n as usize..],
            Err(Errno(libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates (or truncates) `path` with `mode` and writes `data` to it.
pub fn write_file(path: &CStr, data: &[u8], mode: libc::mode_t) -> Result<(), Errno> {
    let fd = open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, mode)?;
    let result = write_all(fd, data);
    close(fd);
    result
}

/// `read(2)` into `buf`, retrying on EINTR.
pub fn read(fd: RawFd, buf: &mut [u8]) -> Result<usize, Errno> {
    loop {
        // SAFETY: `buf` is a live, writable slice of the given length.
        let rc = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        match check(rc as libc::c_long) {
            Err(Errno(libc::EINTR)) => continue,
            other => return other.map(|n| n as usize),
        }
    }
}

/// `dup2(old, new)`: `new` becomes a copy of `old` without `FD_CLOEXEC`.
pub fn dup2(old: RawFd, new: RawFd) -> Result<(), Errno> {
    // SAFETY: descriptor numbers only; no pointers.
    check_int(unsafe { libc::dup2(old, new) }).map(drop)
}

/// `close(2)`, ignoring errors (there is nothing useful to do about them).
pub fn close(fd: RawFd) {
    // SAFETY: the caller owns `fd` and does not use it afterwards.
    unsafe { libc::close(fd) };
}

/// Whether the directory `path` is empty and has permission bits `mode` (`stat` and one
/// `getdents64`).
pub fn is_empty_dir_with_mode(path: &CStr, mode: libc::mode_t) -> Result<bool, Errno> {
    let fd = open(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    // SAFETY: stat is plain data; `st` is a valid out pointer for fstat on our descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let stat = check_int(unsafe { libc::fstat(fd, &mut st) });
    // Room for ".", ".." and one more entry: a third entry means not empty.
    let mut buf = [0u8; 1024];
    // SAFETY: `buf` is a live, writable buffer of the given length.
    let read =
        check(unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) });
    close(fd);
    stat?;
    let len = read? as usize;
    let mut entries = 0;
    let mut at = 0;
    while at + 19 <= len {
        // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
        let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
        if reclen == 0 {
            break;
        }
        entries += 1;
        at += reclen;
    }
    Ok(entries <= 2 && st.st_mode & 0o7777 == mode)
}

/// `close_range(first, last, 0)`; falls back to closing one by one on kernels before 5.9.
pub fn close_range(first: u32, last: u32) {
    // SAFETY: closing descriptors we do not use; no pointer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    if rc < 0 {
        for fd in first..=last.min(4096) {
            close(fd as RawFd);
        }
    }
}

/// A connected `AF_UNIX`/`SOCK_SEQPACKET` pair, close-on-exec: records keep their
/// boundaries and may carry descriptors; reads see EOF once every peer has closed.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), Errno> {
    net::socketpair(
        net::AddressFamily::UNIX,
        net::SocketType::SEQPACKET,
        net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(errno)
}

/// The most descriptors one message carries (a command's stdin, stdout and stderr).
pub const MAX_FDS: usize = 3;

/// Room for one `SCM_RIGHTS` control message with up to [`MAX_FDS`] descriptors, on the
/// stack (the child may not allocate).
const CMSG_SPACE: usize = rustix::cmsg_space!(ScmRights(MAX_FDS));
type CmsgSpace = [MaybeUninit<u8>; CMSG_SPACE];

/// Sends `data` with descriptor `fd` attached (`SCM_RIGHTS`), from the child.
pub fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> Result<(), Errno> {
    // SAFETY: the child owns both descriptors and keeps them open for the call.
    let (sock, fd) = unsafe { (BorrowedFd::borrow_raw(sock), BorrowedFd::borrow_raw(fd)) };
    send_with_fds(sock, data, &[fd])
}

/// Sends `data` with up to [`MAX_FDS`] descriptors attached (`SCM_RIGHTS`); a closed peer is
/// `EPIPE`, never `SIGPIPE`.
pub fn send_with_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), Errno> {
    let mut space: CmsgSpace = [MaybeUninit::uninit(); CMSG_SPACE];
    let mut control = net::SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(net::SendAncillaryMessage::ScmRights(fds)) {
        return Err(Errno(libc::EINVAL));
    }
    net::sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        net::SendFlags::NOSIGNAL,
    )
    .map(drop)
    .map_err(errno)
}

/// Receives one record into `buf`, and the descriptor it carries, if any (close-on-exec;
/// any further ones are closed).
pub fn recv_with_fd(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> Result<(usize, Option<OwnedFd>), Errno> {
    let mut first = None;
    let n = recv_each_fd(sock, buf, |fd| {
        first.get_or_insert(fd);
    })?;
    Ok((n, first))
}

/// Receives one record into `buf` and the descriptors it carries into `fds` (close-on-exec),
/// in the child; returns the record's length and how many descriptors came.
pub fn recv_with_fds(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut [RawFd; MAX_FDS],
) -> Result<(usize, usize), Errno> {
    // SAFETY: the child owns the socket and keeps it open for the call.
    let sock = unsafe { BorrowedFd::borrow_raw(sock) };
    let mut count = 0;
    let n = recv_each_fd(sock, buf, |fd| {
        if let Some(slot) = fds.get_mut(count) {
            *slot = fd.into_raw_fd();
            count += 1;
        }
    })?;
    Ok((n, count))
}

/// `recvmsg` of one record, handing each descriptor that came with it to `each`. No
/// allocation: the control buffer is on the stack.
fn recv_each_fd(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    mut each: impl FnMut(OwnedFd),
) -> Result<usize, Errno> {
    let mut space: CmsgSpace = [MaybeUninit::uninit(); CMSG_SPACE];
    let mut control = net::RecvAncillaryBuffer::new(&mut space);
    let msg = net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        net::RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(errno)?;
    for message in control.drain() {
        if let net::RecvAncillaryMessage::ScmRights(fds) = message {
            fds.for_each(&mut each);
        }
    }
    Ok(msg.bytes)
}

/// Sets `O_NONBLOCK` on `fd` (one `ioctl(FIONBIO)`, not `F_GETFL` and `F_SETFL`).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    rustix::io::ioctl_fionbio(fd, true).map_err(errno)
}

/// Clears `FD_CLOEXEC` so that `fd` survives `execve`.
pub fn clear_cloexec(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: fcntl on a descriptor number; no pointers.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }).map(drop)
}

/// `chdir(path)`.
pub fn chdir(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// `sethostname(name)`.
pub fn sethostname(name: &[u8]) -> Result<(), Errno> {
    // SAFETY: `name` is a live slice of the given length.
    check_int(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// `unshare(flags)`.
pub fn unshare(flags: libc::c_int) -> Result<(), Errno> {
    // SAFETY: no pointer arguments.
    check_int(unsafe { libc::unshare(flags) }).map(drop)
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> Result<(), Errno> {
    // SAFETY: creating a socket; no pointers.
    let sock = check_int(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: `req` is a valid ifreq naming "lo"; SIOCSIFFLAGS reads it.
    let rc = unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS, &mut req as *mut libc::ifreq) };
    close(sock);
    check_int(rc).map(drop)
}

/// Gives the loopback interface of the current network namespace the extra address
/// `addr`/8 (as `lo:53`). glibc's `AI_ADDRCONFIG` counts only IPv4 addresses other than
/// 127.0.0.1, so without it `getaddrinfo(AF_INET, AI_ADDRCONFIG)` (`getent ahostsv4`, and
/// clients asking for IPv4 that way) finds no name at all in a namespace with loopback only.
/// (No IPv6 counterpart: an IPv6 source address would make glibc sort IPv6 answers first,
/// and on hosts without IPv6 clients that try only the first address would fail.)
pub fn loopback_alias(addr: [u8; 4]) -> Result<(), Errno> {
    // SAFETY: creating a socket; no pointers.
    let sock = check_int(unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo:53\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: sockaddr_in fits in the ifreq's address union (sockaddr, 16 bytes); all-zero
    // is a valid sockaddr_in.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_addr.s_addr = u32::from_ne_bytes(addr);
    // SAFETY: both are 16-byte plain-old-data socket addresses.
    req.ifr_ifru.ifru_addr =
        unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sa) };
    // SAFETY: `req` is a valid ifreq naming "lo:53" with an AF_INET address; SIOCSIFADDR
    // reads it.
    let rc = unsafe { libc::ioctl(sock, libc::SIOCSIFADDR, &mut req as *mut libc::ifreq) };
    close(sock);
    check_int(rc).map(drop)
}

/// The sockets of the sandbox's resolver, made in the current network namespace:
/// (UDP, TCP listener), both non-blocking and close-on-exec, bound to `addr`:53 (IPv4).
/// Port 53 needs `CAP_NET_BIND_SERVICE` in the namespace's user namespace. Allocation-free.
pub fn dns_sockets(addr: [u8; 4]) -> Result<(RawFd, RawFd), Errno> {
    // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = 53u16.to_be();
    sa.sin_addr.s_addr = u32::from_ne_bytes(addr);
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    let bound = |ty: libc::c_int| -> Result<RawFd, Errno> {
        // SAFETY: no pointer arguments.
        let fd = check_int(unsafe { libc::socket(libc::AF_INET, ty | flags, 0) })?;
        let one: libc::c_int = 1;
        // SAFETY: `one` is a live c_int of the size given.
        let reuse = check_int(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        });
        let rc = reuse.and_then(|_| {
            // SAFETY: `sa` is a live sockaddr_in of `len` bytes; bind copies it.
            check_int(unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_in).cast(), len) })
        });
        match rc {
            Ok(_) => Ok(fd),
            Err(e) => {
                close(fd);
                Err(e)
            }
        }
    };
    let udp = bound(libc::SOCK_DGRAM)?;
    let tcp = bound(libc::SOCK_STREAM).and_then(|tcp| {
        // SAFETY: no pointer arguments.
        match check_int(unsafe { libc::listen(tcp, 16) }) {
            Ok(_) => Ok(tcp),
            Err(e) => {
                close(tcp);
                Err(e)
            }
        }
    });
    match tcp {
        Ok(tcp) => Ok((udp, tcp)),
        Err(e) => {
            close(udp);
            Err(e)
        }
    }
}

/// `prctl(option, arg2, 0, 0, 0)`.
pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> Result<libc::c_int, Errno> {
    // SAFETY: the options used by lockbox take integer arguments only.
    check_int(unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
}

/// `prctl(PR_SET_NAME, name)`: this thread's `comm` (at most 15 bytes are kept).
pub fn set_name(name: &CStr) -> Result<(), Errno> {
    // SAFETY: `name` is a live NUL-terminated string; the kernel copies at most 16 bytes.
    check_int(unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) }).map(drop)
}

/// Wipes the argument and environment strings the kernel put on our stack at `execve`
/// (where `layout`, read from `/proc/self/stat`, says they are), writing `title` (without
/// its NUL, truncated to leave the area's last byte a NUL) at the start of the first.
pub fn wipe_exec_strings(layout: &crate::proctitle::Layout, title: &[u8]) {
    let title = title.strip_suffix(b"\0").unwrap_or(title);
    for ((start, len), text) in [(layout.args(), title), (layout.env(), &[][..])] {
        let shown = text.len().min(len.saturating_sub(1));
        let at = start as usize as *mut u8;
        // SAFETY: a `Layout` is only made from /proc/self/stat, so these are the ranges of
        // our stack mapping that hold the execve strings (mapped writable for the life of
        // the process; a fork's copy keeps them). Nothing Rust owns lives there, and no
        // reference into them exists (std keeps raw argv pointers, which callers of this
        // function never read again). `text` is on the heap or in .rodata: no overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), at, shown);
            std::ptr::write_bytes(at.add(shown), 0, len - shown);
        }
    }
}

/// The current program break (`brk(0)`, which changes nothing).
pub fn current_brk() -> u64 {
    // SAFETY: brk(0) is below any valid break, so the kernel leaves the break where it is
    // and returns it.
    unsafe { libc::syscall(libc::SYS_brk, 0usize) as u64 }
}

/// `prctl(PR_SET_MM, PR_SET_MM_MAP, map)`: replaces the memory-layout fields the kernel
/// shows in `/proc` (no privilege needed unless `map.exe_fd` is set).
pub fn set_mm_map(map: &rustix::process::PrctlMmMap) -> Result<(), Errno> {
    // SAFETY: `map` is a live, fully initialised PrctlMmMap; the kernel copies it and
    // changes no mapping (only the addresses /proc reports, and where brk(2) starts from).
    unsafe { rustix::process::configure_virtual_memory_map(map) }.map_err(errno)
}

/// Drops every capability: bounding set, ambient set, and the effective, permitted and
/// inheritable sets, and locks securebits so that an `execve` as uid 0 regains none.
pub fn drop_all_capabilities(last_cap: u32) -> Result<(), Errno> {
    for cap in 0..=last_cap {
        match prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong) {
            Ok(_) | Err(Errno(libc::EINVAL)) => {}
            Err(e) => return Err(e),
        }
    }
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    )?;
    // SECBIT_NOROOT | SECBIT_NO_SETUID_FIXUP | SECBIT_KEEP_CAPS_LOCKED |
    // SECBIT_NO_CAP_AMBIENT_RAISE and each one's lock bit (capabilities(7)).
    const SECUREBITS: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
    prctl(libc::PR_SET_SECUREBITS, SECUREBITS)?;
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: header and the two data words are valid for capset(2) version 3.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    check(rc).map(drop)
}

/// `setrlimit(resource, {value, value})`.
pub fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Result<(), Errno> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `limit` is a valid rlimit.
    check_int(unsafe { libc::setrlimit(resource, &limit) }).map(drop)
}

/// `getrlimit(resource)`: (soft, hard), `RLIM_INFINITY` for none.
pub fn get_rlimit(resource: libc::__rlimit_resource_t) -> Result<(u64, u64), Errno> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a live, writable rlimit.
    check_int(unsafe { libc::getrlimit(resource, &mut limit) })?;
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// `landlock_create_ruleset(attr, size, flags)`.
pub fn landlock_create_ruleset(attr: Option<&[u8]>, flags: u32) -> Result<RawFd, Errno> {
    let (ptr, len) = attr.map_or((ptr::null(), 0), |a| (a.as_ptr(), a.len()));
    // SAFETY: `ptr` is null or a live buffer of `len` bytes holding a landlock_ruleset_attr.
    let rc = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, ptr, len, flags) };
    check(rc).map(|fd| fd as RawFd)
}

/// `landlock_add_rule(ruleset, LANDLOCK_RULE_PATH_BENEATH, {access, parent_fd})`.
pub fn landlock_add_path_rule(ruleset: RawFd, parent: RawFd, access: u64) -> Result<(), Errno> {
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    let attr = PathBeneath {
        allowed_access: access,
        parent_fd: parent,
    };
    // SAFETY: `attr` is a valid, packed landlock_path_beneath_attr.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            1,
            &attr as *const PathBeneath,
            0,
        )
    };
    check(rc).map(drop)
}

/// `landlock_restrict_self(ruleset, 0)`.
pub fn landlock_restrict_self(ruleset: RawFd) -> Result<(), Errno> {
    // SAFETY: no pointer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) };
    check(rc).map(drop)
}

/// Installs a seccomp BPF filter on the calling thread.
pub fn seccomp_set_filter(program: &[seccompiler::sock_filter]) -> Result<(), Errno> {
    let prog = libc::sock_fprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: seccompiler's sock_filter has the kernel's layout; `prog` points into a live
    // slice; the kernel copies the program.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    check(rc).map(drop)
}

/// `seccomp(SECCOMP_GET_ACTION_AVAIL, action)`: whether the kernel knows a filter action.
pub fn seccomp_action_available(action: u32) -> bool {
    // SAFETY: `action` outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        )
    };
    rc == 0
}

/// `execve(path, argv, envp)`; returns only on failure.
pub fn execve(
    path: &CStr,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> Errno {
    // SAFETY: `path` is a live C string; `argv`/`envp` are null-terminated arrays of live
    // C strings built before the fork (see `CStringArray`).
    unsafe { libc::execve(path.as_ptr(), argv, envp) };
    Errno::last()
}

/// `_exit(code)`: leaves without running destructors or atexit handlers (which may lock).
pub fn exit(code: i32) -> ! {
    // SAFETY: _exit never returns and is async-signal-safe.
    unsafe { libc::_exit(code) }
}

/// A set of signals.
#[derive(Clone, Copy)]
pub struct SigSet(libc::sigset_t);

impl std::fmt::Debug for SigSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigSet")
    }
}

impl SigSet {
    /// A set holding `signals`.
    pub fn of(signals: &[libc::c_int]) -> SigSet {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t.
        unsafe { libc::sigemptyset(&mut set) };
        for &sig in signals {
            // SAFETY: `set` is initialised; invalid signal numbers only return EINVAL.
            unsafe { libc::sigaddset(&mut set, sig) };
        }
        SigSet(set)
    }

    /// The empty set.
    pub fn empty() -> SigSet {
        SigSet::of(&[])
    }
}

/// `sigprocmask(how, set)`; returns the previous mask.
pub fn sigprocmask(how: libc::c_int, set: &SigSet) -> Result<SigSet, Errno> {
    let mut old = SigSet::empty();
    // SAFETY: both sets are valid sigset_t values.
    let rc = unsafe { libc::pthread_sigmask(how, &set.0, &mut old.0) };
    if rc != 0 {
        return Err(Errno(rc));
    }
    Ok(old)
}

/// Resets `SIGPIPE` and `SIGXFSZ` to their defaults. `execve` resets caught signals itself
/// but keeps ignored ones: the Rust runtime ignores `SIGPIPE`, and CPython (the Python
/// SDK's host process) `SIGXFSZ` too, which would turn `--max-file-size` from a kill into a
/// write error. Signals a caller ignores on purpose (as `nohup` does with `SIGHUP`) stay
/// ignored, as with any exec.
pub fn reset_runtime_signals() {
    for sig in [libc::SIGPIPE, libc::SIGXFSZ] {
        // SAFETY: setting SIG_DFL is always valid.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// `signalfd(-1, set, SFD_CLOEXEC)`.
pub fn signalfd(set: &SigSet) -> Result<RawFd, Errno> {
    // SAFETY: `set` is a valid sigset_t.
    check_int(unsafe { libc::signalfd(-1, &set.0, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) })
}

/// A signal read from a signalfd: (signal number, si_code, sender pid).
pub fn read_signalfd(fd: RawFd) -> Result<Option<(i32, i32, u32)>, Errno> {
    // SAFETY: signalfd_siginfo is plain data.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a writable buffer of its own size.
    let buf = unsafe {
        std::slice::from_raw_parts_mut(
            (&mut info as *mut libc::signalfd_siginfo).cast::<u8>(),
            std::mem::size_of::<libc::signalfd_siginfo>(),
        )
    };
    match read(fd, buf) {
        Ok(0) | Err(Errno(libc::EAGAIN)) => Ok(None),
        Ok(_) => Ok(Some((info.ssi_signo as i32, info.ssi_code, info.ssi_pid))),
        Err(e) => Err(e),
    }
}

/// `kill(pid, sig)`.
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> Result<(), Errno> {
    // SAFETY: no pointer arguments.
    check_int(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// `pidfd_send_signal(pidfd, sig, NULL, 0)`. (Not rustix's: its `Signal` has no
/// real-time signals, which a caller may forward.)
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> Result<(), Errno> {
    // SAFETY: a null siginfo is allowed; no other pointers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    check(rc).map(drop)
}

/// `pidfd_open(getpid(), 0)`: a descriptor of this process (the whole thread group), which
/// polls readable once every thread of it has exited; close-on-exec.
pub fn pidfd_of_self() -> Result<OwnedFd, Errno> {
    // SAFETY: getpid cannot fail; pidfd_open takes no pointers.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    check(rc).map(|fd| owned(fd as RawFd))
}

/// `waitpid(-1, WNOHANG)`: Some((pid, status)) for a reaped child.
pub fn reap_any() -> Result<Option<(libc::pid_t, libc::c_int)>, Errno> {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer.
    match check_int(unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) })? {
        0 => Ok(None),
        pid => Ok(Some((pid, status))),
    }
}

/// `waitpid(-1, 0)`: blocks until any child exits; `ECHILD` when none is left.
pub fn wait_any() -> Result<libc::pid_t, Errno> {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer.
    check_int(unsafe { libc::waitpid(-1, &mut status, 0) })
}

/// `getrusage(RUSAGE_CHILDREN)`: (user + system microseconds, max RSS in KiB) of every
/// child waited for.
pub fn children_usage() -> (u64, u32) {
    // SAFETY: rusage is plain data.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (
        us(usage.ru_utime) + us(usage.ru_stime),
        usage.ru_maxrss as u32,
    )
}

/// `waitpid(pid, WNOHANG)`: whether `pid` has been reaped now.
pub fn try_reap(pid: libc::pid_t) -> bool {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    rc == pid || rc < 0
}

/// `wait4(pid, 0)`: blocks until `pid` exits; returns its status and resource usage
/// (which includes every descendant it waited for).
pub fn wait4(pid: libc::pid_t) -> Result<(libc::c_int, libc::rusage), Errno> {
    let mut status = 0;
    // SAFETY: rusage is plain data.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: both out pointers are valid.
        match check_int(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }) {
            Err(Errno(libc::EINTR)) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok((status, usage)),
        }
    }
}

/// `poll(fds, timeout_ms)`, retrying on EINTR is left to the caller.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> Result<usize, Errno> {
    // SAFETY: `fds` is a live, writable slice of pollfd.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    check_int(rc).map(|n| n as usize)
}

/// `setsid()`: a new session and process group, led by the caller, with no controlling
/// terminal.
pub fn setsid() -> Result<(), Errno> {
    // SAFETY: setsid takes no arguments and touches only the calling process.
    check_int(unsafe { libc::setsid() }).map(drop)
}

/// `ioctl(fd, TIOCSCTTY, 0)`: the terminal on `fd` becomes the controlling terminal of the
/// caller, a session leader without one.
pub fn set_controlling_terminal(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: TIOCSCTTY takes an integer argument; a bad descriptor is EBADF/ENOTTY.
    check_int(unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0 as libc::c_int) }).map(drop)
}

/// Whether `fd` is a terminal (`isatty(3)`); `false` for a closed descriptor.
pub fn is_terminal(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor number; a closed one is EBADF.
    unsafe { libc::isatty(fd) == 1 }
}

/// `getuid()` and `getgid()`.
pub fn ids() -> (u32, u32) {
    // SAFETY: getuid/getgid cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Takes ownership of a descriptor just returned by the kernel.
pub fn owned(fd: RawFd) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: every caller passes a descriptor it just received from the kernel and owns.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// Whether this kernel implements syscall `nr`: called with every argument -1 (a bad
/// descriptor, pointer and flags), an implemented syscall fails with something else than
/// `ENOSYS` before doing anything.
#[cfg(test)]
pub fn syscall_exists(nr: i64) -> bool {
    // SAFETY: only invalid arguments are passed; nothing is read or written through them.
    let rc = unsafe { libc::syscall(nr, -1i64, -1i64, -1i64, -1i64, -1i64, -1i64) };
    rc != -1 || Errno::last().0 != libc::ENOSYS
}

/// Result of [`fork`](crate::raw::fork).
#[derive(Debug)]
pub enum Fork {
    /// We are the new child.
    Child,
    /// We are the parent of this pid.
    Parent(libc::pid_t),
}

/// `fork(2)`. Only for single-threaded callers (the sandbox agent): the child may then
/// allocate and run ordinary Rust code.
pub fn fork() -> Result<Fork, Errno> {
    // SAFETY: the agent is single-threaded, so the child inherits no lock held by another
    // thread; no pointers are involved.
    match check_int(unsafe { libc::fork() })? {
        0 => Ok(Fork::Child),
        pid => Ok(Fork::Parent(pid)),
    }
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`: a close-on-exec copy of `fd` numbered `>= min`.
pub fn dup_above(fd: RawFd, min: RawFd) -> Result<RawFd, Errno> {
    // SAFETY: descriptor numbers only; no pointers.
    check_int(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })
}

/// `fcntl(fd, F_SETFD, FD_CLOEXEC)`.
pub fn set_cloexec(fd: RawFd) -> Result<(), Errno> {
    // SAFETY: descriptor numbers only; no pointers.
    check_int(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop)
}

/// `setns(fd, nstype)`.
pub fn setns(fd: RawFd, nstype: libc::c_int) -> Result<(), Errno> {
    // SAFETY: descriptor numbers and flags only; no pointers.
    check_int(unsafe { libc::setns(fd, nstype) }).map(drop)
}

/// `openat(dir, path, flags | O_CLOEXEC)`.
pub fn open_at(dir: RawFd, path: &CStr, flags: libc::c_int) -> Result<RawFd, Errno> {
    // SAFETY: `path` is a live C string.
    check_int(unsafe { libc::openat(dir, path.as_ptr(), flags | libc::O_CLOEXEC) })
}
