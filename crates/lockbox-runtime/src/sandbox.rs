//! One sandbox: its confine spawn (init + agent), its branch, sessions and processes.
//!
//! State lives in an [`Instance`] behind an `Arc` that operations clone: a workspace
//! `abort` replaces the instance (a fresh branch needs a fresh overlay mount), everything
//! else works on the instance it started with.

use lockbox_agent::{Body, Io, Op, SpawnSpec, AGENT_ARG};
use lockbox_cow::{Branch, SnapshotId, SnapshotStore};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent::AgentClient;
use crate::process::Process;
use crate::session::Session;
use crate::types::*;
use crate::RuntimeError;

/// The default session's id.
pub(crate) const DEFAULT_SESSION: &str = "default";

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running confine spawn and what lives in it.
#[derive(Debug)]
pub(crate) struct Instance {
    pub agent: AgentClient,
    running: Mutex<Option<lockbox_confine::Parked>>,
    pub branch: Mutex<Option<Branch>>,
    pub sessions: tokio::sync::Mutex<HashMap<SessionId, (Arc<Session>, SessionOptions)>>,
    pub processes: Mutex<BTreeMap<ProcessId, Arc<Process>>>,
    /// Held from the check of the process bounds to the record's insertion.
    starting: tokio::sync::Mutex<()>,
    /// Code contexts by id.
    pub contexts: tokio::sync::Mutex<BTreeMap<ContextId, Arc<crate::contexts::Context>>>,
    /// The snapshot its branch lies on (a fork's, or a restore's), if any.
    pub base: Option<SnapshotId>,
    /// A shell started ahead for the default session (a pooled instance's): the first
    /// command then pays no shell start. Not a session until used, so not listed.
    pub spare_default: Mutex<Option<Arc<Session>>>,
    /// Its network supervisor's approvals desk (`net_ask`), if any.
    pub approvals: Option<lockbox_netsup::Approvals>,
    /// The image it runs on, held until the sandbox is deleted (or the spare discarded).
    pub image: Option<ImageHold>,
}

/// A sandbox's hold on its image ([`image_holder`]).
#[derive(Debug)]
pub(crate) struct ImageHold {
    pub(crate) state_dir: PathBuf,
    pub(crate) id: String,
    sandbox: String,
    /// Where the root's writes go (`image commit` reads them), removed with the hold.
    pub(crate) root: Option<RootDir>,
}

/// An image sandbox's writable layer on the host: `<state-dir>/image-roots/<sandbox>-<n>/`
/// with `upper/` and `work/` (overlayfs's), removed when dropped (the sandbox is gone or
/// replaced); those a killed runtime left are removed when the next one starts.
#[derive(Debug)]
pub(crate) struct RootDir(pub(crate) PathBuf);

impl RootDir {
    fn make(state_dir: &Path, sandbox_id: &str) -> std::io::Result<RootDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = state_dir
            .join(IMAGE_ROOTS)
            .join(format!("{sandbox_id}-{}-{nanos}", std::process::id()));
        for sub in ["upper", "work"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        Ok(RootDir(dir))
    }
}

impl Drop for RootDir {
    fn drop(&mut self) {
        if let Err(e) = lockbox_image::remove_tree(&self.0) {
            tracing::warn!(dir = %self.0.display(), "removing an image root's writes: {e}");
        }
    }
}

/// The state directory's subdirectory of image sandboxes' writable layers.
const IMAGE_ROOTS: &str = "image-roots";

impl ImageHold {
    /// Releases the hold (a failure is logged: the next start-up releases it).
    pub fn release(&self) {
        release_image(&self.state_dir, Some(&self.id), &self.sandbox);
    }

    /// Releases the hold unless `now` (the instance that replaced its own) holds the same
    /// image: a restart after a tag moved runs on the new image and holds that one.
    pub fn release_unless_held_by(&self, now: Option<&ImageHold>) {
        if now.is_none_or(|h| h.id != self.id) {
            self.release();
        }
    }
}

impl Instance {
    /// Pauses all its processes (`None` once it has stopped: nothing runs).
    pub fn freeze(&self, timeout: Duration) -> std::io::Result<Option<lockbox_confine::Frozen>> {
        let running = lock(&self.running);
        running.as_ref().map(|r| r.freeze(timeout)).transpose()
    }

    /// The sandbox's root as its agent sees it, through `/proc/PID/root` of the agent: a
    /// process exec'd in the sandbox's user namespace, which the runtime's user owns, so
    /// the runtime may look in although the agent is not dumpable (its init, made before
    /// that namespace, may not be looked into). `None` once stopped.
    pub fn agent_root(&self) -> Option<PathBuf> {
        let init = lock(&self.running).as_ref()?.pid();
        let children =
            std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).ok()?;
        children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == AGENT_ARG.as_bytes()))
            })
            .map(|pid| PathBuf::from(format!("/proc/{pid}/root")))
    }

    /// Puts `net`'s list in force in its network supervisor (see
    /// [`lockbox_confine::Parked::replace_net`]); `None` once stopped.
    pub fn replace_net(
        &self,
        net: &lockbox_policy::Net,
    ) -> Option<Result<lockbox_netsup::NetList, lockbox_confine::NetUpdateError>> {
        let running = lock(&self.running);
        running.as_ref().map(|r| r.replace_net(net))
    }

    /// What its processes use now (`None` once stopped or if `/proc` cannot say).
    fn usage(&self) -> Option<ResourceUse> {
        let running = lock(&self.running);
        running.as_ref()?.usage().ok().map(ResourceUse::from)
    }
}

/// The runtime's bounds, as each sandbox applies them.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// The sandbox's SIGTERM → SIGKILL delay.
    pub grace: Duration,
    pub default_log_bytes: usize,
    pub max_exec_output: usize,
    pub max_sessions: usize,
    pub max_processes: usize,
    /// Shared by every sandbox of the runtime.
    pub log_budget: Arc<LogBudget>,
    /// The sessions whose pipes stay open between commands; shared by every sandbox.
    pub held_pipes: Arc<crate::session::HeldPipes>,
    /// All snapshots' bytes and entries at most (`RuntimeConfig::max_snapshot_bytes`,
    /// `max_snapshot_entries`).
    pub snapshots: lockbox_cow::SnapshotLimits,
}

/// The bytes all process logs may reserve together (`RuntimeConfig::max_log_memory`).
#[derive(Debug)]
pub(crate) struct LogBudget {
    max: usize,
    used: Mutex<usize>,
}

/// `bytes` of a [`LogBudget`], given back when dropped (with the log that holds it).
#[derive(Debug)]
pub(crate) struct LogReservation {
    budget: Arc<LogBudget>,
    bytes: usize,
}

impl LogBudget {
    pub fn new(max: usize) -> Arc<LogBudget> {
        Arc::new(LogBudget {
            max,
            used: Mutex::new(0),
        })
    }

    fn reserve(self: &Arc<Self>, bytes: usize) -> Option<LogReservation> {
        let mut used = lock(&self.used);
        if self.max - *used < bytes {
            return None;
        }
        *used += bytes;
        Some(LogReservation {
            budget: Arc::clone(self),
            bytes,
        })
    }
}

impl LogReservation {
    /// How many bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for LogReservation {
    fn drop(&mut self) {
        let mut used = lock(&self.budget.used);
        *used = used.saturating_sub(self.bytes);
    }
}

/// Everything about a sandbox; shared by its handles.
#[derive(Debug)]
pub(crate) struct SandboxInner {
    pub id: SandboxId,
    pub created_at: std::time::SystemTime,
    /// The spec it was created with. Its network may have been replaced since
    /// (`Runtime::replace_network`): what it runs with now is [`SandboxInner::spec_now`].
    pub spec: SandboxSpec,
    /// Its network policy now: `spec.policy.net` until replaced.
    pub net: Mutex<lockbox_policy::Net>,
    pub state_dir: PathBuf,
    pub agent_exe: PathBuf,
    /// The runtime's snapshot store.
    pub snapshots: lockbox_cow::SnapshotStore,
    pub limits: Limits,
    pub instance: Mutex<Arc<Instance>>,
    pub next_process: AtomicU64,
    pub last_used: Mutex<Instant>,
    pub stopped: AtomicBool,
    /// Serialises workspace operations (commit, abort) and deletion.
    pub lifecycle: tokio::sync::Mutex<()>,
    /// Exposed ports (kept across a workspace abort: the port's server restarts there).
    pub ports: crate::ports::Ports,
    /// The network supervisor's decisions (kept across a workspace abort).
    pub audit: Arc<crate::audit::AuditLog>,
}

impl SandboxInner {
    pub fn instance(&self) -> Arc<Instance> {
        lock(&self.instance).clone()
    }

    pub fn touch(&self) {
        *lock(&self.last_used) = Instant::now();
    }

    pub fn grace(&self) -> Duration {
        self.spec.policy.kill_grace
    }

    /// Its spec as it runs now: the created spec with the network in force. What its info
    /// shows and what its record, its snapshots (and so its forks and resumes) and a restart
    /// of its instance (a workspace abort, a restore) take.
    pub fn spec_now(&self) -> SandboxSpec {
        let mut spec = self.spec.clone();
        spec.policy.net = lock(&self.net).clone();
        spec
    }

    pub fn info(&self, state: SandboxState, branch_action: Option<BranchAction>) -> SandboxInfo {
        let inst = self.instance();
        let sessions = inst.sessions.try_lock().map(|s| s.len()).unwrap_or(0);
        let processes = lock(&inst.processes).len();
        let branch = lock(&inst.branch).as_ref().map(|b| b.id().clone());
        SandboxInfo {
            id: self.id.clone(),
            state,
            created_at: self.created_at,
            workdir: self.spec.workdir.clone(),
            branch,
            branch_action,
            labels: self.spec.labels.clone(),
            sessions,
            processes,
            policy: Some(PolicySummary::of(&self.spec_now())),
            usage: inst.usage(),
        }
    }
}

/// Variables a shell sets itself, not carried from a snapshot's session to its restore.
const SHELL_OWN_VARIABLES: &[&str] = &["PWD", "OLDPWD", "SHLVL", "_"];

/// A session's cwd and exported variables, as a snapshot records them (its `context`) and a
/// fork or restore starts the session again with them. Its serde is the snapshot record's
/// on-disk format (read back after a restart), private like `record.rs`, not the API.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct SessionState {
    #[serde(with = "session_id_text")]
    pub id: SessionId,
    pub cwd: String,
    pub env: BTreeMap<String, String>,
}

/// A session id in the snapshot record: its text (ids carry no serde of their own).
mod session_id_text {
    use super::SessionId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &SessionId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(id.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SessionId, D::Error> {
        String::deserialize(d).map(SessionId::from)
    }
}

/// Where a sandbox instance's files come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin<'a> {
    pub state_dir: &'a Path,
    pub snapshots: &'a SnapshotStore,
    /// A snapshot to lie on (a fork or a restore), or the workdir itself.
    pub base: Option<&'a SnapshotId>,
    /// Made ahead by the pool: its branch is recorded a spare from its creation (swept at
    /// start-up if the runtime dies before handing it out), until the take names it.
    pub spare: bool,
}

/// Starts a sandbox instance: branch (if a workdir; a fork of `origin.base` if given),
/// confine spawn of the agent, handshake.
pub(crate) async fn start_instance(
    spec: &SandboxSpec,
    origin: Origin<'_>,
    agent_exe: &Path,
    sandbox_id: &str,
    audit: &Arc<crate::audit::AuditLog>,
) -> Result<Instance, RuntimeError> {
    let mut policy = spec.policy.clone();
    policy.timeout = None; // a long-lived sandbox ends by delete or idle timeout
    let listed = matches!(
        policy.net,
        lockbox_policy::Net::Allow(_) | lockbox_policy::Net::Deny(_)
    );
    let sink = if listed {
        Some(audit.sink(sandbox_id)?)
    } else {
        None
    };
    let interceptor = crate::credentials::start(spec, &mut policy, sink.clone())?;
    let mut branch = match &spec.workdir {
        Some(dir) => {
            let context = branch_context(sandbox_id, spec, origin.spare);
            if !dir.is_dir() {
                return Err(RuntimeError::invalid(
                    "workdir",
                    format!("{} is not a directory", dir.display()),
                ));
            }
            let branch = match origin.base {
                None => Branch::create(origin.state_dir, dir, context),
                Some(id) => fork_branch(origin, id, dir, sandbox_id, context),
            }
            .map_err(RuntimeError::Branch)?;
            policy.mount_copy_on_write_at(
                spec.workdir_at.as_deref().unwrap_or(branch.workdir()),
                branch.workdir(),
                branch.layers(),
                branch.upper_dir(),
                branch.work_dir(),
                None,
            );
            Some(branch)
        }
        None if origin.base.is_some() => {
            return Err(RuntimeError::invalid(
                "from_snapshot",
                "a snapshot needs the sandbox to have its workdir",
            ))
        }
        None => None,
    };
    let approvals = match (spec.net_ask, &policy.net) {
        (Some(timeout), lockbox_policy::Net::Allow(_)) => Some(
            lockbox_netsup::Approvals::new(timeout)
                .map_err(RuntimeError::os("the approvals' desk"))?,
        ),
        (Some(_), _) => {
            return Err(RuntimeError::invalid(
                "net_ask",
                "net_ask asks about destinations off the allow-list: it needs net allow",
            ))
        }
        (None, _) => None,
    };
    // An image root: the image held for the sandbox's life (`image_holder`), its config
    // (Env, WorkingDir, User) applied to the policy the agent, and so every command it
    // starts, runs with.
    let image = match spec.policy.image.as_deref() {
        Some(reference) => match image_root(origin.state_dir, reference, sandbox_id, &mut policy) {
            Ok(held) => Some(held),
            Err(e) => {
                if let Some(b) = branch {
                    let _ = b.abort();
                }
                return Err(e);
            }
        },
        None => None,
    };
    let (image, image_id, root_dir) = match image {
        Some((root, id, dir)) => (Some(root), Some(id), Some(dir)),
        None => (None, None, None),
    };
    let started = spawn_agent(
        &policy,
        agent_exe,
        image,
        sink,
        approvals.clone(),
        interceptor,
    )
    .await;
    // The branch's record names the sandbox's init, so that `branch list` calls it an
    // orphan only once that init (and every process of the sandbox) is gone, not as soon as
    // this server is (issue 32). Recorded before the sandbox can write into the branch: its
    // agent writes only what this server asks, and it has asked nothing yet.
    let started = started.and_then(|(running, agent)| {
        let recorded = match branch.as_mut() {
            Some(b) => u32::try_from(running.pid())
                .map_err(std::io::Error::other)
                .and_then(lockbox_cow::SandboxInit::of)
                .map_err(RuntimeError::internal)
                .and_then(|init| b.record_sandbox(init).map_err(RuntimeError::Branch)),
            None => Ok(()),
        };
        // On an error, dropping `running` kills the sandbox.
        recorded.map(|()| (running, agent))
    });
    let (running, agent) = match started {
        Ok(x) => x,
        Err(e) => {
            if let Some(b) = branch {
                let _ = b.abort();
            }
            release_image(origin.state_dir, image_id.as_deref(), sandbox_id);
            return Err(e);
        }
    };
    Ok(Instance {
        agent,
        running: Mutex::new(Some(running)),
        branch: Mutex::new(branch),
        sessions: tokio::sync::Mutex::new(HashMap::new()),
        processes: Mutex::new(BTreeMap::new()),
        starting: tokio::sync::Mutex::new(()),
        contexts: tokio::sync::Mutex::new(BTreeMap::new()),
        base: origin.base.cloned(),
        spare_default: Mutex::new(None),
        approvals,
        image: image_id.map(|id| ImageHold {
            state_dir: origin.state_dir.to_owned(),
            id,
            sandbox: sandbox_id.to_owned(),
            root: root_dir,
        }),
    })
}

/// A branch of `dir` over snapshot `id`'s layers. The snapshot is held while the branch is
/// made; from then on the branch's record (which names the layers) keeps it from deletion.
/// What a sandbox's branch records of it: its id and policy, and whether it is a spare
/// fork of the pool (swept at start-up if its runtime died before handing it out).
pub(crate) fn branch_context(
    sandbox_id: &str,
    spec: &SandboxSpec,
    spare: bool,
) -> serde_json::Value {
    let mut context = serde_json::json!({ "sandbox": sandbox_id, "policy": &spec.policy });
    if spare {
        context[lockbox_cow::SPARE] = serde_json::Value::Bool(true);
    }
    context
}

fn fork_branch(
    origin: Origin<'_>,
    id: &SnapshotId,
    dir: &Path,
    sandbox_id: &str,
    context: serde_json::Value,
) -> Result<Branch, lockbox_cow::CowError> {
    let store = origin.snapshots;
    let hold = lockbox_cow::process_hold("fork", sandbox_id);
    store.hold(id, &hold)?;
    let made = (|| {
        // The callers checked that `dir` is the snapshot's workdir.
        let meta = store.get(id)?;
        let layers = store.layers(id)?;
        Branch::create_fork(origin.state_dir, dir, layers, meta.base_ctime, context)
    })();
    let _ = store.release(id, &hold);
    made
}

/// The holder name of sandbox `sandbox_id`'s hold on its image (docs/images.md).
pub(crate) fn image_holder(sandbox_id: &str) -> String {
    format!("{IMAGE_HOLDER_PREFIX}{sandbox_id}")
}

/// What every image holder of a runtime's sandboxes starts with: those left by a runtime
/// that ended without deleting its sandboxes are released when the next one opens the
/// state directory ([`release_stale_image_holds`]).
pub(crate) const IMAGE_HOLDER_PREFIX: &str = "sandbox-";

/// Holds the image `reference` (a store id once the sandbox was created) for sandbox
/// `sandbox_id` and applies its config to `policy`: its root for the agent's spawn, and
/// its id.
fn image_root(
    state_dir: &Path,
    reference: &str,
    sandbox_id: &str,
    policy: &mut lockbox_policy::Policy,
) -> Result<(lockbox_confine::ImageRoot, String, RootDir), RuntimeError> {
    let store = lockbox_image::Store::in_state_dir(state_dir).map_err(RuntimeError::Image)?;
    let image = store
        .hold(reference, &image_holder(sandbox_id))
        .map_err(RuntimeError::Image)?;
    // The agent is the command; the image's Entrypoint and Cmd are not used (a session
    // runs what it is asked).
    match lockbox_image::apply(&image, policy, &[AGENT_ARG.into()]) {
        Ok((mut root, _)) => match RootDir::make(state_dir, sandbox_id) {
            Ok(dir) => {
                root.upper = Some(lockbox_confine::RootUpper {
                    upper: dir.0.join("upper"),
                    work: dir.0.join("work"),
                });
                Ok((root, image.id, dir))
            }
            Err(e) => {
                let _ = store.release(&image.id, &image_holder(sandbox_id));
                Err(RuntimeError::Os {
                    what: "the image root's writable layer",
                    source: e,
                })
            }
        },
        Err(e) => {
            let _ = store.release(&image.id, &image_holder(sandbox_id));
            Err(RuntimeError::Image(e))
        }
    }
}

/// Releases sandbox `sandbox_id`'s hold on image `image_id`, if any.
fn release_image(state_dir: &Path, image_id: Option<&str>, sandbox_id: &str) {
    let Some(id) = image_id else {
        return;
    };
    let released = lockbox_image::Store::in_state_dir(state_dir)
        .and_then(|store| store.release(id, &image_holder(sandbox_id)));
    if let Err(e) = released {
        tracing::warn!(sandbox = sandbox_id, "releasing the image hold: {e}");
    }
}

/// Releases every image hold of a sandbox (holder `sandbox-ID`) that is not running:
/// at start-up, none of this state directory's sandboxes is (the state directory is
/// locked by one runtime at a time), so holds a killed runtime left go.
pub(crate) fn release_stale_image_holds(state_dir: &Path) {
    // No sandbox runs yet: every image root's writes left are a killed runtime's.
    let roots = state_dir.join(IMAGE_ROOTS);
    if roots.is_dir() {
        if let Err(e) = lockbox_image::remove_tree(&roots) {
            tracing::warn!("removing image roots a killed runtime left: {e}");
        }
    }
    let images = state_dir.join("images");
    if !images.is_dir() {
        return;
    }
    let swept = lockbox_image::Store::in_state_dir(state_dir).and_then(|store| {
        for image in store.list()? {
            for holder in image
                .holders
                .iter()
                .filter(|h| h.starts_with(IMAGE_HOLDER_PREFIX))
            {
                store.release(&image.id, holder)?;
            }
        }
        Ok(())
    });
    if let Err(e) = swept {
        tracing::warn!("releasing the image holds of sandboxes that are gone: {e}");
    }
}

async fn spawn_agent(
    policy: &lockbox_policy::Policy,
    agent_exe: &Path,
    image: Option<lockbox_confine::ImageRoot>,
    audit: Option<lockbox_netsup::AuditSink>,
    ask: Option<lockbox_netsup::Approvals>,
    interceptor: Option<Arc<lockbox_intercept::Interceptor>>,
) -> Result<(lockbox_confine::Parked, AgentClient), RuntimeError> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(RuntimeError::os("the agent's socket pair"))?;
    let mut policy = policy.clone();
    policy.pass_fds.push(theirs.as_raw_fd());
    let args: Vec<std::ffi::OsString> =
        vec![AGENT_ARG.into(), theirs.as_raw_fd().to_string().into()];
    let agent_exe = agent_exe.to_owned();
    let stdin = std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .map_err(RuntimeError::os("opening /dev/null"))?;
    let mut running = on_spawner_thread(move || {
        // The agent binary is bound read-only at a fixed path of the sandbox's own /dev; it
        // is also the sandbox's init once the agent runs (`main_if_agent` dispatches it).
        // Roots are copied from a template built once per policy (`root_template`): a
        // server starting thousands of sandboxes walks no host-wide task list per start.
        let mut spawn = lockbox_confine::Spawn::agent(&policy, &agent_exe, &args)
            .lean_init()
            .root_template()
            .stdio(lockbox_confine::Stdio {
                stdin: Some(stdin),
                stdout: None,
                stderr: None,
            });
        if let Some(sink) = audit {
            spawn = spawn.audit(sink);
        }
        if let Some(desk) = ask {
            spawn = spawn.ask(desk);
        }
        if let Some(interceptor) = interceptor {
            spawn = spawn.interceptor(interceptor);
        }
        if let Some(root) = image {
            // The agent runs through the host's loader bound beside it (lockbox-confine's
            // `loader`): an image need not have the libc it links.
            spawn = spawn.image_root(root);
        }
        let r = spawn.start();
        drop(theirs);
        r
    })
    .await?
    .map_err(setup_failed)?;
    let agent = AgentClient::new(ours)?;
    match agent.call(Op::Hello).await {
        Ok((Ok(body), _)) => match lockbox_agent::check_hello(body) {
            // Nothing reads the agent's outcome: its pidfd and report socket go, so that a
            // server holding thousands of sandboxes spends one descriptor on each (issue 34).
            Ok(_) => Ok((running.park(), agent)),
            Err(e) => {
                // An agent that answers, but not as this runtime speaks: end its sandbox.
                let _ = tokio::task::spawn_blocking(move || {
                    running.stop(Duration::ZERO, lockbox_confine::StopReason::Requested)
                })
                .await;
                Err(e.into())
            }
        },
        other => {
            // The agent never answered: the sandbox failed to set up. Its report says why.
            // A set-up step's own error keeps its code and hint (out of processes, say).
            let why = tokio::task::spawn_blocking(move || {
                match running.wait(Some(Instant::now() + Duration::from_secs(5)), None) {
                    Err(e) => RuntimeError::Setup(e),
                    Ok(lockbox_confine::Waited::Exited(o)) => RuntimeError::SetupFailed(format!(
                        "the sandbox agent exited with status {}",
                        o.exit_code()
                    )),
                    Ok(_) => RuntimeError::SetupFailed("the sandbox agent did not answer".into()),
                }
            })
            .await
            .unwrap_or_else(|e| RuntimeError::SetupFailed(e.to_string()));
            tracing::debug!(?other, "agent handshake failed");
            Err(why)
        }
    }
}

/// Runs `f` on one of the runtime's spawner threads, which live as long as the process.
///
/// The sandbox init has `PR_SET_PDEATHSIG`, which fires when the *thread* that forked it
/// exits; tokio's blocking threads exit after 10 s idle, which would kill every sandbox
/// they had started. So all sandboxes are started from threads that never exit. There is
/// one per core (2 to 16): a long-lived sandbox's init shares its caller's memory until it
/// has set up and executes its lean self, and its spawner waits until then (lockbox-confine's
/// `clone_sharing_memory`), so one thread would set up one sandbox at a time.
async fn on_spawner_thread<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, RuntimeError> {
    type Job = Box<dyn FnOnce() + Send>;
    static SPAWNER: Mutex<Option<std::sync::mpsc::Sender<Job>>> = Mutex::new(None);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    {
        let mut spawner = lock(&SPAWNER);
        let sender = match spawner.as_ref() {
            Some(s) => s.clone(),
            None => {
                let (s, jobs) = std::sync::mpsc::channel::<Job>();
                let jobs = Arc::new(Mutex::new(jobs));
                let threads =
                    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 16));
                let mut started = Ok(());
                for i in 0..threads {
                    let jobs = Arc::clone(&jobs);
                    let spawned = std::thread::Builder::new()
                        .name("lockbox-spawner".into())
                        .spawn(move || loop {
                            // The lock is held while waiting for a job, not while running it.
                            let next = lock(&jobs).recv();
                            match next {
                                Ok(job) => job(),
                                Err(_) => break,
                            }
                        });
                    // Fewer threads than cores only start fewer sandboxes at once.
                    if let Err(e) = spawned {
                        if i == 0 {
                            started = Err(e);
                        }
                        break;
                    }
                }
                started.map_err(RuntimeError::os("starting the sandbox spawner threads"))?;
                *spawner = Some(s.clone());
                s
            }
        };
        sender
            .send(job)
            .map_err(|_| RuntimeError::internal("the sandbox spawner threads are gone"))?;
    }
    rx.await
        .map_err(|_| RuntimeError::internal("the sandbox spawner thread failed"))
}

fn setup_failed(e: lockbox_confine::SetupError) -> RuntimeError {
    RuntimeError::Setup(e)
}

impl Instance {
    /// Kills everything in the instance (its init kills every process of the sandbox).
    pub async fn stop(&self, grace: Duration) {
        let running = lock(&self.running).take();
        if let Some(running) = running {
            let _ = tokio::task::spawn_blocking(move || running.stop(grace)).await;
        }
        self.agent.closed().await;
    }

    /// Starts the default session's shell ahead ([`Instance::spare_default`]).
    pub async fn start_spare_default(
        &self,
        grace: Duration,
        held: &Arc<crate::session::HeldPipes>,
    ) -> Result<(), RuntimeError> {
        let s = Session::start(
            &self.agent,
            DEFAULT_SESSION.into(),
            None,
            &BTreeMap::new(),
            grace,
            held,
        )
        .await?;
        *lock(&self.spare_default) = Some(Arc::new(s));
        Ok(())
    }

    /// Whether a pooled instance can still be handed out: its spare shell (and so its
    /// agent) is alive.
    pub fn spare_alive(&self) -> bool {
        lock(&self.spare_default)
            .as_ref()
            .is_some_and(|s| !s.is_dead())
    }

    /// True while a session runs a command or a code context runs code (activity, for
    /// the idle timeout).
    pub fn any_session_busy(&self) -> bool {
        let sessions = match self.sessions.try_lock() {
            Ok(s) => s.values().any(|(s, _)| s.info().busy),
            Err(_) => true, // being changed right now: activity
        };
        sessions
            || match self.contexts.try_lock() {
                Ok(c) => c.values().any(|c| c.busy()),
                Err(_) => true,
            }
    }

    /// Starts a session's shell with `opts`' cwd and variables.
    async fn start_session(
        &self,
        id: SessionId,
        opts: &SessionOptions,
        limits: &Limits,
    ) -> Result<Arc<Session>, RuntimeError> {
        let (cwd, env, grace) = (opts.cwd.clone(), &opts.env, limits.grace);
        let session = Session::start(&self.agent, id, cwd, env, grace, &limits.held_pipes);
        Ok(Arc::new(session.await?))
    }

    /// A session by id; the default session (and a terminated session) is created on use.
    pub async fn session(
        &self,
        id: Option<&str>,
        limits: &Limits,
    ) -> Result<Arc<Session>, RuntimeError> {
        let id = id.unwrap_or(DEFAULT_SESSION);
        let mut sessions = self.sessions.lock().await;
        let opts = match sessions.get(id) {
            Some((s, _)) if !s.is_dead() => return Ok(s.clone()),
            Some((_, opts)) => opts.clone(),
            None if id == DEFAULT_SESSION => {
                check_sessions(sessions.len(), limits)?;
                let spare = lock(&self.spare_default).take();
                if let Some(s) = spare.filter(|s| !s.is_dead()) {
                    sessions.insert(id.into(), (s.clone(), SessionOptions::default()));
                    return Ok(s);
                }
                SessionOptions::default()
            }
            None => {
                return Err(RuntimeError::SessionNotFound { id: id.to_owned() });
            }
        };
        let s = self.start_session(id.into(), &opts, limits).await?;
        sessions.insert(id.into(), (s.clone(), opts));
        Ok(s)
    }

    /// The cwd and exported variables of each of its live sessions that is not running a
    /// command (a busy one cannot be asked without waiting for its command), for a
    /// snapshot's record. Variables the shell keeps itself are left out.
    pub async fn session_states(&self) -> Vec<SessionState> {
        let sessions: Vec<(SessionId, Arc<Session>)> = {
            let sessions = self.sessions.lock().await;
            sessions
                .iter()
                .map(|(id, (s, _))| (id.clone(), Arc::clone(s)))
                .collect()
        };
        let mut out = Vec::new();
        for (id, s) in sessions {
            if s.is_dead() || s.info().busy {
                continue;
            }
            match s.snapshot().await {
                Ok((cwd, env)) => out.push(SessionState {
                    id,
                    cwd,
                    env: env
                        .into_iter()
                        .filter(|(k, _)| !SHELL_OWN_VARIABLES.contains(&k.as_str()))
                        .collect(),
                }),
                Err(e) => tracing::debug!(session = %id, "session state for a snapshot: {e}"),
            }
        }
        out
    }

    pub async fn create_session(
        &self,
        opts: SessionOptions,
        limits: &Limits,
    ) -> Result<SessionInfo, RuntimeError> {
        let id = match &opts.id {
            Some(id) if !crate::util::valid_id(id) => {
                return Err(RuntimeError::invalid(
                    "id",
                    "a session id is 1 to 64 characters of A-Z a-z 0-9 _ . -",
                ))
            }
            Some(id) => id.clone(),
            None => SessionId::from(format!("s-{}", crate::util::random_id())),
        };
        for k in opts.env.keys() {
            if !crate::util::valid_env_name(k) {
                return Err(RuntimeError::invalid(
                    "env",
                    format!("{k:?} is not a valid variable name"),
                ));
            }
        }
        let mut sessions = self.sessions.lock().await;
        match sessions.get(&id) {
            Some((s, _)) if !s.is_dead() => {
                return Err(RuntimeError::SessionExists { id: id.to_string() })
            }
            Some(_) => {} // a terminated one is replaced
            None => check_sessions(sessions.len(), limits)?,
        }
        let s = self.start_session(id.clone(), &opts, limits).await?;
        let info = s.info();
        sessions.insert(id, (s, opts));
        Ok(info)
    }

    pub async fn start_process(
        &self,
        id: ProcessId,
        spec: ProcessSpec,
        limits: &Limits,
    ) -> Result<ProcessInfo, RuntimeError> {
        let log_bytes = spec.log_bytes.unwrap_or(limits.default_log_bytes);
        if log_bytes > limits.log_budget.max {
            return Err(RuntimeError::invalid(
                "log_bytes",
                format!(
                    "{log_bytes} is more than all process logs may hold together ({})",
                    limits.log_budget.max
                ),
            ));
        }
        for k in spec.env.keys() {
            if !crate::util::valid_env_name(k) {
                return Err(RuntimeError::invalid(
                    "env",
                    format!("{k:?} is not a valid variable name"),
                ));
            }
        }
        let (argv, cwd, env_clear, mut env) = match &spec.command {
            ProcessCommand::Argv(argv) => {
                if argv.is_empty() {
                    return Err(RuntimeError::invalid("command", "the argv is empty"));
                }
                (argv.clone(), spec.cwd.clone(), false, Vec::new())
            }
            ProcessCommand::Shell { script, session } => {
                let s = self.session(session.as_deref(), limits).await?;
                let (cwd, env) = s.snapshot().await?;
                let argv = vec!["bash".to_owned(), "-c".to_owned(), script.clone()];
                (argv, Some(spec.cwd.clone().unwrap_or(cwd)), true, env)
            }
        };
        env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let io = match spec.pty {
            Some(p) => Io::Pty {
                cols: p.cols,
                rows: p.rows,
            },
            None => Io::Pipes { stdin: spec.stdin },
        };
        let _starting = self.starting.lock().await;
        let reservation = self.make_room(log_bytes, limits)?;
        let (result, fds) = self
            .agent
            .call(Op::Spawn(SpawnSpec {
                argv: argv.clone(),
                cwd,
                env_clear,
                env,
                io,
            }))
            .await?;
        let pid = match result {
            Ok(Body::Spawned { pid }) => pid,
            Ok(other) => return Err(other.unexpected("spawned").into()),
            Err(e) => return Err(RuntimeError::invalid("command", e.message)),
        };
        let p = Process::start(&self.agent, id.clone(), pid, argv, fds, io, reservation)?;
        let info = p.info();
        lock(&self.processes).insert(id, p);
        Ok(info)
    }

    /// Makes room for one more process with a log of `log_bytes`: forgets the oldest
    /// exited processes while the sandbox is at its count or the logs at their budget.
    fn make_room(&self, log_bytes: usize, limits: &Limits) -> Result<LogReservation, RuntimeError> {
        let mut procs = lock(&self.processes);
        loop {
            let counted = procs.len() < limits.max_processes;
            if counted {
                if let Some(reservation) = limits.log_budget.reserve(log_bytes) {
                    return Ok(reservation);
                }
            }
            let oldest = procs
                .values()
                .filter(|p| p.status().is_some())
                .min_by_key(|p| p.number())
                .map(|p| p.id.clone());
            match oldest {
                Some(id) => {
                    tracing::debug!(process = %id, "forgetting the oldest exited process to make room");
                    procs.remove(&id);
                }
                None if !counted => {
                    return Err(RuntimeError::LimitReached {
                        what: "max_processes".into(),
                        limit: limits.max_processes,
                    })
                }
                None => {
                    return Err(RuntimeError::LimitReached {
                        what: "max_log_memory".into(),
                        limit: limits.log_budget.max,
                    })
                }
            }
        }
    }

    pub fn process(&self, id: &str) -> Result<Arc<Process>, RuntimeError> {
        lock(&self.processes)
            .get(id)
            .cloned()
            .ok_or_else(|| RuntimeError::ProcessNotFound { id: id.to_owned() })
    }

    /// Signals a process's whole tree.
    pub async fn signal_process(&self, p: &Process, signal: i32) -> Result<(), RuntimeError> {
        if p.status().is_some() {
            return Err(RuntimeError::ProcessNotRunning {
                id: p.id.to_string(),
            });
        }
        let (result, _) = self
            .agent
            .call(Op::Signal {
                pid: p.pid,
                signal,
                spare_main: false,
            })
            .await?;
        result
            .map(drop)
            .map_err(|_| RuntimeError::ProcessNotRunning {
                id: p.id.to_string(),
            })
    }

    /// TERM, grace, KILL of the whole tree; returns when it is gone and logged.
    pub async fn kill_process(&self, p: &Process, grace: Duration) -> Result<(), RuntimeError> {
        if p.status().is_none() {
            let _ = self
                .agent
                .call(Op::Signal {
                    pid: p.pid,
                    signal: libc::SIGTERM,
                    spare_main: false,
                })
                .await;
            if tokio::time::timeout(grace, p.wait()).await.is_err() {
                let _ = self
                    .agent
                    .call(Op::KillTree {
                        pid: p.pid,
                        spare_main: false,
                    })
                    .await;
            }
        }
        p.wait().await;
        Ok(())
    }
}

impl Instance {
    /// A code context by id; the default context is created (Python) on first use.
    pub async fn context(
        &self,
        id: Option<&str>,
    ) -> Result<Arc<crate::contexts::Context>, RuntimeError> {
        use crate::contexts::{new_context, DEFAULT_CONTEXT, MAX_CONTEXTS};
        let id = id.unwrap_or(DEFAULT_CONTEXT);
        let mut contexts = self.contexts.lock().await;
        if let Some(c) = contexts.get(id) {
            return Ok(c.clone());
        }
        if id != DEFAULT_CONTEXT {
            return Err(RuntimeError::ContextNotFound { id: id.to_owned() });
        }
        if contexts.len() >= MAX_CONTEXTS {
            return Err(RuntimeError::LimitReached {
                what: "code contexts per sandbox".into(),
                limit: MAX_CONTEXTS,
            });
        }
        let c = Arc::new(new_context(
            &self.agent,
            id.into(),
            &ContextOptions::default(),
        )?);
        contexts.insert(id.into(), c.clone());
        Ok(c)
    }

    pub async fn create_context(&self, opts: ContextOptions) -> Result<ContextInfo, RuntimeError> {
        use crate::contexts::{check_id, new_context, MAX_CONTEXTS};
        let id = match &opts.id {
            Some(id) => {
                check_id(id)?;
                id.clone()
            }
            None => ContextId::from(format!("c-{}", crate::util::random_id())),
        };
        let c = new_context(&self.agent, id.clone(), &opts)?;
        let mut contexts = self.contexts.lock().await;
        if contexts.contains_key(&id) {
            return Err(RuntimeError::ContextExists { id: id.to_string() });
        }
        if contexts.len() >= MAX_CONTEXTS {
            return Err(RuntimeError::LimitReached {
                what: "code contexts per sandbox".into(),
                limit: MAX_CONTEXTS,
            });
        }
        let info = c.info();
        contexts.insert(id, Arc::new(c));
        Ok(info)
    }
}

/// `LIMIT_REACHED` when a sandbox with `open` sessions may not start another.
fn check_sessions(open: usize, limits: &Limits) -> Result<(), RuntimeError> {
    if open >= limits.max_sessions {
        return Err(RuntimeError::LimitReached {
            what: "max_sessions".into(),
            limit: limits.max_sessions,
        });
    }
    Ok(())
}
