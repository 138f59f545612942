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

/// Bytes a [`RecvBuf`] holds in place: most records (requests, replies, events) fit.
const SMALL_RECORD: usize = 16 * 1024;

/// A receive buffer for one connection: records of up to 16 KiB are received in place, a
/// larger one (up to [`MAX_RECORD`]) into a buffer of its own size, dropped at the next
/// receive. Each side of every sandbox's connection holds one, so it stays small while
/// the sandbox idles, instead of `MAX_RECORD` bytes each (issue 34: the server's memory
/// grew with every sandbox it held).
#[derive(Debug)]
pub struct RecvBuf {
    small: Vec<u8>,
    large: Vec<u8>,
    len: usize,
}

impl Default for RecvBuf {
    fn default() -> RecvBuf {
        RecvBuf {
            small: vec![0; SMALL_RECORD],
            large: Vec::new(),
            len: 0,
        }
    }
}

impl RecvBuf {
    /// Receives one record, as [`recv`] does: its length, its descriptors; its bytes are
    /// [`RecvBuf::record`]. `Ok(None)` at end of stream.
    pub fn recv(&mut self, sock: BorrowedFd<'_>) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
        // MSG_PEEK | MSG_TRUNC: the next record's whole length, leaving it queued.
        let (_, len) =
            rustix::net::recv(sock, &mut [0u8; 0][..], RecvFlags::PEEK | RecvFlags::TRUNC)?;
        self.large = if len > SMALL_RECORD {
            vec![0; len.min(MAX_RECORD)]
        } else {
            Vec::new()
        };
        let buf = if self.large.is_empty() {
            &mut self.small
        } else {
            &mut self.large
        };
        let got = recv(sock, buf)?;
        self.len = got.as_ref().map_or(0, |(n, _)| *n);
        Ok(got)
    }

    /// The bytes of the record last received.
    pub fn record(&self) -> &[u8] {
        let buf = if self.large.is_empty() {
            &self.small
        } else {
            &self.large
        };
        &buf[..self.len.min(buf.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn records_small_and_large_arrive_whole_with_their_descriptors() {
        // A SEQPACKET pair, as the runtime and the agent use.
        let (a, b) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let mut buf = RecvBuf::default();
        let large: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let null = std::fs::File::open("/dev/null").unwrap();
        send(a.as_fd(), b"small", &[]).unwrap();
        send(a.as_fd(), &large, &[null.as_fd()]).unwrap();
        send(a.as_fd(), b"again", &[]).unwrap();
        let (n, fds) = buf.recv(b.as_fd()).unwrap().unwrap();
        assert_eq!((n, fds.len(), buf.record()), (5, 0, &b"small"[..]));
        let (n, fds) = buf.recv(b.as_fd()).unwrap().unwrap();
        assert_eq!((n, fds.len()), (large.len(), 1));
        assert_eq!(buf.record(), &large[..]);
        let (_, _) = buf.recv(b.as_fd()).unwrap().unwrap();
        assert_eq!(buf.record(), b"again");
        assert!(buf.large.is_empty(), "the large record's buffer went");
        drop(a);
        assert!(buf.recv(b.as_fd()).unwrap().is_none(), "end of stream");
    }
}
