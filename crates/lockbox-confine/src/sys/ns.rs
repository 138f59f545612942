//! Namespaces and what is set up inside a new one: `unshare`, `setns`, the hostname, the
//! loopback interface and the resolver's sockets.

use super::fd::close;
use super::{check_int, Errno};
use std::os::fd::RawFd;

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
    // SAFETY: `sock` was created above, is ours alone and is not used after.
    unsafe { close(sock) };
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
    // SAFETY: `sock` was created above, is ours alone and is not used after.
    unsafe { close(sock) };
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
                // SAFETY: `fd` was created above and is given to nobody on this path.
                unsafe { close(fd) };
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
                // SAFETY: `tcp` was created above and is given to nobody on this path.
                unsafe { close(tcp) };
                Err(e)
            }
        }
    });
    match tcp {
        Ok(tcp) => Ok((udp, tcp)),
        Err(e) => {
            // SAFETY: `udp` was created above and is given to nobody on this path.
            unsafe { close(udp) };
            Err(e)
        }
    }
}

/// `setns(fd, nstype)`.
pub fn setns(fd: RawFd, nstype: libc::c_int) -> Result<(), Errno> {
    // SAFETY: descriptor numbers and flags only; no pointers.
    check_int(unsafe { libc::setns(fd, nstype) }).map(drop)
}
