//! Small helpers: ids, bash quoting, bounded non-blocking reads.

use std::os::fd::AsFd;
use std::time::{SystemTime, UNIX_EPOCH};

/// A random id of 12 hex digits.
pub(crate) fn random_id() -> String {
    let mut b = [0u8; 6];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b.copy_from_slice(&t.to_le_bytes()[..6]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `text` as one bash ANSI-C quoted word (`$'...'`): no newline, quote or control byte of
/// the text can end it, so any command text travels as one line. NUL cannot be carried.
pub(crate) fn ansi_c_quote(text: &[u8]) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    out.push_str("$'");
    for &b in text {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\'' => out.push_str("\\'"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('\'');
    out
}

/// A valid identifier for ids of sessions: `[A-Za-z0-9_.-]{1,64}`.
pub(crate) fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A valid environment variable name for bash.
pub(crate) fn valid_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Variables for a shell or an interpreter: names bash can set (`[A-Za-z_][A-Za-z0-9_]*`),
/// values without a NUL byte (no environment can hold one); else `INVALID_REQUEST` on `env`.
pub(crate) fn check_env<'a>(
    vars: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), crate::RuntimeError> {
    for (name, value) in vars {
        if !valid_env_name(name) {
            return Err(crate::RuntimeError::invalid(
                "env",
                format!("{name:?} is not a valid variable name"),
            ));
        }
        if value.contains('\0') {
            return Err(crate::RuntimeError::invalid(
                "env",
                format!("{name}: contains a NUL byte"),
            ));
        }
    }
    Ok(())
}

/// Registers `fd` with tokio's reactor, at a number from [`HELD_FROM`] up ([`held_high`]).
#[allow(deprecated)] // `AsyncFd::new` is sound for `OwnedFd`: the AsyncFd owns the descriptor.
pub(crate) fn async_fd(
    fd: std::os::fd::OwnedFd,
) -> Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>, crate::RuntimeError> {
    let fd = held_high(fd);
    rustix::io::ioctl_fionbio(&fd, true)
        .map_err(crate::RuntimeError::os("a non-blocking descriptor"))?;
    tokio::io::unix::AsyncFd::new(fd).map_err(crate::RuntimeError::os("registering a descriptor"))
}

/// Where the descriptors the runtime holds (agents' sockets, sessions' pipes: one or more
/// per live sandbox) are numbered from.
pub(crate) const HELD_FROM: i32 = 1024;

/// `fd` at the lowest free number from [`HELD_FROM`] up, or as it is if it is there already
/// or the open-files limit leaves no room. The numbers below stay for what lives briefly: the
/// descriptors a start hands to a new sandbox's init, which holds them at their numbers here
/// until it executes its lean self. A descriptor table is as large as its highest number, and
/// the init's close sweeps walk every slot of it: with 10,000 sandboxes held at the lowest
/// numbers, each start paid for about 16,000 slots (issue 34, docs/benchmarks.md).
pub(crate) fn held_high(fd: std::os::fd::OwnedFd) -> std::os::fd::OwnedFd {
    use std::os::fd::AsRawFd;
    if fd.as_raw_fd() >= HELD_FROM {
        return fd;
    }
    // EINVAL when the soft limit is at most HELD_FROM, EMFILE when it is full above it.
    rustix::io::fcntl_dupfd_cloexec(&fd, HELD_FROM).unwrap_or(fd)
}

/// Most bytes one wakeup reads from an output pipe or PTY. A writer faster than its reader
/// (`yes`, `cat /dev/zero`) would otherwise keep one task reading forever and grow its
/// buffer without bound: after this many bytes the reader yields, keeping the readiness.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// What a bounded read of a non-blocking descriptor found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// Nothing more for now (`EAGAIN`): wait for readiness again.
    Empty,
    /// Stopped at the bound; more may be waiting.
    More,
    /// End of file (or `EIO`: a PTY whose other side is closed).
    Eof,
}

/// Reads at most `max` bytes of what `fd` (non-blocking) holds now, handing each piece to
/// `sink`; stops early at `EAGAIN` or end of file.
pub(crate) fn read_some(fd: impl AsFd, max: usize, mut sink: impl FnMut(&[u8])) -> Read {
    let mut buf = [0u8; 16 * 1024];
    let mut left = max;
    while left > 0 {
        let want = buf.len().min(left);
        match rustix::io::read(fd.as_fd(), &mut buf[..want]) {
            Ok(0) => return Read::Eof,
            Ok(n) => {
                sink(&buf[..n]);
                left -= n;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => return Read::Empty,
            Err(_) => return Read::Eof,
        }
    }
    Read::More
}

/// Bytes waiting in a pipe or PTY now (`FIONREAD`). Reading exactly these after a command
/// ended takes everything it wrote, while a writer it passed the descriptor on to cannot
/// keep the reader going (0 when the descriptor cannot tell).
pub(crate) fn pending(fd: impl AsFd) -> usize {
    rustix::io::ioctl_fionread(fd.as_fd())
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0)
}

/// Reads what `fd` holds now, at most [`pending`] bytes, into `out`.
pub(crate) fn read_pending(fd: impl AsFd, out: &mut Vec<u8>) {
    let n = pending(fd.as_fd());
    read_some(fd, n, |data| out.extend_from_slice(data));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_descriptors_are_numbered_above_the_ones_a_start_hands_over() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        use std::io::{Read, Write};
        use std::os::fd::{AsRawFd, OwnedFd};
        // Room above HELD_FROM if the hard limit allows (this process's limit alone).
        let limit = getrlimit(Resource::Nofile);
        let hard = limit.maximum.unwrap_or(u64::MAX);
        if limit.current.unwrap_or(u64::MAX) <= HELD_FROM as u64 {
            let raised = Rlimit {
                current: Some(hard.min(4096)),
                maximum: limit.maximum,
            };
            setrlimit(Resource::Nofile, raised).expect("raising the soft open-files limit");
        }
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
        let low = OwnedFd::from(ours);
        assert!(
            low.as_raw_fd() < HELD_FROM,
            "a fresh test process numbers low"
        );
        let held = held_high(low);
        if hard > HELD_FROM as u64 {
            assert!(
                held.as_raw_fd() >= HELD_FROM,
                "moved up: {}",
                held.as_raw_fd()
            );
        } else {
            assert!(
                held.as_raw_fd() < HELD_FROM,
                "no room above: left where it was"
            );
        }
        // Still the same socket.
        let mut held = std::os::unix::net::UnixStream::from(held);
        held.write_all(b"x").expect("write");
        let mut byte = [0u8; 1];
        theirs.read_exact(&mut byte).expect("read");
        assert_eq!(&byte, b"x");
        let again = held_high(OwnedFd::from(held));
        assert!(
            hard <= HELD_FROM as u64 || again.as_raw_fd() >= HELD_FROM,
            "stays up"
        );
    }

    #[test]
    fn quoting_keeps_every_byte_on_one_line() {
        let q = ansi_c_quote(b"a'b\\c\nd\xff");
        assert_eq!(q, "$'a\\'b\\\\c\\x0ad\\xff'");
        assert!(!q.contains('\n'));
    }
}
