//! `lockbox branch`: kept copy-on-write branches, reviewed, committed or aborted.

use super::workdir::explain_commit_error;
use crate::cli::{BranchArgs, BranchCommand};
use crate::error::CliError;
use crate::error::ExitCode;
use crate::output::json;
use crate::output::{out, outln};
use lockbox_cow::{abort_id, list, Branch, BranchId, CommitOptions, CowError, FileDiff};
use lockbox_policy::name::{quoted, Encoded};
use serde_json::json;
use std::path::Path;

pub fn run(args: &BranchArgs) -> Result<ExitCode, CliError> {
    let state_dir = args
        .state
        .resolve()
        .map_err(|e| CliError::usage(super::chain(&e)))?;
    match &args.command {
        BranchCommand::List => list_branches(&state_dir, args.json),
        BranchCommand::Show { id } => show(&state_dir, id, args.json),
        BranchCommand::Diff { id, path } => diff(&state_dir, id, path.as_deref(), args.json),
        BranchCommand::Hunks { id, path } => {
            super::branch_part::show_hunks(&state_dir, id, path, args.json)
        }
        BranchCommand::Commit {
            id,
            force,
            only,
            exclude,
            hunks,
            drop_rest,
            interactive,
            review,
        } => {
            let review = review
                .as_deref()
                .map(|t| {
                    t.parse()
                        .map_err(|e| CliError::usage(format!("--review: {e}")))
                })
                .transpose()?;
            let mut part = super::branch_part::Part {
                only,
                exclude,
                hunks,
                drop_rest: *drop_rest,
                interactive: *interactive,
                force: *force,
                review,
            };
            if part.review.is_some() && !part.is_partial() {
                // The whole branch, bound to its review: committed from the snapshot the
                // review is checked against, then removed.
                part.drop_rest = true;
                super::branch_part::commit(&state_dir, id, &part, args.json)
            } else if part.is_partial() {
                super::branch_part::commit(&state_dir, id, &part, args.json)
            } else {
                commit(&state_dir, id, *force, args.json)
            }
        }
        BranchCommand::Abort { id } => {
            let id = BranchId::parse(id)?;
            abort_id(&state_dir, &id)?;
            if args.json {
                outln!("{}", json(&json!({ "id": id, "action": "aborted" }), false));
            }
            Ok(())
        }
    }?;
    Ok(ExitCode::SUCCESS)
}

fn list_branches(state_dir: &Path, as_json: bool) -> Result<(), CliError> {
    let branches = list(state_dir)?;
    if as_json {
        let items: Vec<_> = branches
            .iter()
            .map(|b| match &b.meta {
                Ok(meta) => json!({
                    "id": b.id, "orphan": b.is_orphan(), "meta": meta, "status": b.status()
                }),
                Err(why) => {
                    json!({ "id": b.id, "orphan": true, "error": why, "status": b.status() })
                }
            })
            .collect();
        outln!("{}", json(&items, false));
        return Ok(());
    }
    for b in &branches {
        match &b.meta {
            Ok(meta) => outln!(
                "{}  {}  {}  ({})",
                b.id.as_str(),
                meta.state.name(),
                quoted(&meta.workdir),
                b.status()
            ),
            Err(_) => outln!("{}  damaged  ({})", b.id.as_str(), b.status()),
        }
    }
    Ok(())
}

fn show(state_dir: &Path, id: &str, as_json: bool) -> Result<(), CliError> {
    let branch = Branch::open(state_dir, &BranchId::parse(id)?)?;
    let changes = branch.change_set()?;
    // A kept branch: nothing writes to it (a sandbox of it would have to be running).
    let token = lockbox_cow::Review::of(&branch.review()?).token();
    if as_json {
        outln!(
            "{}",
            json(
                &json!({ "meta": branch.meta(), "changes": changes.changes(), "review_token": token }),
                false
            )
        );
    } else {
        let meta = branch.meta();
        outln!(
            "branch {}\nworkdir {}\nstate {}\ncontext {}",
            meta.id.as_str(),
            quoted(&meta.workdir),
            meta.state.name(),
            json(&meta.context, false)
        );
        out!("{}", changes.to_lines());
        outln!("review token {token} (lockbox branch commit {id} --review {token} ...)");
    }
    Ok(())
}

fn diff(state_dir: &Path, id: &str, path: Option<&Path>, as_json: bool) -> Result<(), CliError> {
    let branch = Branch::open(state_dir, &BranchId::parse(id)?)?;
    let changed: Vec<_> = branch
        .change_set()?
        .changes()
        .iter()
        .map(|c| c.path.clone())
        .collect();
    // PATH, or the changes below it when it is a directory; one the branch does not change
    // has no diff: say so rather than print nothing.
    let paths: Vec<_> = match path {
        Some(p) => changed.into_iter().filter(|c| c.starts_with(p)).collect(),
        None => changed,
    };
    if let (Some(p), true) = (path, paths.is_empty()) {
        return Err(CliError::from(CowError::NotChanged {
            id: id.to_owned(),
            path: p.to_owned(),
        }));
    }
    let mut items = Vec::new();
    for p in &paths {
        let d = branch.diff(p)?;
        if as_json {
            // The raw diff: JSON strings escape what a terminal would act on.
            let diff = match &d {
                FileDiff::Text { unified } => unified.clone(),
                summary => summary.to_string(),
            };
            items.push(json!({ "path": Encoded(p), "diff": diff }));
        } else {
            // Quoted names and escaped control characters (FileDiff's Display). A text diff
            // names its path in its headers; a summary gets a line of its own.
            match &d {
                FileDiff::Text { .. } => out!("{d}"),
                summary => outln!("{}: {summary}", quoted(p)),
            }
        }
    }
    if as_json {
        outln!("{}", json(&items, false));
    }
    Ok(())
}

fn commit(state_dir: &Path, id: &str, force: bool, as_json: bool) -> Result<(), CliError> {
    let branch = Branch::open(state_dir, &BranchId::parse(id)?)?;
    super::txn::recover_sweep(state_dir, branch.workdir());
    match branch.commit(&CommitOptions {
        force,
        dry_run: false,
        defer_removal: false,
    }) {
        Ok(report) => {
            super::workdir::warn_skipped(&report);
            if as_json {
                outln!(
                    "{}",
                    json(
                        &json!({ "id": id, "action": "committed", "report": report }),
                        false
                    )
                );
            }
            Ok(())
        }
        Err(e) => {
            explain_commit_error(&e, id);
            Err(CliError::reported(e.exit_code()))
        }
    }
}
