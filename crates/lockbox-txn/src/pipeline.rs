//! [`Pipeline`]: sequential stages, read-committed. Consecutive stages that can share a
//! sandbox form a unit, which runs on an overlay of the workdir with lowers `[upper of the
//! unit before, ..., upper of the first unit, workdir]` (finished layers only, so overlayfs
//! never sees a lower layer change) and one upper of its own, written by its stages in turn.
//! Stage N's stdout is captured and becomes stage N+1's stdin. If every stage succeeds, the
//! layers are flattened into one and committed as one unit; otherwise nothing is.

use std::collections::VecDeque;
use std::ops::Range;
use std::path::{Path, PathBuf};

use lockbox_cow::ChangeSet;

use crate::capture::{pipe, Output};
use crate::gather::{merge, ConflictPolicy};
use crate::options::{option_setters, TxnOptions};
use crate::outcome::{AbortReason, TxnOutcome};
use crate::prepared::PreparedTxn;
use crate::record::{TxnKind, TxnState};
use crate::stage::{self, Input, Io, Job, Ran, Stage, View};
use crate::store::{remove_tree, TxnDir};
use crate::TxnError;

/// A transactional pipeline over one workdir.
#[derive(Debug, Clone)]
pub struct Pipeline {
    options: TxnOptions,
    pub(crate) stages: Vec<Stage>,
    stdin: Vec<u8>,
    stream: Option<ConflictPolicy>,
}

impl Pipeline {
    /// An empty pipeline over `workdir`, keeping its records in `state_dir`.
    pub fn new(state_dir: &Path, workdir: &Path) -> Pipeline {
        Pipeline {
            options: TxnOptions::new(state_dir, workdir),
            stages: Vec::new(),
            stdin: Vec::new(),
            stream: None,
        }
    }

    option_setters!(Pipeline);

    /// Appends a stage.
    pub fn stage(mut self, stage: Stage) -> Pipeline {
        self.stages.push(stage);
        self
    }

    /// The first stage's stdin (default: empty).
    pub fn stdin(mut self, bytes: Vec<u8>) -> Pipeline {
        self.stdin = bytes;
        self
    }

    /// Runs the stages concurrently with live pipes between them instead of one after
    /// another. Every stage then sees the pre-transaction workdir (snapshot), and their
    /// layers are merged like gather siblings under `conflicts`. Retries do not apply (a
    /// live pipe cannot be replayed).
    pub fn stream(mut self, conflicts: ConflictPolicy) -> Pipeline {
        self.stream = Some(conflicts);
        self
    }

    /// Runs every stage and keeps the layers: the returned [`PreparedTxn`] commits or aborts
    /// (and aborts when dropped). If a stage fails the transaction is aborted at once and
    /// the prepared value only carries the outcome.
    pub fn prepare(&self) -> Result<PreparedTxn, TxnError> {
        if self.stages.is_empty() {
            return Err(TxnError::Usage {
                reason: "a pipeline needs at least one stage".into(),
            });
        }
        self.options
            .prepare(TxnKind::Pipeline, |txn| match self.stream {
                Some(policy) => self.run_streamed(txn, policy),
                None => self.run_stages(txn),
            })
    }

    /// Runs the stages; `Ok((outcome, prepared))`. Consecutive stages that can share a
    /// sandbox ([`stage::can_share`], no retries) run in one, one after another
    /// ([`lockbox_confine::Spawn::sequence`]), on one view and layer: a unit, whose layer is
    /// numbered after its first stage. The view is mounted when the unit's first stage is
    /// released, once the units before it are done. While the first stage of a unit runs,
    /// the sandboxes of the next [`ARM_AHEAD`] units are armed on their layers (whose lowers
    /// exist by then, though still being written). Never past a stage that may be retried:
    /// a retry replaces the layer the armed sandboxes captured.
    fn run_stages(&self, txn: &mut TxnDir) -> Result<(TxnOutcome, bool), TxnError> {
        let workdir = txn.workdir().to_owned();
        let mut outcome = empty_outcome(txn);
        let stages = self.named_stages();
        let units = units(&stages);
        let mut previous = Output::Memory(self.stdin.clone());
        // The armed sandboxes of the units after the current one, in order, with their
        // layers.
        let mut armed: VecDeque<Result<ArmedUnit, TxnError>> = VecDeque::new();
        for (u, unit) in units.iter().enumerate() {
            let layers: &TxnDir = txn;
            // The stages of unit `v` read the layers of units v-1, ..., 1 (top first), then
            // the workdir.
            let unit_of = |j: usize| units.iter().position(|u| u.contains(&j)).unwrap_or(0);
            let job = |j: usize, input| Job {
                stage: &stages[j],
                workdir: &workdir,
                lowers: units[..unit_of(j)]
                    .iter()
                    .rev()
                    .map(|v| layers.layer_upper(v.start))
                    .chain([workdir.clone()])
                    .collect(),
                input,
                spill: layers.out_dir().join(j.to_string()),
                memory_bound: self.options.memory_bound,
                env: &[],
                reads: &[],
            };
            let arm_unit = |unit: &Range<usize>| -> Result<ArmedUnit, TxnError> {
                let layer = layers.new_layer(unit.start)?;
                let first = job(unit.start, Input::Null);
                let view = first.view(layer.clone());
                let stages: Vec<&Stage> = stages[unit.clone()].iter().collect();
                Ok(ArmedUnit {
                    armed: stage::arm(&stages, Some(&view), &[], &[]),
                    layer,
                })
            };
            let current = match armed.pop_front() {
                Some(a) => Some(a?),
                None => None,
            };
            let arm_ahead = || {
                let ahead = units.iter().take(u + 1 + ARM_AHEAD);
                for next in ahead.skip(u + 1 + armed.len()) {
                    if stages[unit.start..next.start].iter().any(|s| s.retries > 0) {
                        break;
                    }
                    let next = arm_unit(next);
                    let failed = next.is_err();
                    armed.push_back(next);
                    if failed {
                        break;
                    }
                }
            };
            let mut results = Vec::new();
            let last = if stages[unit.start].retries > 0 {
                // A retried stage's unit is that stage alone: one layer.
                let first = current.map(|ArmedUnit { armed, layer }| (armed, layer));
                let (ran, _) = stage::run_with_retries(
                    &job(unit.start, Input::Output(&previous)),
                    || layers.new_layer(unit.start),
                    first,
                    arm_ahead,
                )?;
                results.push(ran.result.clone());
                ran
            } else {
                let ArmedUnit {
                    armed: sandbox,
                    layer,
                } = match current {
                    Some(a) => a,
                    None => arm_unit(unit)?,
                };
                let mut jobs: Vec<Job<'_>> = unit.clone().map(|j| job(j, Input::Null)).collect();
                jobs[0].input = Input::Output(&previous);
                let last = stage::run_in_one(&jobs, sandbox, layer, arm_ahead, |ran| {
                    results.push(ran.result.clone())
                })?;
                last.ok_or_else(|| TxnError::Usage {
                    reason: "a pipeline unit without stages".into(),
                })?
            };
            for (k, result) in results.into_iter().enumerate() {
                // Saved with the next state change (prepared or aborted): a durable write
                // per stage would cost two fsyncs each and recovery does not read stage
                // results.
                txn.record.stages.push(result.clone());
                outcome.stages.push(result.clone());
                if let Some(reason) = AbortReason::of_stage(unit.start + k, &result) {
                    outcome.abort_reason = Some(reason);
                    outcome.stdout = keep_stdout(txn, last.stdout)?;
                    return Ok((outcome, false));
                }
            }
            previous = last.stdout;
        }
        outcome.stdout = keep_stdout(txn, previous)?;
        let top_first: Vec<PathBuf> = units
            .iter()
            .rev()
            .map(|unit| txn.layer_upper(unit.start))
            .collect();
        finish_prepare(txn, &top_first, &mut outcome)?;
        Ok((outcome, true))
    }
}

/// A unit's sandbox armed ahead, with the layer (upper, work) its stages share.
struct ArmedUnit {
    armed: stage::Armed,
    layer: (PathBuf, PathBuf),
}

/// The stages, in runs that share a sandbox: consecutive stages that can
/// ([`stage::can_share`]) and have no retries (a retried stage runs alone, each attempt in
/// a fresh sandbox).
fn units(stages: &[Stage]) -> Vec<Range<usize>> {
    let mut units: Vec<Range<usize>> = Vec::new();
    for (i, s) in stages.iter().enumerate() {
        match units.last_mut() {
            Some(u)
                if s.retries == 0
                    && stages[u.start].retries == 0
                    && stage::can_share(&stages[u.start], s) =>
            {
                u.end = i + 1
            }
            _ => units.push(i..i + 1),
        }
    }
    units
}

/// How many units of a pipeline are armed ahead of the one running (see
/// [`Pipeline::run_stages`]): enough that a short stage does not wait for the next
/// sandbox's set-up, few enough that a pipeline does not hold many idle sandboxes.
const ARM_AHEAD: usize = 2;

impl Pipeline {
    fn named_stages(&self) -> Vec<Stage> {
        let mut stages = self.stages.clone();
        for (i, s) in stages.iter_mut().enumerate() {
            if s.name.is_empty() {
                s.name = format!("stage-{}", i + 1);
            }
        }
        stages
    }

    /// `--stream`: all stages at once, stdout of each piped live into the next.
    fn run_streamed(
        &self,
        txn: &mut TxnDir,
        policy: ConflictPolicy,
    ) -> Result<(TxnOutcome, bool), TxnError> {
        let workdir = txn.workdir().to_owned();
        let mut outcome = empty_outcome(txn);
        let stages = self.named_stages();
        let mut views = Vec::new();
        for i in 0..stages.len() {
            let (upper, work) = txn.new_layer(i)?;
            views.push(View {
                workdir: &workdir,
                lowers: vec![workdir.clone()],
                upper,
                work,
            });
        }
        let spill = txn.out_dir().join((stages.len() - 1).to_string());
        let ran = self.spawn_streamed(&stages, &views, &spill)?;
        let mut last = Output::default();
        for r in ran {
            let r = r?;
            txn.record.stages.push(r.result.clone());
            outcome.stages.push(r.result);
            last = r.stdout;
        }
        txn.save_lazily()?;
        for view in &views {
            remove_tree(&view.work)?;
        }
        outcome.stdout = keep_stdout(txn, last)?;
        if let Some(reason) = outcome
            .stages
            .iter()
            .enumerate()
            .find_map(|(i, r)| AbortReason::of_stage(i, r))
        {
            outcome.abort_reason = Some(reason);
            return Ok((outcome, false));
        }
        let uppers: Vec<PathBuf> = views.iter().map(|v| v.upper.clone()).collect();
        if !merge(txn, &stages, &uppers, policy, &mut outcome)? {
            return Ok((outcome, false));
        }
        finish_prepare(txn, &[], &mut outcome)?;
        Ok((outcome, true))
    }

    /// Runs all `stages` at once on their `views`: stage i reads the pipe stage i-1 writes
    /// (the first reads the pipeline's stdin, fed by a thread); the last stdout is captured.
    fn spawn_streamed(
        &self,
        stages: &[Stage],
        views: &[View<'_>],
        spill: &Path,
    ) -> Result<Vec<Result<Ran, TxnError>>, TxnError> {
        let io_err = stage::stdio_err("pipeline");
        let (first_r, first_w) = pipe().map_err(io_err)?;
        let mut feeder = Some((first_w, self.stdin.as_slice()));
        let mut stdins = vec![first_r];
        let mut stdouts = Vec::new();
        for _ in 1..stages.len() {
            let (r, w) = pipe().map_err(io_err)?;
            stdins.push(r);
            stdouts.push(Some(w));
        }
        stdouts.push(None);
        let bound = self.options.memory_bound;
        Ok(std::thread::scope(|scope| {
            let handles: Vec<_> = stdins
                .into_iter()
                .zip(stdouts)
                .enumerate()
                .map(|(i, (stdin, stdout))| {
                    let io = Io {
                        stdin,
                        feeder: if i == 0 { feeder.take() } else { None },
                        stdout,
                    };
                    let (stage, view) = (&stages[i], &views[i]);
                    scope.spawn(move || stage::run_io(stage, Some(view), io, spill, bound))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(TxnError::Usage {
                            reason: "a stage thread panicked".into(),
                        })
                    })
                })
                .collect()
        }))
    }
}

pub(crate) fn empty_outcome(txn: &TxnDir) -> TxnOutcome {
    TxnOutcome {
        id: txn.id().clone(),
        committed: false,
        stages: Vec::new(),
        changes: ChangeSet::default(),
        conflicts: Vec::new(),
        markers: Vec::new(),
        abort_reason: None,
        report: None,
        stdout: Output::default(),
    }
}

/// Flattens `layers` (top first) into `merged/`, computes the change set, records
/// `prepared`.
pub(crate) fn finish_prepare(
    txn: &mut TxnDir,
    layers: &[PathBuf],
    outcome: &mut TxnOutcome,
) -> Result<(), TxnError> {
    let merged = txn.merged_dir();
    if !merged.exists() {
        std::fs::create_dir(&merged).map_err(|source| TxnError::Store {
            path: merged.clone(),
            source,
        })?;
    }
    lockbox_cow::flatten(layers, &merged)?;
    outcome.changes = ChangeSet::compute(&merged, txn.workdir())?;
    tracing::debug!(changes = outcome.changes.len(), "layers flattened");
    // `merged/` holds everything now: the layers go while the commit waits for the disk
    // (and a kept prepared transaction takes half the inodes).
    txn.remove_meanwhile(txn.dir.join("layers"));
    // Durable only once kept ([`PreparedTxn::keep`]) or committing.
    txn.record.state = TxnState::Prepared;
    txn.record.held = true;
    txn.save_lazily()
}

/// A spilled final stdout is moved next to the record, so it outlives the layers.
pub(crate) fn keep_stdout(txn: &TxnDir, out: Output) -> Result<Output, TxnError> {
    match out {
        Output::Memory(_) => Ok(out),
        Output::File { .. } => {
            let to = txn.dir.join("stdout");
            out.persist(&to)
                .map_err(|source| TxnError::Store { path: to, source })
        }
    }
}
