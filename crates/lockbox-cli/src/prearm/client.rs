//! `lockbox run`'s side of a pre-armed start: whether this run may be handed to the helper
//! ([`connect`]), and the handover ([`Handover::run`]).
//!
//! A run is handed over only where the result is the same as a direct start's: a policy
//! that needs nothing of the caller's at the start ([`lockbox_confine::armed_unsupported`];
//! no `--workdir`, image, audit log, question or credential), no terminal on the stdio
//! (a direct start names it inside the sandbox), all three stdio descriptors open, no
//! inherited ignored signal (a direct start passes it on), and the helper's scheduling (the
//! helper checks: a command inherits its starter's nice value). Anything else starts directly,
//! as does a run whose policy has no spare yet (the helper arms some for next time).
//!
//! A handed-over command is not in the caller's process group: what the caller's
//! controlling terminal sends (Ctrl-C, Ctrl-\, a hang-up) reaches `lockbox run` alone,
//! which forwards it to the command, as it forwards any signal sent to it; Ctrl-Z pauses
//! the sandbox's processes before `lockbox run` stops, and they resume when it is
//! continued (`fg`, `bg`).

use super::wire::{self, EndStatus, Ended, Reply, Request, RunRequest};
use crate::cli::RunArgs;
use crate::error::CliError;
use lockbox_confine::{ArmedCommand, Signals};
use lockbox_policy::Policy;
use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// A run that may be handed to the helper whose socket is at `socket`.
#[derive(Debug)]
pub(crate) struct Handover {
    socket: PathBuf,
    /// `--pre-arm` or `LOCKBOX_PRE_ARM=1`: start a helper if none answers.
    wanted: bool,
}

/// A connection to the helper for one run.
#[derive(Debug)]
struct Connection {
    conn: OwnedFd,
}

/// Whether this run may be handed over, and to which helper's socket: one is there. With
/// `--pre-arm` (or `LOCKBOX_PRE_ARM=1`) a helper is started when none runs; this run then
/// starts directly. Connecting waits for [`Handover::run`], which has its request ready by
/// then (see [`dial_and_send`]).
pub(crate) fn connect(args: &RunArgs, policy: &Policy) -> Result<Option<Handover>, CliError> {
    let switch = super::env_switch().map_err(CliError::usage)?;
    if args.no_pre_arm || switch == Some(false) || !super::enabled() {
        return Ok(None);
    }
    let wanted = args.pre_arm || switch == Some(true);
    if lockbox_confine::armed_unsupported(policy).is_some() || !plain_caller() {
        if wanted {
            start_if_missing();
        }
        return Ok(None);
    }
    Ok(helper_socket(wanted).map(|socket| Handover { socket, wanted }))
}

/// The helper's socket, if one is there (a look, no connection yet); when none is and
/// `wanted`, a helper is started for later runs.
fn helper_socket(wanted: bool) -> Option<PathBuf> {
    let socket = super::socket_path(&super::socket_dir().ok()?);
    if std::fs::symlink_metadata(&socket).is_err() {
        if wanted {
            start_if_missing();
        }
        return None;
    }
    Some(socket)
}

/// No terminal on the stdio, stdio open, nothing ignored.
fn plain_caller() -> bool {
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let stdio = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    let open = stdio.iter().all(|fd| rustix::io::fcntl_getfd(fd).is_ok());
    let terminal = stdio.iter().any(rustix::termios::isatty);
    open && !terminal && lockbox_confine::ignored_signals().is_empty()
}

/// A connection to the helper at `socket`, if one answers there as this user.
fn dial(socket: &Path) -> Option<OwnedFd> {
    let fd = net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .ok()?;
    net::connect(&fd, &SocketAddrUnix::new(socket).ok()?).ok()?;
    let cred = net::sockopt::socket_peercred(&fd).ok()?;
    (cred.uid == rustix::process::getuid()).then_some(fd)
}

/// Connects to the helper at `socket` and sends it `request` (encoded) with `fds`. `None`:
/// no helper answers there as this user, or the request could not be sent; the helper has
/// nothing of this run.
///
/// The request is ready before the connection is made, so that it is there when the helper
/// wakes for the connection: the helper's accepting thread then releases the spare itself
/// (a thread started for a connection whose request had not come yet was a wake-up more).
fn dial_and_send(socket: &Path, request: &[u8], fds: &[BorrowedFd<'_>]) -> Option<OwnedFd> {
    let conn = dial(socket)?;
    wire::send_encoded(conn.as_fd(), request, fds).ok()?;
    Some(conn)
}

/// A connection to the helper whose socket is in `dir`, if one answers.
pub(crate) fn dial_helper(dir: &Path) -> Option<OwnedFd> {
    dial(&super::socket_path(dir))
}

/// Starts a helper in the background unless one answers; does not wait for it.
pub(crate) fn start_if_missing() {
    let Ok(dir) = super::socket_dir() else {
        return;
    };
    if dial(&super::socket_path(&dir)).is_some() {
        return;
    }
    if let Ok(mut child) = spawn_helper(&dir, &[]) {
        // The helper is this process's child while this process lives: in a long-lived one
        // (a program using the SDK) its end, when idle, must not leave a zombie behind.
        let _ = std::thread::Builder::new()
            .name("pre-arm reaper".into())
            .spawn(move || child.wait());
    }
}

/// Starts `lockbox pre-arm start --foreground` detached (its own session, stdio
/// `/dev/null`), with `extra` flags.
pub(crate) fn spawn_helper(dir: &Path, extra: &[OsString]) -> std::io::Result<std::process::Child> {
    let launcher = super::launcher()?;
    let Some((program, args)) = launcher.split_first() else {
        return Err(std::io::Error::other("no command starts the helper"));
    };
    std::process::Command::new(program)
        .args(args)
        .args(["pre-arm", "start", "--foreground"])
        .args(extra)
        .env("LOCKBOX_PRE_ARM_DIR", dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
}

/// What a handed-over run came to.
pub(crate) enum Handed {
    /// It ran: how it ended, and where it started.
    Ran(Ended, PathBuf),
    /// No spare (or no way to hand it over): nothing ran; start directly.
    Direct,
}

impl Handover {
    /// Hands `command` over with this process's stdio and environment, then forwards
    /// `signals` until the helper reports the end (or a miss: nothing ran).
    pub(crate) fn run(
        self,
        policy: &Policy,
        command: &[OsString],
        signals: &Signals,
    ) -> Result<Handed, CliError> {
        let Some((request, armed)) = run_request(policy, command) else {
            return Ok(Handed::Direct);
        };
        let Ok(request) = wire::encode(&request) else {
            return Ok(Handed::Direct);
        };
        let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
        let fds: [BorrowedFd<'_>; 4] = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd(), armed.fd()];
        // Job control: Ctrl-Z pauses the sandbox before this process stops; continuing
        // this process resumes it. Blocked before the command can start (a Ctrl-Z typed once
        // it runs must pause it), and until the process exits, as `lockbox run` keeps its
        // other signals, unless nothing ran: then whatever came is delivered as usual.
        let job =
            Signals::block(&[libc::SIGTSTP, libc::SIGCONT]).map_err(|e| CliError::new(125, e))?;
        let Some(conn) = dial_and_send(&self.socket, &request, &fds) else {
            if self.wanted {
                start_if_missing();
            }
            return Ok(Handed::Direct);
        };
        drop(armed);
        let connection = Connection { conn };
        let handed = connection.forward_until_answered(signals, &job);
        if !matches!(handed, Ok(Handed::Direct)) {
            std::mem::forget(job);
            // Open until this process exits: its closing tells the helper to let the used
            // sandbox go and arm another, work that would take a core from this process's
            // end on a small machine.
            std::mem::forget(connection);
        }
        handed
    }
}

impl Connection {
    /// Forwards `signals` and `job`'s until the helper answers.
    fn forward_until_answered(&self, signals: &Signals, job: &Signals) -> Result<Handed, CliError> {
        // The helper says nothing while the command runs, so a signal is forwarded before it
        // is known whether there was a spare: on a miss it is raised again, for the direct
        // start that follows (it stays pending: it is blocked).
        let mut forwarded = Vec::new();
        loop {
            let mut fds = [
                rustix::event::PollFd::new(&self.conn, rustix::event::PollFlags::IN),
                rustix::event::PollFd::new(signals, rustix::event::PollFlags::IN),
                rustix::event::PollFd::new(job, rustix::event::PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(CliError::new(
                        125,
                        format!("waiting for the pre-arm helper: {e}"),
                    ))
                }
            }
            let signalled = !fds[1].revents().is_empty();
            let answered = !fds[0].revents().is_empty();
            if !fds[2].revents().is_empty() {
                self.job_control(job);
            }
            if signalled {
                // The terminal's signals too: the command is not in its foreground group.
                while let Some(sig) = signals.next() {
                    let request = match sig.signal {
                        libc::SIGTERM => Request::Terminate,
                        other => Request::Signal(other),
                    };
                    let _ = wire::send(self.conn.as_fd(), &request, &[]);
                    // Pending, a signal is one bit: raising each kind once again is enough.
                    if !forwarded.contains(&sig.signal) {
                        forwarded.push(sig.signal);
                    }
                }
            }
            if answered {
                return match wire::recv::<Reply>(self.conn.as_fd()) {
                    Ok(Some((Reply::Ran { ended, cwd }, _))) => Ok(Handed::Ran(ended, cwd)),
                    Ok(Some((Reply::Miss(_), _))) => {
                        raise_again(&forwarded);
                        Ok(Handed::Direct)
                    }
                    Ok(Some((Reply::Failed { message, hint }, _))) => {
                        Err(setup_failed(message, hint))
                    }
                    _ => Err(gone()),
                };
            }
        }
    }

    /// Ctrl-Z (the terminal's SIGTSTP): the sandbox pauses, then this process stops, as
    /// the default action would have it; SIGCONT resumes the sandbox. A SIGTSTP sent by a
    /// process stops only this process, as it would a direct start's `lockbox run`.
    fn job_control(&self, job: &Signals) {
        while let Some(sig) = job.next() {
            match sig.signal {
                libc::SIGTSTP => {
                    if sig.from_terminal {
                        let _ = wire::send(self.conn.as_fd(), &Request::Suspend, &[]);
                    }
                    let _ = rustix::process::kill_process(
                        rustix::process::getpid(),
                        rustix::process::Signal::STOP,
                    );
                }
                libc::SIGCONT => {
                    let _ = wire::send(self.conn.as_fd(), &Request::Resume, &[]);
                }
                _ => {}
            }
        }
    }
}

/// The request to run `command` under `policy` in this process's directory, and the sealed
/// command it carries (with the environment built from this process's, as a direct start
/// builds it); `None` if either cannot be made (the run then starts directly).
fn run_request(policy: &Policy, command: &[OsString]) -> Option<(Request, ArmedCommand)> {
    let env = policy.env.build(|k| std::env::var(k).ok());
    let armed = ArmedCommand::new(command, &env).ok()?;
    let cwd = std::env::current_dir().ok()?;
    let request = Request::Run(Box::new(RunRequest {
        policy: policy.clone(),
        cwd,
        program: armed.program().to_owned(),
        scheduling: lockbox_confine::scheduling(),
    }));
    Some((request, armed))
}

fn setup_failed(message: String, hint: Option<String>) -> CliError {
    let error = CliError::new(125, message);
    match hint {
        Some(h) => error.hint(h),
        None => error,
    }
}

/// Sends `signals` to this process again: they are blocked, so they wait for the direct
/// start that follows a miss.
fn raise_again(signals: &[i32]) {
    for &sig in signals {
        if let Some(sig) = rustix::process::Signal::from_named_raw(sig) {
            let _ = rustix::process::kill_process(rustix::process::getpid(), sig);
        }
    }
}

/// The helper went away with the run in its hands: whether the command ran is unknown, so
/// it is not started again.
fn gone() -> CliError {
    CliError::new(
        125,
        "the pre-arm helper ended while it had the run; the sandbox ended with it (not started again)",
    )
    .hint("lockbox pre-arm status; LOCKBOX_PRE_ARM=0 or --no-pre-arm starts every run directly")
}

/// Whether `LOCKBOX_PRE_ARM` says on, off or nothing: another value is a usage error, which
/// the SDK raises before it runs anything (as `lockbox run` exits 2).
pub fn check_switch() -> Result<(), String> {
    super::env_switch().map(|_| ())
}

/// How a run the Python SDK handed over ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreArmedEnd {
    /// The exit code `lockbox run` would exit with (124 on a timeout, 128+N on signal N,
    /// 127/126 for a program that could not be executed).
    pub exit_code: i32,
    /// The signal that ended the command, if one did.
    pub signal: Option<i32>,
    /// The `execve` error of a program that could not be executed.
    pub exec_failed: Option<i32>,
    /// The policy's timeout stopped it.
    pub timed_out: bool,
}

/// For a program that starts sandboxes itself (the Python SDK's plain runs): hands
/// `command` over to this build's helper with `stdio`, and waits for its end. `Ok(None)`:
/// nothing ran (no helper, no spare, a policy or caller a spare cannot serve, or
/// `LOCKBOX_PRE_ARM=0`): start directly. `Err`: the sandbox could not be set up, or the
/// helper ended with the run (not to be started again), as the message says.
///
/// As with `lockbox run`: a helper answers only where its start gives what a direct one
/// would; with `LOCKBOX_PRE_ARM=1` one is started in the background when none answers (this
/// run then starts directly). The caller's signals are not forwarded: the SDK waits for a
/// direct start's command without forwarding any either.
pub fn hand_over(
    policy: &Policy,
    command: &[OsString],
    stdio: [BorrowedFd<'_>; 3],
) -> Result<Option<PreArmedEnd>, String> {
    let switch = super::env_switch()?;
    if switch == Some(false) || !super::enabled() {
        return Ok(None);
    }
    let wanted = switch == Some(true);
    let terminal = stdio.iter().any(rustix::termios::isatty);
    if lockbox_confine::armed_unsupported(policy).is_some()
        || terminal
        || !lockbox_confine::ignored_signals().is_empty()
    {
        if wanted {
            start_if_missing();
        }
        return Ok(None);
    }
    // No helper: nothing to make a request for.
    let Some(socket) = helper_socket(wanted) else {
        return Ok(None);
    };
    let Some((request, armed)) = run_request(policy, command) else {
        return Ok(None);
    };
    let Ok(request) = wire::encode(&request) else {
        return Ok(None);
    };
    let [stdin, stdout, stderr] = stdio;
    let fds = [stdin, stdout, stderr, armed.fd()];
    let Some(conn) = dial_and_send(&socket, &request, &fds) else {
        if wanted {
            start_if_missing();
        }
        return Ok(None);
    };
    drop(armed);
    let gone = || gone().message;
    match wire::recv::<Reply>(conn.as_fd()) {
        Ok(Some((Reply::Ran { ended, .. }, _))) => Ok(Some(PreArmedEnd {
            exit_code: ended.exit_code,
            signal: match ended.status {
                EndStatus::Signaled(sig) => Some(sig),
                _ => None,
            },
            exec_failed: match ended.status {
                EndStatus::ExecFailed(errno) => Some(errno),
                _ => None,
            },
            timed_out: ended.timed_out,
        })),
        Ok(Some((Reply::Miss(_), _))) => Ok(None),
        Ok(Some((Reply::Failed { message, .. }, _))) => Err(message),
        _ => Err(gone()),
    }
}
