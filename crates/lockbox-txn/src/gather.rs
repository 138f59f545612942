//! [`Gather`]: named sources run in parallel, each on a snapshot of the pre-transaction
//! workdir with its own upper layer; their layers are merged under a [`ConflictPolicy`];
//! then an optional consumer runs on the merged view, reading each source's stdout from
//! `$LOCKBOX_INPUTS/<name>` (names, space-separated, in `$LOCKBOX_INPUT_NAMES`). The union
//! of the merged layers and the consumer's is committed as one unit, or nothing is.
//!
//! Conflicts: two sources changing the same path, unless both leave a directory there
//! (their contents merge); and a source removing a directory (deleting it, or replacing it
//! with a non-directory) while another changes something below it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use lockbox_cow::{Change, ChangeKind, ChangeSet, FileType};

use crate::options::{option_setters, TxnOptions};
use crate::outcome::{AbortReason, Marker, MergeConflict, TxnOutcome};
use crate::pipeline::{empty_outcome, finish_prepare, keep_stdout};
use crate::prepared::PreparedTxn;
use crate::record::TxnKind;
use crate::stage::{self, Input, Job, Ran, Stage};
use crate::store::TxnDir;
use crate::TxnError;

/// What to do when gather sources change the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConflictPolicy {
    /// Abort the transaction, listing the conflicts (exit code 3). The default.
    #[default]
    Fail,
    /// The earlier-declared source's version wins; later ones are discarded.
    FirstWriterWins,
    /// The later-declared source's version wins.
    LastWriterWins,
    /// The first source's version keeps the path; every other source's version is kept as
    /// `PATH.lockbox-<source>` (a deletion leaves nothing to keep).
    Markers,
}

/// A transactional gather over one workdir.
#[derive(Debug, Clone)]
pub struct Gather {
    options: TxnOptions,
    sources: Vec<Stage>,
    consumer: Option<Stage>,
    policy: ConflictPolicy,
}

impl Gather {
    /// An empty gather over `workdir`, keeping its records in `state_dir`.
    pub fn new(state_dir: &Path, workdir: &Path) -> Gather {
        Gather {
            options: TxnOptions::new(state_dir, workdir),
            sources: Vec::new(),
            consumer: None,
            policy: ConflictPolicy::default(),
        }
    }

    option_setters!(Gather);

    /// Adds a source named `name` (letters, digits, `-`, `_`, `.`; unique).
    pub fn source(mut self, name: &str, stage: Stage) -> Gather {
        self.sources.push(stage.named(name));
        self
    }

    /// Sets the consumer, which runs after the merge.
    pub fn consumer(mut self, stage: Stage) -> Gather {
        self.consumer = Some(stage);
        self
    }

    /// Sets the conflict policy (default [`ConflictPolicy::Fail`]).
    pub fn conflict_policy(mut self, policy: ConflictPolicy) -> Gather {
        self.policy = policy;
        self
    }

    /// Runs everything and keeps the layers (see [`crate::Pipeline::prepare`]).
    pub fn prepare(&self) -> Result<PreparedTxn, TxnError> {
        self.validate()?;
        self.options
            .prepare(TxnKind::Gather, |txn| self.run_all(txn))
    }

    fn validate(&self) -> Result<(), TxnError> {
        let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
        check_names(&names)
    }

    fn run_all(&self, txn: &mut TxnDir) -> Result<(TxnOutcome, bool), TxnError> {
        let mut outcome = empty_outcome(txn);
        let mut outputs = Vec::new();
        let mut uppers = Vec::new();
        for r in self.run_sources(txn) {
            let (r, upper) = r?;
            txn.record.stages.push(r.result.clone());
            outcome.stages.push(r.result);
            outputs.push(r.stdout);
            uppers.push(upper);
        }
        txn.save_lazily()?;
        if let Some(reason) = outcome
            .stages
            .iter()
            .enumerate()
            .find_map(|(i, r)| AbortReason::of_stage(i, r))
        {
            outcome.abort_reason = Some(reason);
            return Ok((outcome, false));
        }
        if !merge(txn, &self.sources, &uppers, self.policy, &mut outcome)? {
            return Ok((outcome, false));
        }
        let inputs = txn.dir.join("inputs");
        std::fs::create_dir_all(&inputs).map_err(|source| TxnError::Store {
            path: inputs.clone(),
            source,
        })?;
        for (source, out) in self.sources.iter().zip(outputs) {
            let to = inputs.join(&source.name);
            out.persist(&to).map_err(|e| TxnError::Store {
                path: to,
                source: e,
            })?;
        }
        let mut layers = Vec::new();
        if let Some(consumer) = &self.consumer {
            let i = self.sources.len();
            let (ran, upper) = self.run_consumer(txn, consumer, &inputs)?;
            txn.record.stages.push(ran.result.clone());
            txn.save_lazily()?;
            outcome.stages.push(ran.result.clone());
            outcome.stdout = keep_stdout(txn, ran.stdout)?;
            if let Some(reason) = AbortReason::of_stage(i, &ran.result) {
                outcome.abort_reason = Some(reason);
                return Ok((outcome, false));
            }
            layers.push(upper);
        }
        finish_prepare(txn, &layers, &mut outcome)?;
        Ok((outcome, true))
    }

    /// Runs every source at once, each on a snapshot of the workdir; results in
    /// declaration order.
    fn run_sources(&self, txn: &TxnDir) -> Vec<Result<(Ran, PathBuf), TxnError>> {
        let workdir = txn.workdir();
        let out_dir = txn.out_dir();
        let bound = self.options.memory_bound;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .sources
                .iter()
                .enumerate()
                .map(|(i, source)| {
                    let job = Job {
                        stage: source,
                        workdir,
                        lowers: vec![workdir.to_owned()],
                        input: Input::Null,
                        spill: out_dir.join(i.to_string()),
                        memory_bound: bound,
                        env: &[],
                        reads: &[],
                    };
                    scope.spawn(move || {
                        stage::run_with_retries(&job, || txn.new_layer(i), None, || {})
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(TxnError::Usage {
                            reason: "a source thread panicked".into(),
                        })
                    })
                })
                .collect()
        })
    }

    /// Runs the consumer on the merged view with the sources' outputs in `inputs`.
    fn run_consumer(
        &self,
        txn: &TxnDir,
        consumer: &Stage,
        inputs: &Path,
    ) -> Result<(Ran, PathBuf), TxnError> {
        let i = self.sources.len();
        let mut consumer = consumer.clone();
        if consumer.name.is_empty() {
            consumer.name = "consumer".into();
        }
        let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
        let env = [
            ("LOCKBOX_INPUTS".to_owned(), inputs.display().to_string()),
            ("LOCKBOX_INPUT_NAMES".to_owned(), names.join(" ")),
        ];
        let reads = [inputs.to_owned()];
        let job = Job {
            stage: &consumer,
            workdir: txn.workdir(),
            lowers: vec![txn.merged_dir(), txn.workdir().to_owned()],
            input: Input::Null,
            spill: txn.out_dir().join(i.to_string()),
            memory_bound: self.options.memory_bound,
            env: &env,
            reads: &reads,
        };
        stage::run_with_retries(&job, || txn.new_layer(i), None, || {})
    }
}

/// Checks the names of a gather's sources: at least one; letters, digits, `-`, `_`, `.`;
/// unique.
pub(crate) fn check_names(names: &[&str]) -> Result<(), TxnError> {
    let usage = |reason: String| Err(TxnError::Usage { reason });
    if names.is_empty() {
        return usage("a gather needs at least one source".into());
    }
    for (i, n) in names.iter().enumerate() {
        let ok = !n.is_empty()
            && *n != "."
            && *n != ".."
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !ok {
            return usage(format!(
                "bad source name {n:?}: use letters, digits, '-', '_', '.'"
            ));
        }
        if names[..i].contains(n) {
            return usage(format!("duplicate source name {n:?}"));
        }
    }
    Ok(())
}

/// Merges sibling layers (each over the workdir) into `merged/` under `policy`, recording
/// conflicts and markers in `outcome`. `Ok(false)`: unresolved conflicts (policy `Fail`),
/// `abort_reason` set, nothing merged.
pub(crate) fn merge(
    txn: &TxnDir,
    sources: &[Stage],
    uppers: &[PathBuf],
    policy: ConflictPolicy,
    outcome: &mut TxnOutcome,
) -> Result<bool, TxnError> {
    let mut sets = Vec::new();
    for upper in uppers {
        sets.push(ChangeSet::compute(upper, txn.workdir())?);
    }
    let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
    let sets: Vec<&[Change]> = sets.iter().map(ChangeSet::changes).collect();
    outcome.conflicts = conflicts(&names, &sets);
    if policy == ConflictPolicy::Fail && !outcome.conflicts.is_empty() {
        outcome.abort_reason = Some(AbortReason::Conflicts {
            count: outcome.conflicts.len(),
        });
        return Ok(false);
    }
    let merged = txn.merged_dir();
    std::fs::create_dir(&merged).map_err(|source| TxnError::Store {
        path: merged.clone(),
        source,
    })?;
    // `flatten` takes the top first: the winner of every conflict goes on top (the first
    // source, except under last-writer-wins).
    let mut top_first = uppers.to_vec();
    if policy == ConflictPolicy::LastWriterWins {
        top_first.reverse();
    }
    lockbox_cow::flatten(&top_first, &merged)?;
    if policy == ConflictPolicy::Markers {
        outcome.markers = keep_markers(
            &names,
            &outcome.conflicts,
            uppers,
            &sets,
            txn.workdir(),
            &merged,
        )?;
    }
    Ok(true)
}

/// Copies every losing, non-deleting version of a conflicting path into the merged
/// layer as `PATH.lockbox-<source>`: what that source saw there (for a directory, the
/// workdir's with the source's changes), as plain files.
pub(crate) fn keep_markers(
    sources: &[&str],
    conflicts: &[MergeConflict],
    uppers: &[PathBuf],
    sets: &[&[Change]],
    workdir: &Path,
    merged: &Path,
) -> Result<Vec<Marker>, TxnError> {
    let mut markers = Vec::new();
    for c in conflicts {
        for name in c.stages.iter().skip(1) {
            let Some(i) = sources.iter().position(|s| *s == name.as_str()) else {
                continue;
            };
            let deleted = sets[i]
                .iter()
                .any(|ch| ch.path == c.path && ch.kind == ChangeKind::Deleted);
            let upper_entry = uppers[i].join(&c.path);
            if deleted || upper_entry.symlink_metadata().is_err() {
                continue;
            }
            let parent = c.path.parent().unwrap_or(Path::new(""));
            let Some(file) = c.path.file_name() else {
                continue;
            };
            let mut kept: OsString = file.to_owned();
            kept.push(format!(".lockbox-{name}"));
            let dst_dir = merged.join(parent);
            std::fs::create_dir_all(&dst_dir).map_err(|source| TxnError::Store {
                path: dst_dir.clone(),
                source,
            })?;
            lockbox_cow::copy_view(&uppers[i], workdir, &c.path, &dst_dir, &kept)?;
            markers.push(Marker {
                path: c.path.clone(),
                kept_as: parent.join(&kept),
                source: name.clone(),
            });
        }
    }
    Ok(markers)
}

/// True if the change removes a directory that was there (so nothing below it survives).
fn removes_dir(c: &Change) -> bool {
    match c.kind {
        ChangeKind::Deleted => c.file_type == FileType::Dir,
        ChangeKind::TypeChanged => c.file_type != FileType::Dir,
        ChangeKind::Added | ChangeKind::Modified => false,
    }
}

/// The conflicts between sources' change sets, sorted by path; each lists its sources in
/// declaration order.
pub(crate) fn conflicts(sources: &[&str], sets: &[&[Change]]) -> Vec<MergeConflict> {
    let mut by_path: BTreeMap<&Path, Vec<(usize, &Change)>> = BTreeMap::new();
    for (i, set) in sets.iter().enumerate() {
        for c in set.iter() {
            by_path.entry(&c.path).or_default().push((i, c));
        }
    }
    let mut found: BTreeMap<PathBuf, Vec<usize>> = BTreeMap::new();
    for (path, writers) in &by_path {
        let all_dirs = writers
            .iter()
            .all(|(_, c)| c.kind != ChangeKind::Deleted && c.file_type == FileType::Dir);
        if writers.len() > 1 && !all_dirs {
            found
                .entry(path.to_path_buf())
                .or_default()
                .extend(writers.iter().map(|(i, _)| *i));
        }
        for (remover, c) in writers.iter().filter(|(_, c)| removes_dir(c)) {
            let below = by_path
                .range::<Path, _>((std::ops::Bound::Excluded(*path), std::ops::Bound::Unbounded))
                .take_while(|(p, _)| p.starts_with(path));
            for (_, others) in below {
                for (other, _) in others.iter().filter(|(o, _)| o != remover) {
                    let e = found.entry(c.path.clone()).or_default();
                    e.push(*remover);
                    e.push(*other);
                }
            }
        }
    }
    found
        .into_iter()
        .map(|(path, mut idx)| {
            idx.sort_unstable();
            idx.dedup();
            MergeConflict {
                path,
                stages: idx.into_iter().map(|i| sources[i].to_owned()).collect(),
            }
        })
        .collect()
}
