//! Raw syscalls of the network supervisor: seccomp user notifications, pidfds, reading the
//! memory of a sandboxed process, and the socket calls the supervisor makes on its behalf.
//! The only module of `lockbox-netsup` that uses `unsafe`.
//!
//! One small safe function per kernel call, each safe whatever its arguments: descriptors
//! come in as `&OwnedFd` (or are only polled), new ones go out as `OwnedFd`, and memory is
//! passed as live slices. No function here has a precondition its caller must keep.
//!
//! Public for `lockbox-confine`, whose directory-rename supervisor serves seccomp
//! notifications too (it shares the command's listener with this crate's supervisor under a
//! network list): the notification calls live here once.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An `errno` value returned by a failed syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

fn check(rc: libc::c_long) -> Result<libc::c_long, Errno> {
    if rc < 0 {
        Err(Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        ))
    } else {
        Ok(rc)
    }
}

fn check_int(rc: libc::c_int) -> Result<libc::c_int, Errno> {
    check(rc.into()).map(|n| n as libc::c_int)
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno(e.raw_os_error())
}

fn owned(rc: libc::c_long) -> Result<OwnedFd, Errno> {
    // SAFETY: a non-negative result of a descriptor-returning syscall is a new descriptor
    // that nobody else owns.
    check(rc).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `SECCOMP_RET_USER_NOTIF`.
pub const RET_USER_NOTIF: u32 = 0x7fc0_0000;
// _IOWR('!', 0, struct seccomp_notif) and friends (include/uapi/linux/seccomp.h).
const IOCTL_NOTIF_RECV: libc::c_ulong = 0xc050_2100;
const IOCTL_NOTIF_SEND: libc::c_ulong = 0xc018_2101;
const IOCTL_NOTIF_ID_VALID: libc::c_ulong = 0x4008_2102;
const IOCTL_NOTIF_ADDFD: libc::c_ulong = 0x4018_2103;
const IOCTL_NOTIF_SET_FLAGS: libc::c_ulong = 0x4008_2104;
const USER_NOTIF_FD_SYNC_WAKE_UP: u64 = 1;
const USER_NOTIF_FLAG_CONTINUE: u32 = 1;
const ADDFD_FLAG_SETFD: u32 = 1;
/// `SO_NETNS_COOKIE` (Linux 5.14).
pub const SO_NETNS_COOKIE: libc::c_int = 71;
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;
// Before a function here makes a raw call, it checks whether rustix has a safe one:
// pidfds, status flags, SO_PASSCRED and writes are rustix's; what remains raw has no safe
// binding there (seccomp notifications, process_vm_readv, raw sockaddr and control bytes,
// capset, getifaddrs).

/// `struct seccomp_notif`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Notif {
    /// Cookie of this notification.
    pub id: u64,
    /// Thread id of the caller, in our pid namespace.
    pub pid: u32,
    /// Unused by the kernel so far.
    pub flags: u32,
    /// Syscall number.
    pub nr: i32,
    /// AUDIT_ARCH of the call.
    pub arch: u32,
    /// Instruction pointer.
    pub ip: u64,
    /// The six arguments.
    pub args: [u64; 6],
}

#[repr(C)]
struct NotifResp {
    id: u64,
    val: i64,
    error: i32,
    flags: u32,
}

#[repr(C)]
struct NotifAddfd {
    id: u64,
    flags: u32,
    srcfd: u32,
    newfd: u32,
    newfd_flags: u32,
}

/// Wakes the notifying thread on the supervisor's CPU (Linux 6.6): a faster round trip.
pub fn notif_sync_wakeup(listener: &OwnedFd) -> Result<(), Errno> {
    // SAFETY: the argument is a plain integer for this ioctl.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            IOCTL_NOTIF_SET_FLAGS,
            USER_NOTIF_FD_SYNC_WAKE_UP,
        )
    };
    check(rc.into()).map(drop)
}

/// Receives the next notification (blocks).
pub fn notif_recv(listener: &OwnedFd) -> Result<Notif, Errno> {
    // The kernel requires a zeroed buffer.
    let mut notif = Notif::default();
    // SAFETY: `notif` has the layout and size of struct seccomp_notif and is writable.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            IOCTL_NOTIF_RECV,
            &mut notif as *mut Notif,
        )
    };
    check(rc.into()).map(|_| notif)
}

/// Answers notification `id`: `Ok(val)` as the syscall's result, `Err(errno)` as its error,
/// or (with `cont`) let the kernel run the call itself.
pub fn notif_respond(
    listener: &OwnedFd,
    id: u64,
    result: Result<i64, i32>,
    cont: bool,
) -> Result<(), Errno> {
    let (val, error) = match result {
        Ok(v) => (v, 0),
        Err(e) => (0, -e),
    };
    let mut resp = NotifResp {
        id,
        val,
        error,
        flags: if cont { USER_NOTIF_FLAG_CONTINUE } else { 0 },
    };
    if cont {
        resp.val = 0;
        resp.error = 0;
    }
    // SAFETY: `resp` has the layout of struct seccomp_notif_resp and outlives the call.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            IOCTL_NOTIF_SEND,
            &mut resp as *mut NotifResp,
        )
    };
    check(rc.into()).map(drop)
}

/// Whether notification `id` is still pending (its thread has not died, so the pid we
/// read memory from is still that thread's).
pub fn notif_id_valid(listener: &OwnedFd, id: u64) -> bool {
    let mut id = id;
    // SAFETY: `id` is a live u64.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            IOCTL_NOTIF_ID_VALID,
            &mut id as *mut u64,
        )
    };
    rc == 0
}

/// Installs our `src` as descriptor `target` of the notifying process, replacing what was
/// there (`SECCOMP_ADDFD_FLAG_SETFD`, Linux 5.9).
pub fn notif_addfd(
    listener: &OwnedFd,
    id: u64,
    src: &OwnedFd,
    target: RawFd,
    cloexec: bool,
) -> Result<(), Errno> {
    let mut addfd = NotifAddfd {
        id,
        flags: ADDFD_FLAG_SETFD,
        srcfd: src.as_raw_fd() as u32,
        newfd: target as u32,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: `addfd` has the layout of struct seccomp_notif_addfd and outlives the call.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            IOCTL_NOTIF_ADDFD,
            &mut addfd as *mut NotifAddfd,
        )
    };
    check(rc.into()).map(drop)
}

/// `pidfd_open(pid)`; with `thread`, a pidfd for that very thread (Linux 6.9).
pub fn pidfd_open(pid: libc::pid_t, thread: bool) -> Result<OwnedFd, Errno> {
    use rustix::process::{Pid, PidfdFlags};
    let flags = if thread {
        PidfdFlags::from_bits_retain(PIDFD_THREAD)
    } else {
        PidfdFlags::empty()
    };
    // Pid 0 is no process: the kernel's answer to it.
    let pid = Pid::from_raw(pid).ok_or(Errno(libc::EINVAL))?;
    rustix::process::pidfd_open(pid, flags).map_err(errno)
}

/// `pidfd_getfd(pidfd, fd)`: our own (close-on-exec) copy of another process's descriptor.
pub fn pidfd_getfd(pidfd: &OwnedFd, fd: RawFd) -> Result<OwnedFd, Errno> {
    use rustix::process::PidfdGetfdFlags;
    rustix::process::pidfd_getfd(pidfd, fd, PidfdGetfdFlags::empty()).map_err(errno)
}

/// Copies `buf.len()` bytes at `addr` of process `pid` into `buf`; a short read is an error.
pub fn vm_read(pid: libc::pid_t, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
    if buf.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes our live, writable `buf`; the remote address is only
    // interpreted in the other process by the kernel.
    let n =
        check(unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) } as libc::c_long)?;
    if n as usize == buf.len() {
        Ok(())
    } else {
        Err(Errno(libc::EFAULT))
    }
}

/// `socket(domain, type | SOCK_CLOEXEC, protocol)`.
pub fn socket(domain: i32, ty: i32, protocol: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: no pointer arguments.
    owned(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, protocol) }.into())
}

/// `getsockopt` of an integer option.
pub fn sockopt_int(fd: &OwnedFd, level: i32, name: i32) -> Result<i32, Errno> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and sized as declared.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    check(rc.into()).map(|_| v)
}

/// `getsockopt(SOL_SOCKET, SO_NETNS_COOKIE)`: which network namespace a socket lives in.
pub fn netns_cookie(fd: &OwnedFd) -> Result<u64, Errno> {
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and sized as declared.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut v as *mut u64).cast(),
            &mut len,
        )
    };
    check(rc.into()).map(|_| v)
}

/// `setsockopt` of an integer option.
pub fn set_sockopt_int(fd: &OwnedFd, level: i32, name: i32, v: i32) -> Result<(), Errno> {
    // SAFETY: `v` is live and sized as declared.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(rc.into()).map(drop)
}

/// `fcntl(F_GETFL)`.
pub fn status_flags(fd: &OwnedFd) -> Result<i32, Errno> {
    rustix::fs::fcntl_getfl(fd)
        .map(|f| f.bits() as i32)
        .map_err(errno)
}

/// Sets or clears `O_NONBLOCK` (of the open file description: every copy sees it).
pub fn set_nonblocking(fd: &OwnedFd, on: bool) -> Result<(), Errno> {
    use rustix::fs::OFlags;
    let mut flags = rustix::fs::fcntl_getfl(fd).map_err(errno)?;
    flags.set(OFlags::NONBLOCK, on);
    rustix::fs::fcntl_setfl(fd, flags).map_err(errno)
}

/// `getsockopt(SOL_SOCKET, SO_SNDTIMEO)`: the socket's send (and connect) timeout, if set.
pub fn send_timeout(fd: &OwnedFd) -> Result<Option<std::time::Duration>, Errno> {
    let mut v = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live and sized as declared.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&mut v as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    check(rc.into())?;
    let d = std::time::Duration::new(v.tv_sec.max(0) as u64, (v.tv_usec.max(0) as u32) * 1000);
    Ok((!d.is_zero()).then_some(d))
}

/// `connect(fd, addr)`, `addr` being the bytes of a sockaddr (at most 128).
pub fn connect(fd: &OwnedFd, addr: &[u8]) -> Result<(), Errno> {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = addr
        .len()
        .min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: both regions are valid for `len` bytes and do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            addr.as_ptr(),
            (&mut storage as *mut libc::sockaddr_storage).cast::<u8>(),
            len,
        )
    };
    // SAFETY: `storage` is live and at least `len` bytes.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&storage as *const libc::sockaddr_storage).cast(),
            len as libc::socklen_t,
        )
    };
    check(rc.into()).map(drop)
}

/// `sendmsg(fd, …, flags)` with an optional address, the data in `iov` and raw control data.
pub fn sendmsg(
    fd: &OwnedFd,
    name: Option<&[u8]>,
    iov: &[&[u8]],
    control: &[u8],
    flags: i32,
) -> Result<usize, Errno> {
    let mut iovecs: Vec<libc::iovec> = iov
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let mut name_buf = name.map(<[u8]>::to_vec).unwrap_or_default();
    let mut control_buf = control.to_vec();
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    if !name_buf.is_empty() {
        msg.msg_name = name_buf.as_mut_ptr().cast();
        msg.msg_namelen = name_buf.len() as libc::socklen_t;
    }
    msg.msg_iov = iovecs.as_mut_ptr();
    msg.msg_iovlen = iovecs.len() as _;
    if !control_buf.is_empty() {
        msg.msg_control = control_buf.as_mut_ptr().cast();
        msg.msg_controllen = control_buf.len() as _;
    }
    // SAFETY: every pointer in `msg` refers to a live buffer of the length given.
    let n = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, flags | libc::MSG_NOSIGNAL) };
    check(n as libc::c_long).map(|n| n as usize)
}

/// Sets `SO_PASSCRED`, so every message received carries the sender's pid.
pub fn set_passcred(fd: &OwnedFd) -> Result<(), Errno> {
    rustix::net::sockopt::set_socket_passcred(fd, true).map_err(errno)
}

#[repr(C, align(8))]
struct CredBuf([u8; 64]);

/// Receives one message and the sender's pid (translated into our pid namespace).
pub fn recv_with_pid(fd: &OwnedFd, buf: &mut [u8]) -> Result<(usize, Option<libc::pid_t>), Errno> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cmsg = CredBuf([0; 64]);
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.0.as_mut_ptr().cast();
    msg.msg_controllen = cmsg.0.len() as _;
    // SAFETY: `msg` points to live buffers of the sizes given.
    let n = check(
        unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) } as libc::c_long,
    )?;
    let mut pid = None;
    // SAFETY: the kernel filled msg_control with well-formed headers within controllen.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET
                && (*header).cmsg_type == libc::SCM_CREDENTIALS
            {
                let cred: libc::ucred =
                    std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::ucred>());
                pid = Some(cred.pid);
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    Ok((n as usize, pid))
}

/// Empties the calling thread's capability sets but for the capabilities in `keep` (when it
/// has them): capabilities are per thread (`capset(2)` with pid 0), so the rest of the
/// process keeps its own.
pub fn drop_thread_capabilities(keep: &[u32]) -> Result<(), Errno> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3: two 32-bit words
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: header and the two data words are valid for capget(2) version 3.
    check(unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut Header,
            data.as_mut_ptr(),
        )
    })?;
    let mut kept = [0u32; 2];
    for &cap in keep {
        let (word, bit) = ((cap / 32) as usize, 1u32 << (cap % 32));
        if let Some(w) = kept.get_mut(word) {
            *w |= bit;
        }
    }
    for (d, k) in data.iter_mut().zip(kept) {
        d.permitted &= k;
        d.effective = d.permitted;
        d.inheritable = 0;
    }
    // SAFETY: as above; the kernel only reads `data`.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) })
        .map(drop)
}

/// The IP addresses of the interfaces of the calling thread's network namespace
/// (`getifaddrs(3)`), each once; none if they cannot be read.
pub fn interface_addresses() -> Vec<std::net::IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a valid out-pointer; on success it owns a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs gave, not freed until the end.
        let ifa = unsafe { &*at };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` points at a sockaddr of the family it says, owned by the
            // list; sockaddr_in/in6 are read only for their family.
            let ip = unsafe {
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        Some(std::net::IpAddr::V4(std::net::Ipv4Addr::from(
                            u32::from_be(sin.sin_addr.s_addr),
                        )))
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        Some(std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                            sin6.sin6_addr.s6_addr,
                        )))
                    }
                    _ => None,
                }
            };
            if let Some(ip) = ip.filter(|ip| !out.contains(ip)) {
                out.push(ip);
            }
        }
        at = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once; no reference into it remains.
    unsafe { libc::freeifaddrs(list) };
    out
}

/// Whether seccomp supports return action `action` (`SECCOMP_GET_ACTION_AVAIL`).
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

/// `poll(2)` on `fds`; `timeout_ms` < 0 waits without end.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> Result<usize, Errno> {
    // SAFETY: `fds` is a live, writable slice of pollfd.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    check_int(rc).map(|n| n as usize)
}

/// Writes all of `data` to `fd`, retrying on EINTR.
pub fn write_all(fd: &OwnedFd, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        match rustix::io::write(fd, data) {
            // A write of nothing would repeat for ever: as std's write_all, an error.
            Ok(0) => return Err(Errno(libc::EIO)),
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(errno(e)),
        }
    }
    Ok(())
}
