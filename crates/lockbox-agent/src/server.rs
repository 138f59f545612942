//! The agent's loop: one thread polling the control socket and the report pipes of the
//! shims it started.

use rustix::event::{poll, PollFd, PollFlags};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::pipe::{pipe_with, PipeFlags};
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use lockbox_confine::agent_sys::{self, CommandFilter};

use crate::files::{self, PendingWrite, Roots};
use crate::proto::{AgentError, Body, Io, Message, Op, Reply, Request, SpawnSpec};
use crate::shim::{self, Shim};
use crate::watch::Watches;
use crate::{tree, wire, PROTOCOL_VERSION};

/// A command the agent started.
struct Child {
    /// Its shim, or the command itself when it runs in place of one (`shim == main`).
    shim: i32,
    main: i32,
    /// The shim's report (its command's pid, then its status); in place, the command's
    /// pidfd. Either polls readable when the command has ended.
    report: OwnedFd,
    /// Runs in place of a shim (see [`crate::shim::Shim::in_place`]).
    in_place: bool,
    /// A session's runtime ends of its pipes (see [`Op::SessionPipes`]); empty otherwise.
    session_pipes: Vec<OwnedFd>,
}

struct Agent {
    ctl: OwnedFd,
    roots: Roots,
    /// Stacked on every command.
    command_filter: CommandFilter,
    children: Vec<Child>,
    writes: HashMap<u64, PendingWrite>,
    next_token: u64,
    watches: Watches,
    /// Sessions' shells run in place of a shim (this kernel has `pidfd_open`).
    shells_in_place: bool,
}

/// The agent's exit code once a message to the runtime could not be sent: 0 when the
/// runtime has hung up (its end of the socket is gone), else 1, with the reason on stderr
/// (the server's log), so that "the sandbox agent exited with status 1" has a cause to go
/// with it.
fn send_failed(e: &std::io::Error) -> i32 {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, NotConnected};
    if matches!(e.kind(), BrokenPipe | ConnectionReset | NotConnected) {
        return 0;
    }
    eprintln!("lockbox agent: sending to lockbox: {e}");
    1
}

/// Serves the runtime on `ctl` until it hangs up; then kills everything it started.
pub(crate) fn run(ctl: OwnedFd) -> i32 {
    // The agent's filter allows openat2, its commands' filters do not: a command that could
    // ptrace the agent (same uid, same Landlock domain), write its /proc/PID/mem or take its
    // descriptors with pidfd_getfd could make it call openat2 (or anything else) on its
    // behalf. Non-dumpable closes all of those to a process without capabilities.
    if let Err(e) = agent_sys::set_non_dumpable() {
        eprintln!("lockbox agent: making the agent non-dumpable: {e}");
        return 1;
    }
    // Orphans of a shell run in place of a shim come here when it ends, to be ended too
    // (`Agent::end_orphans`), rather than to the init, out of reach.
    if let Err(e) = agent_sys::set_child_subreaper() {
        eprintln!("lockbox agent: becoming a subreaper: {e}");
        return 1;
    }
    let me = rustix::process::getpid();
    let shells_in_place =
        rustix::process::pidfd_open(me, rustix::process::PidfdFlags::empty()).is_ok();
    let roots = match Roots::open() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lockbox agent: opening the sandbox root: {e}");
            return 1;
        }
    };
    let mut agent = Agent {
        ctl,
        roots,
        command_filter: CommandFilter::new(),
        children: Vec::new(),
        writes: HashMap::new(),
        next_token: 1,
        watches: Watches::default(),
        shells_in_place,
    };
    let code = agent.serve();
    for c in &agent.children {
        tree::kill_tree(c.shim, c.main, false, Duration::from_secs(5));
    }
    code
}

impl Agent {
    fn serve(&mut self) -> i32 {
        let mut buf = wire::RecvBuf::default();
        loop {
            let ready = match self.wait_ready() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("lockbox agent: poll: {e}");
                    return 1;
                }
            };
            for i in ready.exited {
                self.finish_child(i);
            }
            for id in ready.watches {
                self.watches.read(id);
            }
            if self.watches.has_queued() {
                if let Err(e) = self.watches.flush(self.ctl.as_fd()) {
                    return send_failed(&e);
                }
            }
            if !ready.ctl {
                continue;
            }
            match buf.recv(self.ctl.as_fd()) {
                Ok(None) => return 0,
                Ok(Some((_, _fds))) => {
                    let record = buf.record();
                    let reply = match serde_json::from_slice::<Request>(record) {
                        Ok(req) => {
                            let (result, fds) = self.handle(req.op);
                            (Reply { id: req.id, result }, fds)
                        }
                        // Answered under the request's own id when it has one (an
                        // operation this agent does not know, from a newer runtime), so the
                        // caller gets the error instead of waiting for a reply forever.
                        Err(e) => (
                            Reply {
                                id: request_id(record),
                                result: Err(AgentError {
                                    errno: libc::EINVAL,
                                    message: format!(
                                        "bad request (this agent speaks protocol {}): {e}",
                                        crate::PROTOCOL_VERSION
                                    ),
                                }),
                            },
                            Vec::new(),
                        ),
                    };
                    if let Err(e) = self.send(&Message::Reply(reply.0), &reply.1) {
                        return send_failed(&e);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    eprintln!("lockbox agent: reading the control socket: {e}");
                    return 1;
                }
            }
        }
    }

    fn send(&self, msg: &Message, fds: &[OwnedFd]) -> std::io::Result<()> {
        let data = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        wire::send(self.ctl.as_fd(), &data, &borrowed)
    }

    fn wait_ready(&self) -> rustix::io::Result<Ready> {
        let mut fds = Vec::with_capacity(1 + self.children.len());
        // Queued watch events wait for room in the socket's buffer.
        let ctl_flags = if self.watches.has_queued() {
            PollFlags::IN | PollFlags::OUT
        } else {
            PollFlags::IN
        };
        fds.push(PollFd::new(&self.ctl, ctl_flags));
        for c in &self.children {
            fds.push(PollFd::new(&c.report, PollFlags::IN));
        }
        let watch_fds = self.watches.fds();
        for (_, fd) in &watch_fds {
            fds.push(PollFd::from_borrowed_fd(*fd, PollFlags::IN));
        }
        loop {
            match poll(&mut fds, None) {
                Ok(_) => break,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            }
        }
        let ctl = fds[0]
            .revents()
            .intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR);
        let children = 1 + self.children.len();
        let watches = fds[children..]
            .iter()
            .zip(&watch_fds)
            .filter(|(f, _)| !f.revents().is_empty())
            .map(|(_, (id, _))| *id)
            .collect();
        let mut exited: Vec<usize> = fds[1..children]
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.revents().is_empty())
            .map(|(i, _)| i)
            .collect();
        exited.reverse(); // removed by index, highest first
        Ok(Ready {
            ctl,
            exited,
            watches,
        })
    }

    /// A shim reported (or died), or a command run in place ended: tell the runtime and
    /// reap it.
    fn finish_child(&mut self, index: usize) {
        let child = self.children.swap_remove(index);
        if child.in_place {
            return self.finish_in_place(child);
        }
        let mut record = [0u8; 8];
        let reap = || {
            rustix::process::waitpid(
                rustix::process::Pid::from_raw(child.shim),
                rustix::process::WaitOptions::empty(),
            )
        };
        let reported = read_full(child.report.as_fd(), &mut record);
        let (code, signal) = if reported {
            let code = i32::from_le_bytes([record[0], record[1], record[2], record[3]]);
            let signal = i32::from_le_bytes([record[4], record[5], record[6], record[7]]);
            (
                (signal == 0 && code >= 0).then_some(code),
                (signal != 0).then_some(signal),
            )
        } else {
            // The shim itself was killed: its command's tree may be alive, and the orphans
            // of its children came here; end them.
            let status = reap();
            tree::kill_tree(child.shim, child.main, false, Duration::from_secs(5));
            self.end_orphans();
            let sig = status
                .ok()
                .flatten()
                .and_then(|(_, s)| s.terminating_signal())
                .unwrap_or(libc::SIGKILL);
            (None, Some(sig))
        };
        let _ = self.send(
            &Message::Exit {
                pid: child.main,
                code,
                signal,
            },
            &[],
        );
        // A shim that reported exits right after: reaped once the runtime was told, so
        // that its exit (the teardown of a copy of the agent's address space) does not
        // delay the message (issue 30).
        if reported {
            let _ = reap();
        }
    }

    /// A command run in place of a shim ended (its pidfd polled readable): reap it, end
    /// whatever it left behind (its orphans came here), and tell the runtime.
    fn finish_in_place(&mut self, child: Child) {
        let status = rustix::process::waitpid(
            rustix::process::Pid::from_raw(child.main),
            rustix::process::WaitOptions::empty(),
        );
        self.end_orphans();
        let status = status.ok().flatten().map(|(_, s)| s);
        let signal = status.and_then(|s| s.terminating_signal());
        let code = status
            .and_then(|s| s.exit_status())
            .filter(|_| signal.is_none());
        let signal = signal.or(code.is_none().then_some(libc::SIGKILL));
        let _ = self.send(
            &Message::Exit {
                pid: child.main,
                code,
                signal,
            },
            &[],
        );
    }

    /// Kills and reaps every child of the agent that it did not start: the orphans of a
    /// command that ended without a shim to keep them (the agent is a subreaper). Killing
    /// one orphans its own children to the agent in turn, so this goes on until none is
    /// left, or (a process stuck in the kernel) a few rounds have not sufficed: the agent
    /// must not hang on one; the init ends it with the sandbox.
    fn end_orphans(&self) {
        let me = rustix::process::getpid().as_raw_nonzero().get();
        for _ in 0..10 {
            let orphans: Vec<i32> = tree::children(me)
                .into_iter()
                .filter(|&pid| !self.children.iter().any(|c| c.shim == pid))
                .collect();
            if orphans.is_empty() {
                return;
            }
            for &pid in &orphans {
                tree::kill_tree(pid, pid, false, Duration::from_secs(5));
            }
            // Each is a zombie now (`kill_tree` returns once none of the tree is alive).
            for pid in orphans {
                let _ = rustix::process::waitpid(
                    rustix::process::Pid::from_raw(pid),
                    rustix::process::WaitOptions::NOHANG,
                );
            }
        }
    }

    fn handle(&mut self, op: Op) -> (Result<Body, AgentError>, Vec<OwnedFd>) {
        let fail = |errno: Errno, what: &str| AgentError {
            errno: errno.raw_os_error(),
            message: format!("{what}: {errno}"),
        };
        match op {
            Op::Hello => (
                Ok(Body::Hello {
                    pid: rustix::process::getpid().as_raw_nonzero().get(),
                    cwd: self.roots.work_path().to_owned(),
                    protocol: PROTOCOL_VERSION,
                }),
                Vec::new(),
            ),
            Op::Spawn(spec) => match self.spawn(&spec) {
                Ok((pid, fds)) => (Ok(Body::Spawned { pid }), fds),
                Err(e) => (Err(e), Vec::new()),
            },
            Op::Signal {
                pid,
                signal,
                spare_main,
            } => match self.children.iter().find(|c| c.main == pid) {
                Some(c) => {
                    tree::signal_tree(c.shim, c.main, signal, spare_main);
                    (Ok(Body::Done), Vec::new())
                }
                None => (Err(fail(Errno::SRCH, "signal")), Vec::new()),
            },
            Op::KillTree { pid, spare_main } => {
                match self.children.iter().find(|c| c.main == pid) {
                    Some(c) => {
                        tree::kill_tree(c.shim, c.main, spare_main, Duration::from_secs(10));
                        (Ok(Body::Done), Vec::new())
                    }
                    None => (Ok(Body::Done), Vec::new()),
                }
            }
            Op::SessionPipes { pid } => {
                let copies = self
                    .children
                    .iter()
                    .find(|c| c.main == pid && !c.session_pipes.is_empty())
                    .map(|c| {
                        c.session_pipes
                            .iter()
                            .map(OwnedFd::try_clone)
                            .collect::<Result<Vec<_>, _>>()
                    });
                match copies {
                    Some(Ok(fds)) => (Ok(Body::Done), fds),
                    Some(Err(_)) => (Err(fail(Errno::MFILE, "session pipes")), Vec::new()),
                    None => (Err(fail(Errno::SRCH, "session pipes")), Vec::new()),
                }
            }
            Op::Open { path, max_unsized } => {
                match files::open_read(&self.roots, &path, max_unsized) {
                    Ok(o) => (
                        Ok(Body::Opened {
                            size: o.size,
                            copied: o.copied,
                        }),
                        vec![o.file],
                    ),
                    Err(e) => (Err(fail(e, &path)), Vec::new()),
                }
            }
            Op::WriteBegin {
                path,
                mode,
                create_parents,
                xattrs,
            } => {
                let token = self.next_token;
                self.next_token += 1;
                match files::write_begin(&self.roots, &path, mode, create_parents, &xattrs, token) {
                    Ok((fd, pending)) => {
                        self.writes.insert(token, pending);
                        (Ok(Body::WriteStarted { token }), vec![fd])
                    }
                    Err(e) => (Err(fail(e, &path)), Vec::new()),
                }
            }
            Op::WriteEnd { token, commit } => match self.writes.remove(&token) {
                Some(w) => match files::write_end(w, commit) {
                    Ok(Some(st)) => (Ok(Body::Stat(st)), Vec::new()),
                    Ok(None) => (Ok(Body::Done), Vec::new()),
                    Err(e) => (Err(fail(e, "rename into place")), Vec::new()),
                },
                None => (Err(fail(Errno::INVAL, "unknown write")), Vec::new()),
            },
            Op::Stat { path } => one(files::stat(&self.roots, &path).map(Body::Stat), &path),
            Op::Mkdir { path, parents } => one(
                files::mkdir(&self.roots, &path, parents).map(Body::Stat),
                &path,
            ),
            Op::Remove { path, recursive } => one(
                files::remove(&self.roots, &path, recursive).map(|()| Body::Done),
                &path,
            ),
            Op::Rename {
                from,
                to,
                overwrite,
            } => one(
                files::rename(&self.roots, &from, &to, overwrite).map(Body::Stat),
                &from,
            ),
            Op::Watch {
                watch,
                path,
                recursive,
            } => one(
                self.watches
                    .add(&self.roots, watch, &path, recursive)
                    .map(|(path, is_dir)| Body::Watching { path, is_dir }),
                &path,
            ),
            Op::Unwatch { watch } => {
                self.watches.remove(watch);
                (Ok(Body::Done), Vec::new())
            }
            Op::List {
                path,
                recursive,
                hidden,
            } => {
                let memfd =
                    match rustix::fs::memfd_create("lockbox-list", rustix::fs::MemfdFlags::CLOEXEC)
                    {
                        Ok(fd) => fd,
                        Err(e) => return (Err(fail(e, "memfd")), Vec::new()),
                    };
                let file = std::fs::File::from(memfd);
                let mut out = std::io::BufWriter::new(&file);
                let result = files::list(&self.roots, &path, recursive, hidden, &mut out);
                drop(out);
                match result {
                    Ok(count) => (Ok(Body::Listed { count }), vec![OwnedFd::from(file)]),
                    Err(e) => (Err(fail(e, &path)), Vec::new()),
                }
            }
            Op::ContextStart(spec) => {
                let spawn = SpawnSpec {
                    argv: spec.language.argv(),
                    cwd: spec.cwd,
                    env_clear: false,
                    env: spec.env,
                    io: Io::Runner,
                };
                match self.spawn(&spawn) {
                    Ok((pid, fds)) => (Ok(Body::Spawned { pid }), fds),
                    Err(e) => (Err(e), Vec::new()),
                }
            }
            Op::Connect { port } => match connect_loopback(port) {
                Ok((peer, fd)) => (Ok(Body::Connected { peer }), vec![fd]),
                Err(e) => (
                    Err(AgentError {
                        errno: e.raw_os_error().unwrap_or(libc::EIO),
                        message: format!("connecting to port {port} in the sandbox: {e}"),
                    }),
                    Vec::new(),
                ),
            },
        }
    }

    fn spawn(&mut self, spec: &SpawnSpec) -> Result<(i32, Vec<OwnedFd>), AgentError> {
        let err = |errno: Errno, what: &str| AgentError {
            errno: errno.raw_os_error(),
            message: format!("{what}: {errno}"),
        };
        if spec.argv.is_empty() {
            return Err(err(Errno::INVAL, "empty command"));
        }
        let null = rustix::fs::open("/dev/null", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| err(e, "/dev/null"))?;
        let pipe = || pipe_with(PipeFlags::CLOEXEC).map_err(|e| err(e, "pipe"));
        // `slots` stay with the child; `back` goes to the runtime.
        let mut slots: Vec<OwnedFd> = Vec::new();
        let mut back: Vec<OwnedFd> = Vec::new();
        let mut tty = false;
        match spec.io {
            Io::Pipes { stdin } => {
                if stdin {
                    let (r, w) = pipe()?;
                    slots.push(r);
                    back.push(w);
                } else {
                    slots.push(null.try_clone().map_err(|_| err(Errno::MFILE, "dup"))?);
                }
                for _ in 0..2 {
                    let (r, w) = pipe()?;
                    slots.push(w);
                    back.push(r);
                }
            }
            Io::Pty { cols, rows } => {
                use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
                let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
                    .map_err(|e| err(e, "opening /dev/ptmx"))?;
                grantpt(&master).map_err(|e| err(e, "grantpt"))?;
                unlockpt(&master).map_err(|e| err(e, "unlockpt"))?;
                let name = ptsname(&master, Vec::new()).map_err(|e| err(e, "ptsname"))?;
                let size = rustix::termios::Winsize {
                    ws_row: rows,
                    ws_col: cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                let _ = rustix::termios::tcsetwinsize(&master, size);
                let slave = rustix::fs::open(
                    name.as_c_str(),
                    OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| err(e, "opening the pty"))?;
                for _ in 0..3 {
                    slots.push(slave.try_clone().map_err(|_| err(Errno::MFILE, "dup"))?);
                }
                back.push(master);
                tty = true;
            }
            Io::Runner => {
                slots.push(null.try_clone().map_err(|_| err(Errno::MFILE, "dup"))?);
                for _ in 0..3 {
                    let (r, w) = pipe()?;
                    slots.push(w);
                    back.push(r);
                }
                let (r, w) = pipe()?;
                slots.push(r);
                back.push(w);
            }
            Io::Session => {
                slots.push(null.try_clone().map_err(|_| err(Errno::MFILE, "dup"))?);
                for _ in 0..3 {
                    let (r, w) = pipe()?;
                    slots.push(w);
                    back.push(r);
                }
                for _ in 0..2 {
                    let (r, w) = pipe()?;
                    slots.push(r);
                    back.push(w);
                }
            }
        }
        // Made before the fork: once the command runs, nothing may fail.
        let session_pipes = match spec.io {
            Io::Session => back
                .iter()
                .map(OwnedFd::try_clone)
                .collect::<Result<_, _>>()
                .map_err(|_| err(Errno::MFILE, "dup"))?,
            _ => Vec::new(),
        };
        let (report_r, report_w) = pipe()?;
        // A session's shell lives as long as its session, idle mostly: it runs in place of
        // its shim, one process fewer per sandbox (see `shim`).
        let in_place = self.shells_in_place && matches!(spec.io, Io::Session);
        let shim = Shim {
            argv: &spec.argv,
            cwd: spec.cwd.as_deref(),
            env_clear: spec.env_clear,
            env: &spec.env,
            controlling_tty: tty,
            filter: &self.command_filter,
            in_place,
        };
        match agent_sys::fork_command(slots, report_w, |fds| shim::run(shim, fds)) {
            Err(e) => Err(err(Errno::from_raw_os_error(e.0), "fork")),
            Ok(pid) if in_place => {
                let reap = || {
                    let _ = rustix::process::waitpid(
                        rustix::process::Pid::from_raw(pid),
                        rustix::process::WaitOptions::empty(),
                    );
                };
                // End of file: it executed (the report closed on exec); else its errno.
                let mut first = [0u8; 4];
                if read_full(report_r.as_fd(), &mut first) {
                    reap();
                    let errno = Errno::from_raw_os_error(-i32::from_le_bytes(first));
                    return Err(err(errno, &format!("starting {:?}", spec.argv[0])));
                }
                let pidfd = rustix::process::Pid::from_raw(pid)
                    .ok_or(Errno::SRCH)
                    .and_then(|p| {
                        rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())
                    });
                let pidfd = match pidfd {
                    Ok(fd) => fd,
                    Err(e) => {
                        let _ = agent_sys::kill(pid, libc::SIGKILL);
                        reap();
                        return Err(err(e, "pidfd_open"));
                    }
                };
                self.children.push(Child {
                    shim: pid,
                    main: pid,
                    report: pidfd,
                    in_place,
                    session_pipes,
                });
                Ok((pid, back))
            }
            Ok(shim) => {
                let mut first = [0u8; 4];
                let main = if read_full(report_r.as_fd(), &mut first) {
                    i32::from_le_bytes(first)
                } else {
                    -libc::EIO
                };
                if main <= 0 {
                    let _ = rustix::process::waitpid(
                        rustix::process::Pid::from_raw(shim),
                        rustix::process::WaitOptions::empty(),
                    );
                    let errno = Errno::from_raw_os_error(-main);
                    return Err(err(errno, &format!("starting {:?}", spec.argv[0])));
                }
                self.children.push(Child {
                    shim,
                    main,
                    report: report_r,
                    in_place,
                    session_pipes,
                });
                Ok((main, back))
            }
        }
    }
}

struct Ready {
    ctl: bool,
    exited: Vec<usize>,
    watches: Vec<u64>,
}

fn one(result: Result<Body, Errno>, path: &str) -> (Result<Body, AgentError>, Vec<OwnedFd>) {
    (
        result.map_err(|e| AgentError {
            errno: e.raw_os_error(),
            message: format!("{path}: {e}"),
        }),
        Vec::new(),
    )
}

/// Reads exactly `buf.len()` bytes (blocking); false at EOF or error.
fn read_full(fd: BorrowedFd<'_>, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        match agent_sys::read(fd, &mut buf[got..]) {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
    }
    true
}

/// Longest a connect to the sandbox's loopback may take: the kernel answers at once
/// (accepted into the backlog, or refused); only a listener whose backlog is full leaves
/// it waiting, and the agent's single thread must not wait long on it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Connects to `port` on the sandbox's loopback: 127.0.0.1 first, then ::1 (servers that
/// bind only the IPv6 loopback). The socket is the agent's, made in the sandbox's network
/// namespace under every wall the sandbox has, so it reaches only what its code could.
fn connect_loopback(port: u16) -> std::io::Result<(String, OwnedFd)> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
    if port == 0 {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let first = match TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(s) => return Ok((v4.to_string(), OwnedFd::from(s))),
        Err(e) => e,
    };
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    match TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT) {
        Ok(s) => Ok((v6.to_string(), OwnedFd::from(s))),
        // The IPv4 failure says more (::1 may simply not exist).
        Err(_) => Err(first),
    }
}

/// The `id` of a request this agent cannot parse as a whole (0 if it has none).
fn request_id(data: &[u8]) -> u64 {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: u64,
    }
    serde_json::from_slice::<IdOnly>(data).map_or(0, |r| r.id)
}

#[cfg(test)]
mod tests {
    use super::{request_id, send_failed};

    #[test]
    fn a_request_with_an_unknown_operation_keeps_its_id() {
        assert_eq!(request_id(br#"{"id": 42, "op": {"Teleport": {}}}"#), 42);
        assert_eq!(request_id(b"not json"), 0);
    }

    #[test]
    fn a_send_fails_quietly_only_when_lockbox_hung_up() {
        let errno = |n| std::io::Error::from_raw_os_error(n);
        assert_eq!(send_failed(&errno(libc::EPIPE)), 0);
        assert_eq!(send_failed(&errno(libc::ECONNRESET)), 0);
        // A network list's supervisor refusing the call is a failure, said on stderr.
        assert_eq!(send_failed(&errno(libc::EACCES)), 1);
    }
}
