//! `lockbox branch`: kept copy-on-write branches, reviewed, committed or aborted.

use super::print_error;
use super::workdir::explain_commit_error;
use crate::cli::{BranchArgs, BranchCommand};
use lockbox_cow::{abort_id, list, Branch, BranchId, CommitOptions, CowError};
use serde_json::json;
use std::path::Path;

pub fn run(args: &BranchArgs) -> i32 {
    let state_dir = match args.state.resolve() {
        Ok(dir) => dir,
        Err(e) => {
            print_error(&e, None);
            return 2;
        }
    };
    let result = match &args.command {
        BranchCommand::List => list_branches(&state_dir, args.json),
        BranchCommand::Show { id } => show(&state_dir, id, args.json),
        BranchCommand::Diff { id, path } => diff(&state_dir, id, path.as_deref(), args.json),
        BranchCommand::Commit { id, force } => commit(&state_dir, id, *force, args.json),
        BranchCommand::Abort { id } => BranchId::parse(id).and_then(|id| {
            abort_id(&state_dir, &id)?;
            if args.json {
                println!("{}", json!({ "id": id, "action": "aborted" }));
            }
            Ok(())
        }),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            if !matches!(e, CowError::StaleBase { .. }) {
                print_error(&e, None);
            }
            i32::from(e.exit_code())
        }
    }
}

fn list_branches(state_dir: &Path, as_json: bool) -> Result<(), CowError> {
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
        println!("{}", serde_json::Value::Array(items));
        return Ok(());
    }
    for b in &branches {
        match &b.meta {
            Ok(meta) => println!(
                "{}  {}  {}  ({})",
                b.id.as_str(),
                meta.state.name(),
                meta.workdir.display(),
                b.status()
            ),
            Err(_) => println!("{}  damaged  ({})", b.id.as_str(), b.status()),
        }
    }
    Ok(())
}

fn show(state_dir: &Path, id: &str, as_json: bool) -> Result<(), CowError> {
    let branch = Branch::open(state_dir, &BranchId::parse(id)?)?;
    let changes = branch.change_set()?;
    if as_json {
        println!(
            "{}",
            json!({ "meta": branch.meta(), "changes": changes.changes() })
        );
    } else {
        let meta = branch.meta();
        println!(
            "branch {}\nworkdir {}\nstate {:?}\ncontext {}",
            meta.id.as_str(),
            meta.workdir.display(),
            meta.state,
            meta.context
        );
        print!("{}", changes.to_lines());
    }
    Ok(())
}

fn diff(state_dir: &Path, id: &str, path: Option<&Path>, as_json: bool) -> Result<(), CowError> {
    let branch = Branch::open(state_dir, &BranchId::parse(id)?)?;
    let paths: Vec<_> = match path {
        Some(p) => vec![p.to_owned()],
        None => branch
            .change_set()?
            .changes()
            .iter()
            .map(|c| c.path.clone())
            .collect(),
    };
    let mut items = Vec::new();
    for p in &paths {
        let d = branch.diff(p)?;
        if as_json {
            items.push(json!({ "path": p, "diff": d.to_string() }));
        } else {
            print!("{d}");
        }
    }
    if as_json {
        println!("{}", serde_json::Value::Array(items));
    }
    Ok(())
}

fn commit(state_dir: &Path, id: &str, force: bool, as_json: bool) -> Result<(), CowError> {
    let branch = Branch::open(state_dir, &BranchId::parse(id)?)?;
    super::txn::recover_sweep(state_dir, branch.workdir());
    match branch.commit(&CommitOptions {
        force,
        dry_run: false,
    }) {
        Ok(report) => {
            if as_json {
                println!(
                    "{}",
                    json!({ "id": id, "action": "committed", "report": report })
                );
            }
            Ok(())
        }
        Err(e) => {
            explain_commit_error(&e, id);
            Err(e)
        }
    }
}
