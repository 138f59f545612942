//! The pre-arm helper: a per-user process that keeps spares — sandboxes armed for the
//! policies `lockbox run` used lately ([`lockbox_confine::Spawn::armed`]) — and runs the
//! commands handed to it in them, supervising each as `lockbox run` would and sending its
//! outcome back.
//!
//! Threads: the accepting one (main), one per connection, and the armer, which makes every
//! spare. The armer lives as long as the helper: a sandbox's init dies with the thread that
//! cloned it (its parent-death signal), so the spares die with the helper, and only then.
//!
//! Bounds: `spares` per policy, `policies` policies (the least recently used one goes), a
//! spare older than [`MAX_AGE`] is made again (what it resolved on the host may have
//! changed), and the helper exits after `idle` without a request.

use super::wire::{self, Ended, PolicyStatus, Reply, Request, RunRequest, StatusReport};
use lockbox_confine::{Armed, ArmedCommand, Running, Scheduling, Spawn, Stdio, StopReason, Waited};
use lockbox_policy::Policy;
use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long pausing a run's processes may take (see `lockbox_confine::freeze_tree`).
const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A spare older than this is made again.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(60);

/// How the helper runs (`lockbox pre-arm start`'s flags).
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub spares: usize,
    pub policies: usize,
    pub idle: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            spares: 2,
            policies: 4,
            idle: Duration::from_secs(600),
        }
    }
}

/// What spares are kept for: a policy (its timeout and grace left out: they do not change
/// the set-up) seen from a directory.
type Key = (String, PathBuf);

struct Entry {
    policy: Policy,
    cwd: PathBuf,
    /// Each spare, when it was made, and the scheduling it inherited from the armer.
    spares: VecDeque<(Armed, Instant, Scheduling)>,
    last_used: Instant,
    /// Why arming this policy failed, if it did: it is not tried again (a run starts
    /// directly and says why).
    broken: Option<String>,
}

struct State {
    opts: Options,
    socket: PathBuf,
    /// The socket file as bound (device, inode).
    socket_id: Option<(u64, u64)>,
    entries: Mutex<HashMap<Key, Entry>>,
    armer: Mutex<mpsc::Sender<Key>>,
    last_request: Mutex<Instant>,
    running: AtomicUsize,
    handed_over: AtomicU64,
    misses: AtomicU64,
    shutdown: AtomicBool,
}

impl State {
    fn entries(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        // A thread that panicked with the lock held leaves the map as it was: keep going.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn arm_later(&self, key: Key) {
        let _ = self
            .armer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(key);
    }

    fn touch(&self) {
        *self.last_request.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle_for(&self) -> Duration {
        self.last_request
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }
}

/// The key of `policy` seen from `cwd`, and the policy spares are armed with.
fn key_of(policy: &Policy, cwd: &std::path::Path) -> (Key, Policy) {
    let mut armed = policy.clone();
    armed.timeout = None;
    armed.kill_grace = Policy::default().kill_grace;
    let text = serde_json::to_string(&armed).unwrap_or_default();
    ((text, cwd.to_owned()), armed)
}

/// Runs the helper in this process until it is idle, asked to stop, or killed. Returns
/// `Ok(false)` when another helper already serves this socket.
pub(crate) fn serve(opts: Options) -> Result<bool, String> {
    // Away from the starter's terminal and session, and passing on none of its ignores.
    let _ = rustix::process::setsid();
    lockbox_confine::unignore_signals();
    let dir = super::socket_dir()?;
    // Holding the starter's directory would keep its filesystem busy for the helper's life.
    let _ = std::env::set_current_dir("/");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(super::lock_path(&dir))
        .map_err(|e| format!("{}: {}", super::lock_path(&dir).display(), e))?;
    match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(false),
        Err(e) => return Err(format!("locking {}: {e}", super::lock_path(&dir).display())),
    }
    let socket = super::socket_path(&dir);
    // Ours now (we hold the lock): whatever is there is a dead helper's.
    let _ = std::fs::remove_file(&socket);
    let listener = listen(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let (tx, rx) = mpsc::channel();
    let state = Arc::new(State {
        opts,
        socket_id: socket_identity(&socket),
        socket: socket.clone(),
        entries: Mutex::new(HashMap::new()),
        armer: Mutex::new(tx),
        last_request: Mutex::new(Instant::now()),
        running: AtomicUsize::new(0),
        handed_over: AtomicU64::new(0),
        misses: AtomicU64::new(0),
        shutdown: AtomicBool::new(false),
    });
    let armer = {
        let state = Arc::clone(&state);
        std::thread::Builder::new()
            .name("armer".into())
            .spawn(move || arm_loop(&state, &rx))
            .map_err(|e| format!("starting the armer: {e}"))?
    };
    accept_loop(&state, &listener);
    // No new connection from here; the spares go with the armer's end.
    if socket_identity(&socket) == state.socket_id {
        let _ = std::fs::remove_file(&socket);
    }
    drop(listener);
    state.shutdown.store(true, Ordering::SeqCst);
    let (dead, _) = mpsc::channel();
    *state.armer.lock().unwrap_or_else(|e| e.into_inner()) = dead;
    let _ = armer.join();
    state.entries().clear();
    // Runs in progress finish (their sandboxes are the connection threads').
    while state.running.load(Ordering::SeqCst) > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(lock);
    Ok(true)
}

fn listen(path: &std::path::Path) -> std::io::Result<OwnedFd> {
    let fd = net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    net::bind(&fd, &SocketAddrUnix::new(path)?)?;
    net::listen(&fd, 128)?;
    Ok(fd)
}

fn accept_loop(state: &Arc<State>, listener: &OwnedFd) {
    let me = rustix::process::getuid();
    let ours = state.socket_id;
    loop {
        if state.shutdown.load(Ordering::SeqCst) {
            return;
        }
        // A socket removed or replaced (its directory deleted, say) reaches nobody: end.
        if ours.is_none() || socket_identity(&state.socket) != ours {
            return;
        }
        if state.idle_for() >= state.opts.idle && state.running.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut fds = [rustix::event::PollFd::new(
            listener,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        let Ok(conn) = net::accept_with(listener, SocketFlags::CLOEXEC) else {
            continue;
        };
        // Only this user's processes (the directory is closed to others as well).
        match net::sockopt::socket_peercred(&conn) {
            Ok(cred) if cred.uid == me => {}
            _ => continue,
        }
        // A run's request is usually there as the connection is: its spare is released
        // here, a wake-up sooner than by a thread started for it; the thread supervises.
        let first = match wire::try_recv::<Request>(conn.as_fd()) {
            Ok(Some(first)) => Some(first),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            // Closed already, or not a request of ours.
            Ok(None) | Err(_) => continue,
        };
        let started = match first {
            Some((Request::Run(run), fds)) => match begin_run(state, &conn, *run, fds) {
                Some(started) => Work::Supervise(Box::new(started)),
                None => continue,
            },
            other => Work::Serve(other),
        };
        let state = Arc::clone(state);
        let _ = std::thread::Builder::new()
            .name("pre-armed run".into())
            .spawn(move || match started {
                Work::Supervise(started) => finish_run(&state, &conn, *started),
                Work::Serve(first) => serve_connection(&state, conn, first),
            });
    }
}

/// What a connection's thread does: supervise a run the accepting thread started, or serve
/// the connection from its first request (received already, or to come).
enum Work {
    Supervise(Box<Started>),
    Serve(Option<(Request, Vec<OwnedFd>)>),
}

/// Wakes the accepting thread from its poll (a connection it takes and drops), so that it
/// sees `shutdown` now rather than within its poll's second: `pre-arm stop` waits for the end.
fn wake_accepting(socket: &std::path::Path) {
    if let (Ok(fd), Ok(addr)) = (
        net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        ),
        SocketAddrUnix::new(socket),
    ) {
        let _ = net::connect(&fd, &addr);
    }
}

/// The (device, inode) of the socket file at `path`.
fn socket_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn serve_connection(state: &State, conn: OwnedFd, first: Option<(Request, Vec<OwnedFd>)>) {
    let Some((request, fds)) = first.or_else(|| wire::recv::<Request>(conn.as_fd()).ok().flatten())
    else {
        return;
    };
    tracing::debug!("pre-arm: request");
    let reply = match request {
        Request::Run(run) => {
            if let Some(started) = begin_run(state, &conn, *run, fds) {
                finish_run(state, &conn, started);
            }
            return;
        }
        Request::Status => Reply::Status(status(state)),
        Request::Shutdown => {
            state.shutdown.store(true, Ordering::SeqCst);
            wake_accepting(&state.socket);
            Reply::Stopping
        }
        Request::Signal(_) | Request::Terminate | Request::Suspend | Request::Resume => {
            Reply::Miss("no run on this connection".into())
        }
    };
    let _ = wire::send(conn.as_fd(), &reply, &[]);
}

fn status(state: &State) -> StatusReport {
    let entries = state.entries();
    let mut policies: Vec<PolicyStatus> = entries
        .values()
        .map(|e| PolicyStatus {
            cwd: e.cwd.clone(),
            policy: summary(&e.policy),
            spares: e.spares.len(),
            last_used_s_ago: e.last_used.elapsed().as_secs(),
        })
        .collect();
    policies.sort_by_key(|p| p.last_used_s_ago);
    StatusReport {
        pid: std::process::id(),
        socket: state.socket.clone(),
        spares_per_policy: state.opts.spares,
        max_policies: state.opts.policies,
        idle_exit_s: state.opts.idle.as_secs(),
        runs_in_progress: state.running.load(Ordering::SeqCst),
        runs_handed_over: state.handed_over.load(Ordering::SeqCst),
        misses: state.misses.load(Ordering::SeqCst),
        policies,
    }
}

/// The policy's JSON, shortened for `lockbox pre-arm status`.
fn summary(policy: &Policy) -> String {
    let text = serde_json::to_string(policy).unwrap_or_default();
    match text.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

/// Takes a live, fresh spare of `key`'s policy made with the caller's `scheduling`, if
/// there is one; asks the armer for more when there is none.
fn take_spare(
    state: &State,
    key: &Key,
    policy: &Policy,
    scheduling: Scheduling,
) -> Result<Armed, String> {
    let mut entries = state.entries();
    if !entries.contains_key(key) && entries.len() >= state.opts.policies {
        // Room for this policy: the least recently used one goes, with its spares.
        if let Some(oldest) = entries
            .iter()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(k, _)| k.clone())
        {
            entries.remove(&oldest);
        }
    }
    let entry = entries.entry(key.clone()).or_insert_with(|| Entry {
        policy: policy.clone(),
        cwd: key.1.clone(),
        spares: VecDeque::new(),
        last_used: Instant::now(),
        broken: None,
    });
    entry.last_used = Instant::now();
    if let Some(why) = &entry.broken {
        return Err(format!("this policy cannot be armed: {why}"));
    }
    let mut found = None;
    while let Some((spare, made, inherited)) = entry.spares.pop_front() {
        // Its command would run with the helper's priority, not the caller's: leave it.
        if inherited != scheduling {
            entry.spares.push_front((spare, made, inherited));
            return Err(format!(
                "the caller's scheduling ({scheduling:?}) is not the helper's ({inherited:?})"
            ));
        }
        // An ended spare only has its failure to tell; an old one may have resolved a host
        // that has changed since.
        if !spare.ended() && made.elapsed() < MAX_AGE {
            found = Some(spare);
            break;
        }
    }
    drop(entries);
    match found {
        Some(spare) => Ok(spare),
        None => {
            state.arm_later(key.clone());
            Err("no spare for this policy yet".to_owned())
        }
    }
}

/// A run whose spare was released: supervised by [`finish_run`].
struct Started {
    running: Running,
    run: RunRequest,
    key: Key,
}

/// Takes a spare for `run` and releases it with the caller's stdio and command; answers
/// the caller itself when there is none (a miss) or it fails. Counted as running until
/// [`finish_run`].
fn begin_run(state: &State, conn: &OwnedFd, run: RunRequest, fds: Vec<OwnedFd>) -> Option<Started> {
    state.touch();
    let miss = |why: String| {
        state.misses.fetch_add(1, Ordering::SeqCst);
        let _ = wire::send(conn.as_fd(), &Reply::Miss(why), &[]);
        None
    };
    let Ok::<[OwnedFd; 4], _>([stdin, stdout, stderr, command]) = fds.try_into() else {
        return miss("a run takes four descriptors".into());
    };
    // Asked to stop: the caller starts directly, as with no helper.
    if state.shutdown.load(Ordering::SeqCst) {
        return miss("the helper is stopping".into());
    }
    let (key, armed_policy) = key_of(&run.policy, &run.cwd);
    let armed = match take_spare(state, &key, &armed_policy, run.scheduling) {
        Ok(armed) => armed,
        Err(why) => return miss(why),
    };
    state.handed_over.fetch_add(1, Ordering::SeqCst);
    let command = ArmedCommand::from_fd(command, run.program.clone());
    let stdio = Stdio {
        stdin: Some(stdin),
        stdout: Some(stdout),
        stderr: Some(stderr),
    };
    let released = armed.release(stdio, &command);
    // Whether it started or not, the spare was used: another is made after this run.
    let running = match released {
        Ok(running) => running,
        Err(e) => {
            failed(conn, &e);
            state.arm_later(key);
            return None;
        }
    };
    tracing::debug!("pre-arm: released");
    state.running.fetch_add(1, Ordering::SeqCst);
    Some(Started { running, run, key })
}

/// Supervises a started run to its end, answers, and has the used spare made again.
fn finish_run(state: &State, conn: &OwnedFd, started: Started) {
    let Started {
        mut running,
        run,
        key,
    } = started;
    // Nothing is said as the command starts (the caller would wake for it while the command
    // starts): the end says where it started. A caller gone meanwhile ends the run.
    match supervise(&mut running, &run.policy, conn) {
        Ok(Some(outcome)) => {
            tracing::debug!("pre-arm: ended");
            let ended = Ended {
                pre_armed: true,
                ..Ended::of(&outcome)
            };
            let cwd = running.cwd().to_owned();
            let _ = wire::send(conn.as_fd(), &Reply::Ran { ended, cwd }, &[]);
            tracing::debug!("pre-arm: reported");
        }
        Ok(None) => {}
        Err(e) => failed(conn, &e),
    }
    // The used sandbox goes (its init waits for that to exit and tear its namespaces
    // down: `Prepared::linger` in lockbox-confine), and the replacement is made, once this
    // run is over and its caller has taken the answer and gone (or after a moment): the
    // teardown and the replacement's fork and set-up are a core's work for 2-3 ms, which
    // would otherwise hold up the caller's end on a small machine (and, made at once, the
    // start: the fork holds this process's memory map).
    let mut gone = [rustix::event::PollFd::new(
        conn,
        rustix::event::PollFlags::IN,
    )];
    let moment = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    let _ = rustix::event::poll(&mut gone, Some(&moment));
    state.arm_later(key);
    running.drop_and_reap();
    state.running.fetch_sub(1, Ordering::SeqCst);
}

fn failed(conn: &OwnedFd, e: &lockbox_confine::SetupError) {
    let reply = Reply::Failed {
        message: e.to_string(),
        hint: e.hint(),
    };
    let _ = wire::send(conn.as_fd(), &reply, &[]);
}

/// Supervises a handed-over run as `lockbox run` supervises its own: the policy's timeout,
/// the caller's signals (as messages), and the caller's end (the run is killed, as a
/// direct start's sandbox dies with its `lockbox`). `None`: the caller is gone.
fn supervise(
    running: &mut Running,
    policy: &Policy,
    conn: &OwnedFd,
) -> Result<Option<lockbox_confine::Outcome>, lockbox_confine::SetupError> {
    let deadline = policy.timeout.map(|t| Instant::now() + t);
    // Paused while the caller is stopped (Ctrl-Z); resumed with it, or when dropped.
    let mut paused = None;
    loop {
        match running.wait(deadline, Some(conn.as_fd()))? {
            Waited::Exited(outcome) => return Ok(Some(outcome)),
            Waited::Deadline => {
                return running
                    .stop(policy.kill_grace, StopReason::Timeout)
                    .map(Some)
            }
            Waited::Extra => match wire::recv::<Request>(conn.as_fd()) {
                Ok(Some((Request::Signal(sig), _))) => running.signal(sig)?,
                Ok(Some((Request::Suspend, _))) => {
                    if paused.is_none() {
                        paused = lockbox_confine::freeze_tree(running.pid(), PAUSE_TIMEOUT).ok();
                    }
                }
                Ok(Some((Request::Resume, _))) => {
                    if let Some(frozen) = paused.take() {
                        frozen.thaw();
                    }
                }
                Ok(Some((Request::Terminate, _))) => {
                    return running
                        .stop(policy.kill_grace, StopReason::Requested)
                        .map(Some)
                }
                // Anything else is not a caller of ours.
                Ok(Some(_)) | Ok(None) | Err(_) => {
                    let _ = running.stop(Duration::ZERO, StopReason::Requested);
                    return Ok(None);
                }
            },
        }
    }
}

/// The armer: makes the spares each key lacks, when asked and every few seconds (spares
/// past [`MAX_AGE`] are made again; policies unused for `idle` are dropped).
fn arm_loop(state: &State, rx: &mpsc::Receiver<Key>) {
    loop {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(key) => fill(state, &key),
            Err(mpsc::RecvTimeoutError::Timeout) => refresh(state),
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if state.shutdown.load(Ordering::SeqCst) {
            return;
        }
    }
}

fn fill(state: &State, key: &Key) {
    loop {
        let (policy, cwd) = {
            let entries = state.entries();
            let Some(entry) = entries.get(key) else {
                return;
            };
            if entry.broken.is_some() || entry.spares.len() >= state.opts.spares {
                return;
            }
            (entry.policy.clone(), entry.cwd.clone())
        };
        let made = Spawn::armed(&policy).caller_cwd(&cwd).arm();
        let mut entries = state.entries();
        let Some(entry) = entries.get_mut(key) else {
            return;
        };
        match made {
            Ok(armed) => {
                entry
                    .spares
                    .push_back((armed, Instant::now(), lockbox_confine::scheduling()))
            }
            Err(e) => {
                tracing::info!("pre-arm: cannot arm a policy: {e}");
                entry.broken = Some(e.to_string());
                return;
            }
        }
        if state.shutdown.load(Ordering::SeqCst) {
            return;
        }
    }
}

fn refresh(state: &State) {
    let keys: Vec<Key> = {
        let mut entries = state.entries();
        entries.retain(|_, e| e.last_used.elapsed() < state.opts.idle);
        for entry in entries.values_mut() {
            entry
                .spares
                .retain(|(spare, made, _)| !spare.ended() && made.elapsed() < MAX_AGE);
        }
        entries.keys().cloned().collect()
    };
    for key in keys {
        fill(state, &key);
    }
}
