//! `AF_UNIX` seqpacket pairs and records carrying descriptors (`SCM_RIGHTS`), through rustix.

use super::{errno, Errno};
use rustix::net;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, IntoRawFd, OwnedFd, RawFd};

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

/// The most descriptors one message carries (a command's stdin, stdout and stderr, and a
/// pre-armed sandbox's command).
pub const MAX_FDS: usize = 4;

/// Room for one `SCM_RIGHTS` control message with up to [`MAX_FDS`] descriptors, on the
/// stack (the child may not allocate).
const CMSG_SPACE: usize = rustix::cmsg_space!(ScmRights(MAX_FDS));
type CmsgSpace = [MaybeUninit<u8>; CMSG_SPACE];

/// Sends `data` with descriptor `fd` attached (`SCM_RIGHTS`), from the child.
///
/// # Safety
///
/// `sock` and `fd` are open descriptors of the caller's, and stay open during the call.
pub unsafe fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> Result<(), Errno> {
    // SAFETY: the caller keeps both descriptors open for the call.
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
/// in the child; returns the record's length and how many descriptors came. The caller owns
/// the descriptors received.
///
/// # Safety
///
/// `sock` is an open descriptor of the caller's, and stays open during the call.
pub unsafe fn recv_with_fds(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut [RawFd; MAX_FDS],
) -> Result<(usize, usize), Errno> {
    // SAFETY: the caller keeps the socket open for the call.
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
