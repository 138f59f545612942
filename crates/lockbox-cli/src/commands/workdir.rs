//! The copy-on-write branch around `lockbox run --workdir`: created before the sandbox,
//! committed, aborted or kept after it.

use crate::cli::{BranchAction, WorkspaceArgs};
use crate::output::{eoutln, out};
use lockbox_cow::{
    import_upper, Branch, ChangeSet, CommitOptions, CommitReport, CowError, Skipped,
};
use lockbox_policy::name::quoted;
use lockbox_policy::{plural, Policy};
use serde_json::{json, Value};
use std::ffi::OsString;

/// A branch whose sandbox is running.
pub struct Workspace {
    branch: Branch,
}

/// What happened to the branch.
pub struct Finished {
    /// Overrides the command's exit code (4 commit failed, 5 stale base).
    pub exit_code: Option<i32>,
    /// `branch` and `changes` for the JSON report.
    pub report: Value,
}

/// Creates the branch and mounts it over the workdir in `policy`. The branch's creation time
/// is the stale-base reference, so this runs right before the sandbox starts.
pub fn begin(
    args: &WorkspaceArgs,
    policy: &mut Policy,
    argv: &[OsString],
) -> anyhow::Result<Option<Workspace>> {
    let Some(workdir) = &args.workdir else {
        return Ok(None);
    };
    let state_dir = args.state.resolve()?;
    std::fs::create_dir_all(&state_dir)
        .map_err(|e| anyhow::anyhow!("creating state directory {}: {e}", quoted(&state_dir)))?;
    super::txn::recover_sweep(&state_dir, workdir);
    // Arguments are bytes like names: the same lossless JSON form.
    let command: Vec<_> = argv
        .iter()
        .map(|a| lockbox_policy::name::Encoded(std::path::Path::new(a)))
        .collect();
    let context = json!({ "command": command, "policy": policy });
    let branch = Branch::create(&state_dir, workdir, context)?;
    // The view is mounted at the canonical path; the command starts at the path it was
    // given, which leads there inside too (its symlinks are recreated), and `$PWD` says so,
    // as a shell that did `cd` there would (for `pwd` and for tools that report paths).
    if policy.cwd.is_none() {
        if let Some(given) = as_given(workdir) {
            if given != branch.workdir() {
                if let Some(text) = given.to_str() {
                    policy
                        .env
                        .set
                        .entry("PWD".to_owned())
                        .or_insert_with(|| text.to_owned());
                }
            }
            policy.cwd = Some(given);
        }
    }
    policy.mount_copy_on_write(
        branch.workdir(),
        branch.layers(),
        branch.upper_dir(),
        branch.work_dir(),
        args.max_disk,
    );
    Ok(Some(Workspace { branch }))
}

/// `workdir` made absolute the way the caller's shell sees it: a relative path is taken
/// from `$PWD` when that names the current directory (the shell's `cd` through a symlink
/// keeps the link there, `pwd -L`), else from the real current directory.
fn as_given(workdir: &std::path::Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    if workdir.is_absolute() {
        return Some(workdir.to_owned());
    }
    let logical = std::env::var_os("PWD")
        .map(std::path::PathBuf::from)
        .filter(|pwd| pwd.is_absolute())
        .filter(
            |pwd| match (std::fs::metadata(pwd), std::fs::metadata(".")) {
                (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            },
        );
    match logical {
        // `components` drops the `.` of `--workdir .`.
        Some(pwd) => Some(pwd.join(workdir).components().collect()),
        None => std::path::absolute(workdir).ok(),
    }
}

impl Workspace {
    /// Records the init of the sandbox started on the branch (`pid`, the caller's child not
    /// yet waited for), before that sandbox can write into the branch.
    pub fn record_sandbox(&mut self, pid: libc::pid_t) -> anyhow::Result<()> {
        let id = self.branch.id().as_str().to_owned();
        let init = u32::try_from(pid)
            .map_err(std::io::Error::other)
            .and_then(lockbox_cow::SandboxInit::of)
            .map_err(|e| anyhow::anyhow!("identifying the sandbox of branch {id}: {e}"))?;
        self.branch.record_sandbox(init)?;
        Ok(())
    }

    /// Applies `--on-exit`/`--on-error`/`--dry-run` once the sandbox has ended (`failed`:
    /// non-zero exit, signal or timeout). Messages go to stderr.
    pub fn finish(
        self,
        args: &WorkspaceArgs,
        outcome: &lockbox_confine::Outcome,
        to_report: bool,
    ) -> Finished {
        let id = self.branch.id().as_str().to_owned();
        let failed = outcome.exit_code() != 0;
        // With --max-disk the changes are in a tmpfs the sandbox left us: store them.
        let imported = outcome
            .upper_mounts
            .iter()
            .try_for_each(|m| import_upper(&m.upper(), &self.branch.upper_dir()).map(drop));
        if let Err(e) = imported {
            // Nothing of the sandbox's changes is left to keep: the import empties the upper
            // again when it fails, and the tmpfs goes with the sandbox.
            let _ = self.branch.abort();
            eoutln!(
                "lockbox: storing the changes of branch {id}: {e}; they are lost and the branch is removed"
            );
            return Finished {
                exit_code: Some(4),
                report: json!({ "branch": { "id": id, "action": "aborted" } }),
            };
        }
        let changes = match self.branch.change_set() {
            Ok(set) => set,
            Err(e) => {
                let mut branch = self.branch;
                // Best effort: listed as an orphan otherwise.
                let _ = branch.record_failure(&e);
                eoutln!("lockbox: reading the changes of branch {id}: {e}; the branch is kept");
                return Finished {
                    exit_code: Some(4),
                    report: json!({ "branch": { "id": id, "action": "kept" } }),
                };
            }
        };
        let action = if args.dry_run {
            if !to_report {
                out!("{}", changes.to_lines());
            }
            BranchAction::Abort
        } else if failed {
            args.on_error
        } else {
            args.on_exit
        };
        let why = if args.dry_run {
            None
        } else if failed {
            Some((ended(outcome), "--on-error keep"))
        } else {
            Some(("--on-exit abort".to_owned(), "--on-exit keep"))
        };
        let (done, exit_code, skipped) = self.apply(action, args.force, &changes, why);
        let done = if args.dry_run { "dry-run" } else { done };
        let mut report = json!({
            "branch": { "id": id, "action": done },
            "changes": changes.changes(),
        });
        if !skipped.is_empty() {
            report["skipped"] = json!(skipped);
        }
        Finished { exit_code, report }
    }

    /// `why` is why an abort discards the changes, and the flag that would have kept them
    /// (none for a dry run, which says nothing).
    fn apply(
        mut self,
        action: BranchAction,
        force: bool,
        changes: &ChangeSet,
        why: Option<(String, &str)>,
    ) -> (&'static str, Option<i32>, Vec<Skipped>) {
        let id = self.branch.id().as_str().to_owned();
        let result = match action {
            BranchAction::Commit => {
                // `lockbox run` exits next: a small branch's removal can wait.
                let opts = CommitOptions {
                    force,
                    dry_run: false,
                    defer_removal: true,
                };
                return match self.branch.commit(&opts) {
                    Ok(report) => {
                        warn_skipped(&report);
                        ("committed", None, report.skipped.into_vec())
                    }
                    Err(e) => {
                        explain_commit_error(&e, &id);
                        ("kept", Some(i32::from(e.exit_code())), Vec::new())
                    }
                };
            }
            BranchAction::Abort => self.branch.abort_before_exit().map(|()| {
                if let (Some((why, keep)), false) = (why, changes.is_empty()) {
                    let them = if changes.len() == 1 { "it" } else { "them" };
                    eoutln!(
                        "lockbox: discarded {}: {why}; keep {them} with {keep}",
                        plural(changes.len(), "change")
                    );
                }
                "aborted"
            }),
            BranchAction::Keep => self.branch.keep().map(|()| {
                eoutln!(
                    "lockbox: kept branch {id} ({}); see `lockbox branch diff {id}`",
                    plural(changes.len(), "change")
                );
                "kept"
            }),
        };
        match result {
            Ok(done) => (done, None, Vec::new()),
            Err(e) => {
                eoutln!("lockbox: branch {id}: {e}");
                ("kept", Some(4), Vec::new())
            }
        }
    }

    /// Discards the branch after a sandbox that never ran.
    pub fn discard(self) {
        let id = self.branch.id().as_str().to_owned();
        if let Err(e) = self.branch.abort() {
            eoutln!("lockbox: removing branch {id}: {e}");
        }
    }
}

/// How the sandbox ended, for "discarded 3 changes: the command exited 3".
fn ended(outcome: &lockbox_confine::Outcome) -> String {
    use lockbox_confine::Status;
    if outcome.timed_out {
        return "the command timed out".into();
    }
    match outcome.status {
        Status::Exited(code) => format!("the command exited {code}"),
        Status::Signaled(sig) => format!("the command was killed by signal {sig}"),
        Status::ExecFailed(_) => "the command could not be started".into(),
    }
}

/// One warning line for each entry a commit left out (FIFOs, sockets).
pub fn warn_skipped(report: &CommitReport) {
    for skipped in &report.skipped {
        eoutln!(
            "lockbox: warning: {} was not committed: {}",
            quoted(&skipped.path),
            skipped.reason
        );
    }
}

/// Prints why a commit failed and what to do; the branch stays for review.
pub fn explain_commit_error(e: &CowError, id: &str) {
    eoutln!("lockbox: committing branch {id}: {e}");
    if let CowError::StaleBase { .. } = e {
        eoutln!(
            "hint: the branch is kept (state `stale`): review with `lockbox branch diff {id}`, \
             then `lockbox branch commit --force {id}` overwrites them or `lockbox branch abort {id}` drops it"
        );
    } else if let CowError::StaleReview { .. } = e {
        eoutln!(
            "hint: something wrote to the branch after the review: look again with `lockbox branch show {id}` \
             (a new review token) and `lockbox branch hunks {id} PATH`"
        );
    } else {
        eoutln!("hint: the branch is kept; retry with `lockbox branch commit {id}`");
    }
}
