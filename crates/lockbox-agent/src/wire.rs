//! Sending and receiving one record with descriptors over a `SOCK_SEQPACKET` socket.

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

/// Most descriptors one record carries.
pub const MAX_FDS: usize = 8;
/// Largest record either side sends (requests, replies, events).
pub const MAX_RECORD: usize = 256 * 1024;

/// Sends `data` with `fds` as one record (`MSG_NOSIGNAL`).
pub fn send(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one record"));
    }
    let n = sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if n != data.len() {
        return Err(io::Error::other("record sent partially"));
    }
    Ok(())
}

/// Sends `data` as one record without blocking (`MSG_DONTWAIT`): `WouldBlock` when the
/// socket's buffer is full.
pub fn send_nowait(sock: BorrowedFd<'_>, data: &[u8]) -> io::Result<()> {
    let n = rustix::net::send(sock, data, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)?;
    if n != data.len() {
        return Err(io::Error::other("record sent partially"));
    }
    Ok(())
}

/// Receives one record into `buf`; `Ok(None)` at end of stream. Received descriptors are
/// close-on-exec.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((msg.bytes, fds)))
}
