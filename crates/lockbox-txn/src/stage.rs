//! Running one stage (or gather source, or consumer) of a transaction: its sandbox on an
//! overlay of the workdir, its stdio, its [`StageResult`].

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lockbox_confine::{Gated, ImageRoot, SetupError, Status, Stdio, StopReason, Waited};
use lockbox_policy::{Overlay, OverlayUpper, Policy};

use crate::capture::{self, Output};
use crate::TxnError;

/// One command of a transaction: a name, its policy and its argv. The coordinator adds the
/// workdir overlay to the policy; everything else (reads, limits, timeout, env) is the
/// caller's.
#[derive(Debug, Clone)]
pub struct Stage {
    /// A name for reports (`stage-1`, ... unless set; for gather sources the source name).
    pub name: String,
    /// The sandbox policy.
    pub policy: Policy,
    /// The command.
    pub argv: Vec<OsString>,
    /// How many times a failed run is retried, each time on a fresh upper layer (the failed
    /// attempt's writes are discarded) and with the same stdin.
    pub retries: u32,
    /// Where in the workdir the stage may write: `None` anywhere; `Some(paths)` only at or
    /// below these directories (relative to the workdir, or absolute inside it; missing
    /// ones are created, empty, in the stage's layer); `Some(vec![])` nowhere (a read-only
    /// view). Enforced by mounts, Landlock and a check of the layer afterwards (see
    /// [`lockbox_policy::Overlay::writable`]).
    pub writable: Option<Vec<PathBuf>>,
    /// The root of the image named by `policy.image` (its layers, resolved by the caller:
    /// see [`crate::TxnSpec::build_with_images`]); `None` for the host's userland.
    pub image_root: Option<ImageRoot>,
}

impl Stage {
    /// A stage running `argv` under `policy`.
    pub fn new(policy: Policy, argv: Vec<OsString>) -> Stage {
        Stage {
            name: String::new(),
            policy,
            argv,
            retries: 0,
            writable: None,
            image_root: None,
        }
    }

    /// A stage running `/bin/sh -c script` under `policy`.
    pub fn sh(policy: Policy, script: &str) -> Stage {
        Stage::new(policy, vec!["/bin/sh".into(), "-c".into(), script.into()])
    }

    /// Sets the name.
    pub fn named(mut self, name: &str) -> Stage {
        self.name = name.to_owned();
        self
    }

    /// Sets how many times a failed run is retried.
    pub fn retries(mut self, retries: u32) -> Stage {
        self.retries = retries;
        self
    }

    /// Lets the stage write only at or below `paths` (directories relative to the workdir,
    /// or absolute inside it); an empty list makes its view of the workdir read-only.
    pub fn writable<P: Into<PathBuf>>(mut self, paths: impl IntoIterator<Item = P>) -> Stage {
        self.writable = Some(paths.into_iter().map(Into::into).collect());
        self
    }

    /// Makes the stage's view of the workdir read-only (it may still write its own `/tmp`).
    pub fn read_only(self) -> Stage {
        self.writable(Vec::<PathBuf>::new())
    }

    /// Runs the stage on an image's root, the one `policy.image` names (resolved to its
    /// layers by the caller, which also applied the image's config to the policy).
    pub fn image_root(mut self, root: ImageRoot) -> Stage {
        self.image_root = Some(root);
        self
    }
}

/// How one stage ended. Always present for every stage that ran, even when the transaction
/// aborted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StageResult {
    /// The stage's name.
    pub name: String,
    /// The exit code as `lockbox run` gives it (128+N for signal N, 124 timeout, 125 setup
    /// failure, 127 not found).
    pub exit_code: i32,
    /// The signal that killed the command, if any.
    pub signal: Option<i32>,
    /// Stopped because its policy's timeout expired.
    pub timed_out: bool,
    /// Wall-clock time.
    pub duration: Duration,
    /// The last bytes of its stderr ([`crate::STDERR_TAIL`]), lossily decoded.
    pub stderr_tail: String,
    /// Bytes it wrote to stdout.
    pub stdout_len: u64,
    /// The setup error, when the sandbox could not be set up (exit code 125).
    pub setup_error: Option<String>,
    /// How many times it ran (1 + retries used).
    pub attempts: u32,
    /// What a stage restricted by [`Stage::writable`] changed outside its writable paths
    /// (relative to the workdir): metadata changes (chmod, chown, utimes, xattrs), which
    /// Landlock does not stop. Any fails the stage.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "lockbox_policy::name::json::vec"
    )]
    pub outside_writable: Vec<PathBuf>,
}

impl StageResult {
    /// Exited 0 in time.
    pub fn succeeded(&self) -> bool {
        self.exit_code == 0
            && !self.timed_out
            && self.setup_error.is_none()
            && self.outside_writable.is_empty()
    }
}

/// Where a stage's stdin comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Input<'a> {
    /// `/dev/null`.
    Null,
    /// The bytes of an earlier output.
    Output(&'a Output),
}

/// The overlay a stage sees: `lowers` top first (ending with the workdir), and the upper it
/// writes (its own, or its unit's).
pub(crate) struct View<'a> {
    pub(crate) workdir: &'a Path,
    pub(crate) lowers: Vec<PathBuf>,
    pub(crate) upper: PathBuf,
    pub(crate) work: PathBuf,
}

pub(crate) struct Ran {
    pub(crate) result: StageResult,
    pub(crate) stdout: Output,
}

/// Runs `stage` on `view` (none: the policy as it is), stdin from `input`, stdout captured
/// (spilling to `spill`), stderr's tail kept. `extra_env` is added to the stage's environment
/// and `extra_reads` to the paths it may read.
#[cfg(feature = "journaled")]
pub(crate) fn run(
    stage: &Stage,
    view: Option<&View<'_>>,
    input: Input<'_>,
    spill: &Path,
    memory_bound: usize,
    extra_env: &[(String, String)],
    extra_reads: &[PathBuf],
) -> Result<Ran, TxnError> {
    let armed = arm(&[stage], view, extra_env, extra_reads);
    let io = reading(stage, input)?;
    fire(stage, view, armed, io, spill, memory_bound, || {}).map(|(ran, _)| ran)
}

/// The stdio of a stage reading `input`, its stdout captured.
fn reading<'a>(stage: &Stage, input: Input<'a>) -> Result<Io<'a>, TxnError> {
    let io_err = stdio_err(&stage.name);
    let (stdin, feeder) = match input {
        Input::Null => (File::open("/dev/null").map_err(io_err)?.into(), None),
        Input::Output(Output::File { path, .. }) => {
            (File::open(path).map_err(io_err)?.into(), None)
        }
        Input::Output(Output::Memory(bytes)) => {
            let (r, w) = capture::pipe().map_err(io_err)?;
            (r, Some((w, bytes.as_slice())))
        }
    };
    Ok(Io {
        stdin,
        feeder,
        stdout: None,
    })
}

/// A stage's stdin (and the bytes a thread feeds into it, if it is a pipe from memory), and
/// where its stdout goes (`None`: captured).
pub(crate) struct Io<'a> {
    pub(crate) stdin: OwnedFd,
    pub(crate) feeder: Option<(OwnedFd, &'a [u8])>,
    pub(crate) stdout: Option<OwnedFd>,
}

/// Runs `stage` with the given stdio; stdout is captured unless `io.stdout` is given.
pub(crate) fn run_io(
    stage: &Stage,
    view: Option<&View<'_>>,
    io: Io<'_>,
    spill: &Path,
    memory_bound: usize,
) -> Result<Ran, TxnError> {
    let armed = arm(&[stage], view, &[], &[]);
    fire(stage, view, armed, io, spill, memory_bound, || {}).map(|(ran, _)| ran)
}

/// A sandbox started ahead for one stage, or for several that run one after another in it
/// on one view ([`lockbox_confine::Spawn::sequence`]), waiting at the gate of its next stage:
/// only the last steps of a sandbox start (mounting the view for the first stage, Landlock,
/// the exec) lie between a release and the command.
pub(crate) type Armed = Result<Gated, SetupError>;

/// The copy-on-write view of `stage` on `view`, with its write restriction.
fn overlay(stage: &Stage, view: &View<'_>) -> Overlay {
    Overlay {
        target: view.workdir.to_owned(),
        lowers: view.lowers.clone(),
        upper: Some(OverlayUpper {
            upper: view.upper.clone(),
            work: view.work.clone(),
            max_size: None,
        }),
        writable: stage
            .writable
            .as_ref()
            .map(|paths| paths.iter().map(|p| view.workdir.join(p)).collect()),
    }
}

/// Whether stages `a` and `b` can run one after the other in one sandbox, on one view: the
/// same policy but for the timeouts (which lockbox enforces from outside), one the kernel
/// lets share, and no `writable` scope (what a stage wrote outside it is checked in its
/// own layer).
pub(crate) fn can_share(a: &Stage, b: &Stage) -> bool {
    let setup = |s: &Stage| Policy {
        timeout: None,
        kill_grace: Duration::ZERO,
        ..s.policy.clone()
    };
    setup(a) == setup(b)
        && a.image_root == b.image_root
        && a.writable.is_none()
        && b.writable.is_none()
        && lockbox_confine::sequence_unsupported(&a.policy).is_none()
}

/// Starts the sandbox of `stages`, which run in it one after another on `view` (if any):
/// their policies must be equal (see [`can_share`]); the first one's is used, with
/// `extra_env` and `extra_reads` added.
pub(crate) fn arm(
    stages: &[&Stage],
    view: Option<&View<'_>>,
    extra_env: &[(String, String)],
    extra_reads: &[PathBuf],
) -> Armed {
    let Some(first) = stages.first() else {
        return Err(SetupError::Sequence {
            reason: "no stage given",
        });
    };
    let mut policy = first.policy.clone();
    policy.fs.read.extend(extra_reads.iter().cloned());
    for (k, v) in extra_env {
        policy.env.set.insert(k.clone(), v.clone());
    }
    policy.fs.overlays.extend(view.map(|v| overlay(first, v)));
    let commands: Vec<Vec<std::ffi::OsString>> = stages.iter().map(|s| s.argv.clone()).collect();
    tracing::debug!(stage = %first.name, stages = commands.len(), "arming a sandbox");
    let spawn = lockbox_confine::Spawn::sequence(&policy, &commands);
    match &first.image_root {
        Some(root) => spawn.image_root(root.clone()).gated(),
        None => spawn.gated(),
    }
}

/// Lets `armed` run `stage` with `io`'s stdin (and stdout, if given; captured otherwise),
/// calls `meanwhile` while the stage runs, waits for it (enforcing its timeout) and collects
/// its result. Also returns the sandbox, gated again, if a next stage is to run in it.
pub(crate) fn fire(
    stage: &Stage,
    view: Option<&View<'_>>,
    armed: Armed,
    io: Io<'_>,
    spill: &Path,
    memory_bound: usize,
    meanwhile: impl FnOnce(),
) -> Result<(Ran, Option<Gated>), TxnError> {
    let io_err = stdio_err(&stage.name);
    let Io {
        stdin,
        feeder,
        stdout: stdout_to,
    } = io;
    let (out_r, out_w) = match stdout_to {
        Some(fd) => (None, fd),
        None => {
            let (r, w) = capture::pipe().map_err(io_err)?;
            (Some(r), w)
        }
    };
    let (err_r, err_w) = capture::pipe().map_err(io_err)?;
    let stdio = Stdio {
        stdin: Some(stdin),
        stdout: Some(out_w),
        stderr: Some(err_w),
    };
    let started = Instant::now();
    let mut running = match armed.and_then(|g| g.release(stdio)) {
        Ok(r) => r,
        Err(e) => {
            let ran = Ran {
                result: setup_failed(stage, started, &e),
                stdout: Output::default(),
            };
            return Ok((ran, None));
        }
    };
    tracing::debug!(stage = %stage.name, "stage released");
    let deadline = stage.policy.timeout.map(|t| started + t);
    let (ran, next) = std::thread::scope(|scope| {
        let feeding = feeder.map(|(w, bytes)| scope.spawn(move || capture::feed(w, bytes)));
        let stdout = out_r.map(|r| scope.spawn(move || capture::capture(r, memory_bound, spill)));
        let stderr = scope.spawn(move || capture::tail(err_r));
        meanwhile();
        let waited = match running.wait(deadline, None) {
            Ok(Waited::Exited(o)) => Ok(o),
            Ok(Waited::Deadline | Waited::Extra) => {
                running.stop(stage.policy.kill_grace, StopReason::Timeout)
            }
            Err(e) => Err(e),
        };
        tracing::debug!(stage = %stage.name, "stage ended");
        let stdout = match stdout {
            Some(h) => join(h.join()).map_err(io_err)?,
            None => Output::default(),
        };
        let tail = join(stderr.join()).map_err(io_err)?;
        if let Some(f) = feeding {
            join(f.join()).map_err(io_err)?;
        }
        let outcome = match waited {
            Ok(o) => o,
            Err(e) => {
                let ran = Ran {
                    result: setup_failed(stage, started, &e),
                    stdout: Output::default(),
                };
                return Ok((ran, None));
            }
        };
        let signal = match outcome.status {
            Status::Signaled(s) => Some(s),
            _ => None,
        };
        let ran = Ran {
            result: StageResult {
                name: stage.name.clone(),
                exit_code: outcome.exit_code(),
                signal,
                timed_out: outcome.timed_out,
                duration: started.elapsed(),
                stderr_tail: String::from_utf8_lossy(&tail).into_owned(),
                stdout_len: stdout.len(),
                setup_error: None,
                attempts: 1,
                outside_writable: Vec::new(),
            },
            stdout,
        };
        Ok::<_, TxnError>((ran, running.next()))
    })?;
    let mut ran = ran;
    if let (Some(view), Some(writable), true) = (view, &stage.writable, ran.result.succeeded()) {
        ran.result.outside_writable = outside_writable(view, writable)?;
    }
    Ok((ran, next))
}

/// What the stage changed in its layer outside `writable` (see [`crate::scope`]).
fn outside_writable(view: &View<'_>, writable: &[PathBuf]) -> Result<Vec<PathBuf>, TxnError> {
    let relative: Vec<PathBuf> = writable
        .iter()
        .map(|w| w.strip_prefix(view.workdir).unwrap_or(w).to_owned())
        .collect();
    crate::scope::changes_outside(&view.upper, &view.lowers, &relative).map_err(|source| {
        TxnError::Store {
            path: view.upper.clone(),
            source,
        }
    })
}

/// What a stage run needs besides its layer.
pub(crate) struct Job<'a> {
    pub(crate) stage: &'a Stage,
    pub(crate) workdir: &'a Path,
    pub(crate) lowers: Vec<PathBuf>,
    pub(crate) input: Input<'a>,
    pub(crate) spill: PathBuf,
    pub(crate) memory_bound: usize,
    pub(crate) env: &'a [(String, String)],
    pub(crate) reads: &'a [PathBuf],
}

impl Job<'_> {
    /// Runs the job's stage in `armed` on `view` (see [`fire`]).
    fn fire(
        &self,
        view: &View<'_>,
        armed: Armed,
        io: Io<'_>,
        meanwhile: impl FnOnce(),
    ) -> Result<(Ran, Option<Gated>), TxnError> {
        fire(
            self.stage,
            Some(view),
            armed,
            io,
            &self.spill,
            self.memory_bound,
            meanwhile,
        )
    }

    /// The job's view on the layer (upper, work).
    pub(crate) fn view(&self, (upper, work): (PathBuf, PathBuf)) -> View<'_> {
        View {
            workdir: self.workdir,
            lowers: self.lowers.clone(),
            upper,
            work,
        }
    }
}

/// Runs `job` up to 1 + `retries` times until it succeeds, each attempt in a sandbox of
/// its own on a fresh layer made by `layer` (which discards the previous attempt's); the
/// first attempt uses `armed` (a sandbox armed on the layer `layer` made last) if given.
/// `meanwhile` is called once, while the first attempt runs. The work directory is
/// removed after each attempt. Returns the last run and its upper layer.
pub(crate) fn run_with_retries(
    job: &Job<'_>,
    layer: impl Fn() -> Result<(PathBuf, PathBuf), TxnError>,
    armed: Option<(Armed, (PathBuf, PathBuf))>,
    meanwhile: impl FnOnce(),
) -> Result<(Ran, PathBuf), TxnError> {
    let mut attempts = 0;
    let mut next = armed;
    let mut meanwhile = Some(meanwhile);
    loop {
        let (armed, view) = match next.take() {
            Some((armed, layer)) => (armed, job.view(layer)),
            None => {
                let view = job.view(layer()?);
                (arm(&[job.stage], Some(&view), job.env, job.reads), view)
            }
        };
        let io = reading(job.stage, job.input)?;
        let first = meanwhile.take();
        let (mut ran, _) = job.fire(&view, armed, io, || first.map_or((), |f| f()))?;
        crate::store::remove_tree(&view.work)?;
        attempts += 1;
        ran.result.attempts = attempts;
        if ran.result.succeeded() || attempts > job.stage.retries {
            return Ok((ran, view.upper));
        }
    }
}

/// Runs the job of each of `stages` in the sandbox `armed` (armed for exactly these stages,
/// on a view of `layer`), one after another, while the stage before it is done: the first
/// reads `input`, each next one the previous one's output. Stops after a stage that failed.
/// `meanwhile` is called once, while the first stage runs; `done` sees each stage's run.
/// Returns the last run.
pub(crate) fn run_in_one<'a>(
    jobs: &[Job<'a>],
    armed: Armed,
    layer: (PathBuf, PathBuf),
    meanwhile: impl FnOnce(),
    mut done: impl FnMut(&Ran),
) -> Result<Option<Ran>, TxnError> {
    let mut gated = Some(armed);
    let mut meanwhile = Some(meanwhile);
    let mut last: Option<Ran> = None;
    for job in jobs {
        let view = job.view(layer.clone());
        let io = match &last {
            Some(previous) => reading(job.stage, Input::Output(&previous.stdout))?,
            None => reading(job.stage, job.input)?,
        };
        // A sandbox that ended early (killed after its grace) cannot run the next stage.
        let armed = gated.take().unwrap_or_else(|| {
            Err(SetupError::Sequence {
                reason: "the sandbox ended with the previous stage",
            })
        });
        let first = meanwhile.take();
        let (ran, next) = job.fire(&view, armed, io, || first.map_or((), |f| f()))?;
        // The work directory (overlayfs's scratch) goes with the layers, after the stages.
        done(&ran);
        let failed = !ran.result.succeeded();
        last = Some(ran);
        if failed {
            break;
        }
        gated = next.map(Ok);
    }
    Ok(last)
}

/// The error of a failed stdio operation of the stage named `stage`.
pub(crate) fn stdio_err(stage: &str) -> impl Fn(std::io::Error) -> TxnError + Copy + '_ {
    move |source| TxnError::Stdio {
        stage: stage.to_owned(),
        source,
    }
}

fn join<T>(r: std::thread::Result<std::io::Result<T>>) -> std::io::Result<T> {
    r.unwrap_or_else(|_| Err(std::io::Error::other("capture thread panicked")))
}

fn setup_failed(stage: &Stage, started: Instant, e: &lockbox_confine::SetupError) -> StageResult {
    StageResult {
        name: stage.name.clone(),
        exit_code: 125,
        signal: None,
        timed_out: false,
        duration: started.elapsed(),
        stderr_tail: String::new(),
        stdout_len: 0,
        setup_error: Some(match e.hint() {
            Some(hint) => format!("{e} (hint: {hint})"),
            None => e.to_string(),
        }),
        attempts: 1,
        outside_writable: Vec::new(),
    }
}
