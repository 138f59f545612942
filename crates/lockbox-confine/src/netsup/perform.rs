//! Calls the supervisor performs itself ([`Job`]): connecting and installing host
//! sockets, and sends on its own copy of the caller's socket.

use super::call::Call;
use super::{Shared, Sock, MAX_SEND};
use crate::sys::Errno;
use crate::sysnet::{self, Notif};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// A call the supervisor performs itself.
pub(super) struct Job {
    pub(super) shared: Arc<Shared>,
    pub(super) listener: Arc<OwnedFd>,
    pub(super) notif: Notif,
    pub(super) sock: Sock,
    pub(super) call: Call,
    pub(super) replace: bool,
}

impl Job {
    /// Performs the call, off the supervisor's thread when it may block for long (a
    /// blocking socket), so other sandboxed threads are not held up.
    pub(super) fn start(self, respond: impl Fn(Result<i64, i32>)) {
        if self.replace && matches!(self.call, Call::Connect { .. }) {
            self.connect_replacement();
        } else if self.sock.nonblocking {
            self.run();
        } else if std::thread::Builder::new()
            .name("lockbox-net-call".into())
            .spawn(move || self.run())
            .is_err()
        {
            respond(Err(libc::EAGAIN));
        }
    }

    fn run(self) {
        let result = self.perform();
        self.respond(result);
    }

    fn respond(&self, result: Result<i64, i32>) {
        let _ = sysnet::notif_respond(&self.listener, self.notif.id, result, false);
    }

    /// Connects a new host socket to the copied address and installs it. The connect is
    /// non-blocking, so a connection that completes at once (loopback, or refused) is
    /// answered right here; only a blocking caller waiting for a slow handshake gets a
    /// thread of its own.
    fn connect_replacement(self) {
        let Call::Connect { addr } = &self.call else {
            return;
        };
        let fresh = match self.host_socket(true) {
            Ok(s) => s,
            Err(e) => return self.respond(Err(e)),
        };
        match sysnet::connect(&fresh, addr) {
            Ok(()) => self.install(fresh, Ok(0)),
            Err(Errno(libc::EINPROGRESS)) if self.sock.nonblocking => {
                self.install(fresh, Err(libc::EINPROGRESS))
            }
            Err(Errno(libc::EINPROGRESS)) => match wait_connected(&fresh, 0) {
                Some(done) => self.finish_blocking(fresh, done),
                None => {
                    let (listener, id) = (self.listener.clone(), self.notif.id);
                    let spawned = std::thread::Builder::new()
                        .name("lockbox-net-connect".into())
                        .spawn(move || {
                            let done = wait_connected(&fresh, -1).unwrap_or(Err(libc::EIO));
                            self.finish_blocking(fresh, done)
                        });
                    if spawned.is_err() {
                        let _ = sysnet::notif_respond(&listener, id, Err(libc::EAGAIN), false);
                    }
                }
            },
            Err(e) => self.respond(Err(e.0)),
        }
    }

    fn finish_blocking(&self, fresh: OwnedFd, done: Result<(), i32>) {
        match done.and_then(|()| sysnet::set_blocking(&fresh).map_err(|e| e.0)) {
            Ok(()) => self.install(fresh, Ok(0)),
            Err(e) => self.respond(Err(e)),
        }
    }

    /// Installs `fresh` as the caller's descriptor, then answers with `result`.
    fn install(&self, fresh: OwnedFd, result: Result<i64, i32>) {
        let tid = self.notif.pid as libc::pid_t;
        let fd = self.notif.args[0] as RawFd;
        match sysnet::notif_addfd(&self.listener, self.notif.id, &fresh, fd, cloexec(tid, fd)) {
            Ok(()) => {
                if let Ok(mut r) = self.shared.report.lock() {
                    r.host_connections += 1;
                }
                self.respond(result)
            }
            Err(e) => self.respond(Err(e.0)),
        }
    }

    fn perform(&self) -> Result<i64, i32> {
        let tid = self.notif.pid as libc::pid_t;
        let target = if self.replace {
            let fresh = self.host_socket(self.sock.nonblocking)?;
            Some(fresh)
        } else {
            None
        };
        let on = target.as_ref().unwrap_or(&self.sock.file);
        let result = match &self.call {
            Call::Connect { addr } => match sysnet::connect(on, addr) {
                Ok(()) => Ok(0),
                Err(Errno(libc::EINPROGRESS)) if target.is_some() => Err(libc::EINPROGRESS),
                Err(e) => return Err(e.0),
            },
            Call::Send {
                name,
                iov,
                control,
                flags,
                mmsg_len_at,
            } => {
                let data = gather(tid, iov)?;
                let parts: Vec<&[u8]> = vec![data.as_slice()];
                let n = sysnet::sendmsg(on, name.as_deref(), &parts, control, *flags)
                    .map_err(|e| e.0)?;
                if let Some(at) = mmsg_len_at {
                    sysnet::vm_write(tid, *at, &(n as u32).to_ne_bytes()).map_err(|e| e.0)?;
                    Ok(1)
                } else {
                    Ok(n as i64)
                }
            }
        };
        if let Some(fresh) = &target {
            let fd = self.notif.args[0] as RawFd;
            sysnet::notif_addfd(&self.listener, self.notif.id, fresh, fd, cloexec(tid, fd))
                .map_err(|e| e.0)?;
            if let Ok(mut r) = self.shared.report.lock() {
                r.host_connections += 1;
            }
        }
        result
    }

    /// A socket like the sandbox's, in the host's namespace.
    fn host_socket(&self, nonblocking: bool) -> Result<OwnedFd, i32> {
        let ty = if self.sock.stream {
            libc::SOCK_STREAM
        } else {
            libc::SOCK_DGRAM
        } | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
        let s = sysnet::socket(self.sock.domain, ty, 0).map_err(|e| e.0)?;
        if self.sock.stream {
            // Options set before connect would be lost with the old socket; keep the
            // one latency-sensitive clients set.
            if let Ok(v) =
                sysnet::sockopt_int(&self.sock.file, libc::IPPROTO_TCP, libc::TCP_NODELAY)
            {
                let _ = sysnet::set_sockopt_int(&s, libc::IPPROTO_TCP, libc::TCP_NODELAY, v);
            }
        }
        Ok(s)
    }
}

/// Whether a non-blocking connect has finished within `timeout_ms` (`-1`: wait), and how.
fn wait_connected(fd: &OwnedFd, timeout_ms: i32) -> Option<Result<(), i32>> {
    let mut fds = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    }];
    loop {
        match crate::sys::poll(&mut fds, timeout_ms) {
            Err(Errno(libc::EINTR)) => continue,
            Err(e) => return Some(Err(e.0)),
            Ok(0) => return None,
            Ok(_) => break,
        }
    }
    Some(
        match sysnet::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(0) => Ok(()),
            Ok(e) => Err(e),
            Err(e) => Err(e.0),
        },
    )
}

/// Copies the caller's data (at most [`MAX_SEND`] bytes).
fn gather(tid: libc::pid_t, iov: &[(u64, usize)]) -> Result<Vec<u8>, i32> {
    let mut data = Vec::new();
    for &(base, len) in iov {
        let take = len.min(MAX_SEND - data.len());
        if take == 0 {
            break;
        }
        let start = data.len();
        data.resize(start + take, 0);
        sysnet::vm_read(tid, base, &mut data[start..]).map_err(|e| e.0)?;
    }
    Ok(data)
}

/// Whether the caller's descriptor `fd` is close-on-exec (from `/proc/<tid>/fdinfo`).
fn cloexec(tid: libc::pid_t, fd: RawFd) -> bool {
    std::fs::read_to_string(format!("/proc/{tid}/fdinfo/{fd}"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|v| i64::from_str_radix(v.trim(), 8).ok())
        })
        .is_some_and(|f| f & i64::from(libc::O_CLOEXEC) != 0)
}
