//! Sessions: a persistent `bash --norc --noprofile` per session, driven by a line protocol.
//!
//! The shell reads its script from a pipe (fd 5, not stdin). Each command is sent as ONE
//! line: the command text ANSI-C quoted into a variable (so heredocs, quotes or a stray
//! `'` cannot break the protocol), `__lb_pre` (stdin, per-call cwd/env), `eval` at top
//! level (so `cd`, `export`, functions and aliases persist) with stdin from `/dev/null` or
//! exactly N bytes read from the data pipe (fd 4) and the protocol descriptors closed, then
//! `__lb_post` restores cwd/env and writes `ID STATUS` to the status pipe (fd 3).
//!
//! stdout and stderr are persistent pipes read directly by the runtime into a [`Sink`]
//! (bounded: see `output`). When the status line arrives, every byte the command wrote is
//! already in the pipes, so what they hold then is read before the exit code is published.
//! A timeout TERMs, then after the grace KILLs, every process of the session's tree except
//! the shell (the shim above the shell is a subreaper, so detached children are found too);
//! the shell then reports and the session keeps its state (exit 124, `timed_out`). `exit N`
//! in a command ends the session and the command, whose exit code is N (the next call gets
//! a fresh session). A shell that dies by a signal or does not return ends the session:
//! `SESSION_TERMINATED`, and so does a status line that is not the running command's.

use bytes::Bytes;
use lockbox_agent::{Body, Io, Op, SpawnSpec};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;

use crate::agent::AgentClient;
use crate::output::{Pipe, Sink};
use crate::types::{ExecExit, ExecRequest, SessionId, SessionInfo};
use crate::util::{ansi_c_quote, read_some, Read};
use crate::RuntimeError;

/// Exit code reported for a command killed by its timeout (as coreutils `timeout`).
pub(crate) const TIMEOUT_EXIT: i32 = 124;
/// How long a shell has to report after its command's tree was killed.
const SHELL_RETURN_GRACE: Duration = Duration::from_secs(2);

const PRELUDE: &str = r#"__lb_pre() {
  __lb_in=/dev/null; __lb_owd=; __lb_sv=()
  if [[ "$1" != -1 ]]; then
    __lb_in=$(command mktemp "${TMPDIR:-/tmp}/.lockbox-stdin.XXXXXX" 2>/dev/null) || __lb_in=
    command head -c "$1" <&4 >"${__lb_in:-/dev/null}"
    if [[ -z "$__lb_in" ]]; then __lb_in=/dev/null; builtin echo "lockbox: cannot store stdin in ${TMPDIR:-/tmp}" >&2; return 1; fi
  fi
  if [[ -n "$2" ]]; then __lb_owd=$PWD; builtin cd -- "$2" >/dev/null || return 1; fi
  builtin shift 2
  while [[ "$#" -ge 2 ]]; do
    if [[ -n "${!1+x}" ]]; then __lb_sv+=("$1" 1 "${!1}"); else __lb_sv+=("$1" 0 ""); fi
    builtin export "$1=$2"; builtin shift 2
  done
}
__lb_post() {
  builtin local __lb_i
  for ((__lb_i=0; __lb_i<${#__lb_sv[@]}; __lb_i+=3)); do
    if [[ "${__lb_sv[__lb_i+1]}" = 1 ]]; then builtin export "${__lb_sv[__lb_i]}=${__lb_sv[__lb_i+2]}"; else builtin unset "${__lb_sv[__lb_i]}"; fi
  done
  if [[ -n "$__lb_owd" ]]; then builtin cd -- "$__lb_owd" >/dev/null 2>&1; fi
  if [[ "$__lb_in" != /dev/null ]]; then command rm -f -- "$__lb_in"; fi
  builtin printf '%s %s\n' "$1" "$2" >&3
}
builtin readonly -f __lb_pre __lb_post
shopt -s expand_aliases
"#;

/// The host ends of a session's pipes.
#[derive(Debug)]
struct Pipes {
    stdout: AsyncFd<OwnedFd>,
    stderr: AsyncFd<OwnedFd>,
    status: AsyncFd<OwnedFd>,
    data: AsyncFd<OwnedFd>,
    script: AsyncFd<OwnedFd>,
    status_buf: Vec<u8>,
}

/// A session's pipes in the runtime: `None` while idle beyond [`HeldPipes`]' bound (the
/// agent keeps its copies, asked for again by the next command).
type PipesSlot = tokio::sync::Mutex<Option<Pipes>>;

/// The sessions whose pipes the runtime keeps open between commands: the
/// `max` used last. An idle session holds five descriptors here; thousands of sandboxes
/// with a shell each would run the server out of them (issue 34), so beyond the bound the
/// least recently used session's are closed and asked for again from its agent (one round
/// trip) by its next command.
#[derive(Debug)]
pub(crate) struct HeldPipes {
    max: usize,
    inner: std::sync::Mutex<HeldInner>,
}

#[derive(Debug, Default)]
struct HeldInner {
    clock: u64,
    /// Last use → the session's pipes.
    by_use: BTreeMap<u64, Weak<PipesSlot>>,
}

impl HeldPipes {
    pub fn new(max: usize) -> Arc<HeldPipes> {
        Arc::new(HeldPipes {
            max,
            inner: std::sync::Mutex::new(HeldInner::default()),
        })
    }

    /// Records that `slot` (last used at `*stamp`, 0 for never) was used now; then closes
    /// the pipes of the least recently used sessions beyond the bound, those not in use.
    fn used(&self, slot: &Arc<PipesSlot>, stamp: &AtomicU64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_use.remove(&stamp.load(Ordering::Relaxed));
        inner.clock += 1;
        let now = inner.clock;
        inner.by_use.insert(now, Arc::downgrade(slot));
        stamp.store(now, Ordering::Relaxed);
        while inner.by_use.len() > self.max {
            let Some((_, oldest)) = inner.by_use.pop_first() else {
                break;
            };
            // One running a command puts itself back when it ends.
            if let Some(pipes) = oldest.upgrade() {
                if let Ok(mut held) = pipes.try_lock() {
                    *held = None;
                }
            }
        }
    }

    /// Forgets a session that is gone.
    fn forget(&self, stamp: &AtomicU64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_use.remove(&stamp.load(Ordering::Relaxed));
    }
}

/// One session. Commands are serialised by the async mutex around its pipes.
#[derive(Debug)]
pub(crate) struct Session {
    pub id: SessionId,
    /// The shell's pid in the sandbox.
    pub pid: i32,
    pub created_at: std::time::SystemTime,
    agent: AgentClient,
    pipes: Arc<PipesSlot>,
    held: Arc<HeldPipes>,
    /// Its last use in `held`.
    used_at: AtomicU64,
    busy: AtomicBool,
    dead: AtomicBool,
    next: AtomicU64,
    grace: Duration,
}

fn nonblocking(fd: OwnedFd) -> Result<AsyncFd<OwnedFd>, RuntimeError> {
    crate::util::async_fd(fd)
}

impl Pipes {
    /// The pipes from the agent's descriptors, in [`Op::Spawn`]'s order.
    fn of(fds: Vec<OwnedFd>) -> Result<Pipes, RuntimeError> {
        let mut fds = fds.into_iter();
        let mut next = || {
            fds.next()
                .ok_or_else(|| RuntimeError::Agent("sent too few descriptors".into()))
                .and_then(nonblocking)
        };
        Ok(Pipes {
            stdout: next()?,
            stderr: next()?,
            status: next()?,
            data: next()?,
            script: next()?,
            status_buf: Vec::new(),
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.held.forget(&self.used_at);
    }
}

impl Session {
    /// Starts the shell and sends it the protocol's functions.
    pub async fn start(
        agent: &AgentClient,
        id: SessionId,
        cwd: Option<String>,
        env: &BTreeMap<String, String>,
        grace: Duration,
        held: &Arc<HeldPipes>,
    ) -> Result<Session, RuntimeError> {
        let spec = SpawnSpec {
            argv: ["bash", "--norc", "--noprofile", "/proc/self/fd/5"]
                .map(String::from)
                .to_vec(),
            cwd,
            env_clear: false,
            env: env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            io: Io::Session,
        };
        let (result, fds) = agent.call(Op::Spawn(spec)).await?;
        let pid = match result {
            Ok(Body::Spawned { pid }) => pid,
            Ok(other) => return Err(other.unexpected("spawned").into()),
            Err(e) => {
                return Err(RuntimeError::SetupFailed(format!(
                    "starting bash: {}",
                    e.message
                )))
            }
        };
        let pipes = Pipes::of(fds)?;
        write_all(&pipes.script, PRELUDE.as_bytes()).await?;
        let session = Session {
            id,
            pid,
            created_at: std::time::SystemTime::now(),
            agent: agent.clone(),
            pipes: Arc::new(tokio::sync::Mutex::new(Some(pipes))),
            held: Arc::clone(held),
            used_at: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            next: AtomicU64::new(1),
            grace,
        };
        held.used(&session.pipes, &session.used_at);
        Ok(session)
    }

    pub fn info(&self) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            pid: self.pid,
            created_at: self.created_at,
            busy: self.busy.load(Ordering::Relaxed),
        }
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed) || self.agent.exit_of(self.pid).is_some()
    }

    fn terminated(&self, reason: &str) -> RuntimeError {
        RuntimeError::SessionTerminated {
            id: self.id.to_string(),
            reason: reason.to_owned(),
        }
    }

    /// Sends `signal` to the running command's whole tree (not the shell). No queueing.
    pub async fn interrupt(&self, signal: i32) -> Result<(), RuntimeError> {
        let (result, _) = self
            .agent
            .call(Op::Signal {
                pid: self.pid,
                signal,
                spare_main: true,
            })
            .await?;
        result.map(drop).map_err(|e| self.terminated(&e.message))
    }

    /// Kills the shell and everything in the session.
    pub async fn kill(&self) {
        self.dead.store(true, Ordering::Relaxed);
        let _ = self
            .agent
            .call(Op::KillTree {
                pid: self.pid,
                spare_main: false,
            })
            .await;
        let _ = self.agent.wait_exit(self.pid).await;
        self.agent.forget(self.pid);
    }

    /// Runs one command, its output into `sink`.
    pub async fn exec(&self, req: &ExecRequest, sink: &mut Sink) -> Result<ExecExit, RuntimeError> {
        let line = build_line(self.next.fetch_add(1, Ordering::Relaxed), req)?;
        let mut slot = self.pipes.lock().await;
        if self.is_dead() {
            return Err(self.terminated("the shell has exited"));
        }
        self.busy.store(true, Ordering::Relaxed);
        let result = match self.take_pipes(&mut slot).await {
            Ok(pipes) => self.run(pipes, &line, req, sink).await,
            Err(e) => Err(e),
        };
        self.busy.store(false, Ordering::Relaxed);
        if result.is_err() || self.dead.load(Ordering::Relaxed) {
            self.dead.store(true, Ordering::Relaxed);
            *slot = None;
            drop(slot);
            self.held.forget(&self.used_at);
            self.kill().await;
        } else {
            drop(slot);
            self.held.used(&self.pipes, &self.used_at);
        }
        result
    }

    /// The session's pipes, asked for again from the agent if they were closed here.
    async fn take_pipes<'a>(
        &self,
        slot: &'a mut Option<Pipes>,
    ) -> Result<&'a mut Pipes, RuntimeError> {
        if slot.is_none() {
            let (result, fds) = self.agent.call(Op::SessionPipes { pid: self.pid }).await?;
            match result {
                Ok(Body::Done) => {}
                Ok(other) => return Err(other.unexpected("done").into()),
                Err(e) => return Err(self.terminated(&e.message)),
            }
            *slot = Some(Pipes::of(fds)?);
        }
        slot.as_mut()
            .ok_or_else(|| RuntimeError::Agent("a session without pipes".into()))
    }

    async fn run(
        &self,
        pipes: &mut Pipes,
        line: &(u64, String),
        req: &ExecRequest,
        sink: &mut Sink,
    ) -> Result<ExecExit, RuntimeError> {
        let (id, line) = line;
        let Pipes {
            stdout,
            stderr,
            status,
            data,
            script,
            status_buf,
        } = pipes;
        let start = Instant::now();
        sink.start(&self.id).await;
        let mut script_left: &[u8] = line.as_bytes();
        let empty = Bytes::new();
        let stdin = req.stdin.as_ref().unwrap_or(&empty);
        let mut stdin_left: &[u8] = stdin;
        let mut timed_out = false;
        let mut phase = Escalation::Running;
        let mut alarm = req.timeout.map(|t| start + t);
        let mut out_eof = false;
        let mut err_eof = false;
        let code = loop {
            let wake = async {
                match alarm {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            let slot = sink.wants_slot();
            let reserve = async move {
                match slot {
                    Some(tx) => tx.reserve_owned().await,
                    None => std::future::pending().await,
                }
            };
            let may_read = sink.may_read();
            tokio::select! {
                biased;
                r = status.readable() => {
                    let mut g = r.map_err(RuntimeError::os("polling a session's pipes"))?;
                    let read = read_some(g.get_inner(), STATUS_LINE_MAX, |d| status_buf.extend_from_slice(d));
                    if read == Read::Empty {
                        g.clear_ready();
                    }
                    match take_status(status_buf, *id) {
                        Ok(Some(code)) => break code,
                        Ok(None) => {}
                        Err(Foreign) => {
                            sink.finish(stdout, stderr).await;
                            return Err(self.terminated("the shell's status pipe carried a line that was not this command's status (written by the command through a descriptor bash saved?)"));
                        }
                    }
                    if read == Read::Eof {
                        sink.finish(stdout, stderr).await;
                        // `exit N` in the command: the command ended with N, as in a shell
                        // script (the session ends with it; the next call gets a fresh one).
                        // A shell killed by a signal did not choose to end: terminated.
                        self.dead.store(true, Ordering::Relaxed);
                        let code = tokio::time::timeout(SHELL_RETURN_GRACE, self.agent.wait_exit(self.pid))
                            .await
                            .ok()
                            .and_then(Result::ok)
                            .and_then(|s| if s.signal.is_none() { s.code } else { None });
                        let Some(code) = code else {
                            return Err(self.terminated("the shell was killed"));
                        };
                        let exit = ExecExit {
                            exit_code: code,
                            timed_out,
                            duration: start.elapsed(),
                            session: self.id.clone(),
                        };
                        sink.exit(&exit).await;
                        return Ok(exit);
                    }
                    if status_buf.len() > STATUS_LINE_MAX {
                        sink.finish(stdout, stderr).await;
                        return Err(self.terminated("the shell's status pipe carried something else than status lines"));
                    }
                }
                // Before the readers: a writer that keeps a pipe always readable must not
                // keep the timeout from being seen.
                () = wake => {
                    timed_out = true;
                    let now = Instant::now();
                    match phase {
                        Escalation::Running => {
                            phase = Escalation::Terminated;
                            alarm = Some(now + self.grace);
                            self.signal_command(libc::SIGTERM).await;
                        }
                        Escalation::Terminated => {
                            phase = Escalation::Killed;
                            alarm = Some(now + SHELL_RETURN_GRACE);
                            let _ = self.agent.call(Op::KillTree { pid: self.pid, spare_main: true }).await;
                        }
                        Escalation::Killed => {
                            sink.finish(stdout, stderr).await;
                            return Err(self.terminated("the shell did not return after its command timed out (a shell builtin loop?)"));
                        }
                    }
                }
                permit = reserve => sink.slot(permit),
                r = stdout.readable(), if !out_eof && may_read => {
                    let mut g = r.map_err(RuntimeError::os("polling a session's pipes"))?;
                    match sink.read(g.get_inner(), Pipe::Stdout) {
                        Read::Empty => g.clear_ready(),
                        Read::More => {}
                        Read::Eof => out_eof = true,
                    }
                }
                r = stderr.readable(), if !err_eof && may_read => {
                    let mut g = r.map_err(RuntimeError::os("polling a session's pipes"))?;
                    match sink.read(g.get_inner(), Pipe::Stderr) {
                        Read::Empty => g.clear_ready(),
                        Read::More => {}
                        Read::Eof => err_eof = true,
                    }
                }
                r = script.writable(), if !script_left.is_empty() => {
                    let mut g = r.map_err(RuntimeError::os("polling a session's pipes"))?;
                    match rustix::io::write(g.get_inner(), script_left) {
                        Ok(n) => script_left = &script_left[n..],
                        Err(rustix::io::Errno::AGAIN) => g.clear_ready(),
                        Err(e) => return Err(self.terminated(&format!("writing to the shell: {e}"))),
                    }
                }
                r = data.writable(), if !stdin_left.is_empty() && script_left.is_empty() => {
                    let mut g = r.map_err(RuntimeError::os("polling a session's pipes"))?;
                    match rustix::io::write(g.get_inner(), stdin_left) {
                        Ok(n) => stdin_left = &stdin_left[n..],
                        Err(rustix::io::Errno::AGAIN) => g.clear_ready(),
                        Err(e) => return Err(self.terminated(&format!("writing stdin: {e}"))),
                    }
                }
            }
        };
        // Everything written before the status is in the pipes now.
        sink.finish(stdout, stderr).await;
        let exit = ExecExit {
            exit_code: if timed_out { TIMEOUT_EXIT } else { code },
            timed_out,
            duration: start.elapsed(),
            session: self.id.clone(),
        };
        sink.exit(&exit).await;
        Ok(exit)
    }

    async fn signal_command(&self, signal: i32) {
        let _ = self
            .agent
            .call(Op::Signal {
                pid: self.pid,
                signal,
                spare_main: true,
            })
            .await;
    }

    /// The shell's current directory and exported environment (for processes started
    /// "in" the session).
    pub async fn snapshot(&self) -> Result<(String, Vec<(String, String)>), RuntimeError> {
        let req = ExecRequest {
            command: "builtin printf '%s\\0' \"$PWD\"; env -0".into(),
            ..ExecRequest::default()
        };
        let mut sink = Sink::buffer(SNAPSHOT_MAX);
        let exit = self.exec(&req, &mut sink).await?;
        let r = sink.into_result(exit);
        let mut parts = r.stdout.split(|&b| b == 0);
        let cwd = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let env = parts
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect();
        Ok((cwd, env))
    }
}

/// Most bytes of the status pipe kept without a complete line (a status line is
/// `ID STATUS`, a few bytes); more ends the session rather than grow the buffer.
const STATUS_LINE_MAX: usize = 4096;

/// Most bytes of a session's cwd and environment read to start a process "in" it.
const SNAPSHOT_MAX: usize = 4 << 20;

/// A line on the status pipe that is not the running command's status: only the
/// command itself can have written it (bash keeps the pipe's descriptor, saved while
/// the command runs, where builtins can reach it), so the session cannot be trusted.
struct Foreign;

/// Takes `ID STATUS\n` for command `id` from the status buffer: its status when complete,
/// `Foreign` for any other line.
fn take_status(buf: &mut Vec<u8>, id: u64) -> Result<Option<i32>, Foreign> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    let line: Vec<u8> = buf.drain(..=nl).collect();
    let text = String::from_utf8_lossy(&line);
    let mut it = text.split_whitespace();
    match (
        it.next().map(str::parse::<u64>),
        it.next().map(str::parse::<i32>),
        it.next(),
    ) {
        (Some(Ok(got)), Some(Ok(code)), None) if got == id => Ok(Some(code)),
        _ => Err(Foreign),
    }
}

async fn write_all(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> Result<(), RuntimeError> {
    while !data.is_empty() {
        let mut g = fd
            .writable()
            .await
            .map_err(RuntimeError::os("writing to the shell"))?;
        match rustix::io::write(g.get_inner(), data) {
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::AGAIN) => g.clear_ready(),
            Err(e) => return Err(RuntimeError::os("writing to the shell")(e)),
        }
    }
    Ok(())
}

/// The protocol line for one command.
fn build_line(id: u64, req: &ExecRequest) -> Result<(u64, String), RuntimeError> {
    if req.command.contains('\0') {
        return Err(RuntimeError::invalid("command", "contains a NUL byte"));
    }
    let mut line = String::with_capacity(req.command.len() + 128);
    line.push_str("__lb_c=");
    line.push_str(&ansi_c_quote(req.command.as_bytes()));
    line.push_str("; \\__lb_pre ");
    match &req.stdin {
        Some(b) => line.push_str(&b.len().to_string()),
        None => line.push_str("-1"),
    }
    line.push(' ');
    let cwd = req.cwd.as_deref().unwrap_or("");
    if cwd.contains('\0') {
        return Err(RuntimeError::invalid("cwd", "contains a NUL byte"));
    }
    line.push_str(&ansi_c_quote(cwd.as_bytes()));
    crate::util::check_env(&req.env)?;
    for (k, v) in &req.env {
        line.push(' ');
        line.push_str(k);
        line.push(' ');
        line.push_str(&ansi_c_quote(v.as_bytes()));
    }
    line.push_str(" && \\builtin eval \"$__lb_c\" 3>&- 4<&- 5<&- <\"$__lb_in\"; \\__lb_post ");
    line.push_str(&id.to_string());
    line.push_str(" $?\n");
    Ok((id, line))
}

/// Where a timed-out command is on its way out: each time the alarm rings, the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escalation {
    /// Not timed out yet: the alarm sends SIGTERM to the command's tree.
    Running,
    /// SIGTERM sent: after the grace, the alarm kills the tree (the shell is spared).
    Terminated,
    /// Killed: if the shell has not printed the status soon after, the session is given up.
    Killed,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn slot() -> Arc<PipesSlot> {
        let fds = (0..5)
            .map(|_| rustix::pipe::pipe().unwrap().0)
            .collect::<Vec<_>>();
        Arc::new(tokio::sync::Mutex::new(Some(Pipes::of(fds).unwrap())))
    }

    #[tokio::test]
    async fn the_least_recently_used_idle_sessions_beyond_the_bound_close_their_pipes() {
        let held = HeldPipes::new(2);
        let slots: Vec<_> = (0..4).map(|_| slot()).collect();
        let stamps: Vec<_> = (0..4).map(|_| AtomicU64::new(0)).collect();
        let open = |i: usize| slots[i].try_lock().unwrap().is_some();
        held.used(&slots[0], &stamps[0]);
        held.used(&slots[1], &stamps[1]);
        held.used(&slots[0], &stamps[0]); // 0 again: 1 is now the oldest
        held.used(&slots[2], &stamps[2]);
        assert_eq!((open(0), open(1), open(2)), (true, false, true));
        // One running a command (its lock taken) keeps its pipes, and leaves the bound.
        let busy = slots[0].lock().await;
        held.used(&slots[3], &stamps[3]);
        drop(busy);
        assert_eq!((open(0), open(2), open(3)), (true, true, true));
        // A session gone leaves no entry that would push out a live one.
        held.forget(&stamps[3]);
        held.used(&slots[0], &stamps[0]);
        assert_eq!((open(0), open(2)), (true, true));
    }
}
