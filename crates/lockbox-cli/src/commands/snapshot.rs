//! `lockbox snapshot`: the snapshots of a state directory, listed, shown, compared, deleted.
//! (Taking, forking and restoring need a running sandbox: `lockbox serve` and the SDKs.)

use crate::cli::{SnapshotArgs, SnapshotCommand};
use crate::error::{CliError, ExitCode};
use crate::output::{json, out, outln};
use lockbox_cow::{diff_views, Change, ChangeSet, SnapshotId, SnapshotMeta, SnapshotStore};
use lockbox_policy::name::quoted;
use serde_json::json;

pub fn run(args: &SnapshotArgs) -> Result<ExitCode, CliError> {
    let state_dir = args
        .state
        .resolve()
        .map_err(|e| CliError::usage(super::chain(&e)))?;
    let store = SnapshotStore::open(&state_dir)?;
    match &args.command {
        SnapshotCommand::List => list(&store, args.json),
        SnapshotCommand::Show { id } => show(&store, id, args.json),
        SnapshotCommand::Diff { id, other } => diff(&store, id, other.as_deref(), args.json),
        SnapshotCommand::Rm { ids } => remove(&store, ids, args.json),
    }?;
    Ok(ExitCode::SUCCESS)
}

fn list(store: &SnapshotStore, as_json: bool) -> Result<(), CliError> {
    let all = store.list()?;
    if as_json {
        outln!("{}", json(&json!({ "snapshots": all }), false));
        return Ok(());
    }
    for m in &all {
        outln!(
            "{}  {}  {}  {} bytes  {}",
            m.id,
            m.name.as_deref().unwrap_or("-"),
            quoted(&m.workdir),
            m.bytes,
            m.parent
                .as_ref()
                .map_or("-".to_owned(), |p| format!("on {p}"))
        );
    }
    Ok(())
}

fn show(store: &SnapshotStore, id: &str, as_json: bool) -> Result<(), CliError> {
    let id = SnapshotId::parse(id)?;
    let meta = store.get(&id)?;
    let holders = store.holders(&id)?;
    let forks = store.forks(&id)?;
    let children: Vec<String> = store
        .list()?
        .into_iter()
        .filter(|m| m.parent.as_ref() == Some(&id))
        .map(|m| m.id.to_string())
        .collect();
    let changes = own_changes(store, &meta)?;
    if as_json {
        let v = json!({
            "snapshot": meta, "forks": forks, "holders": holders, "children": children,
            "changes": changes,
        });
        outln!("{}", json(&v, false));
        return Ok(());
    }
    outln!(
        "snapshot {}\nname {}\nworkdir {}\nparent {}\nbytes {}\nentries {}\nforks {}\nsnapshots on it {}",
        meta.id,
        meta.name.as_deref().unwrap_or("-"),
        quoted(&meta.workdir),
        meta.parent.as_ref().map_or("-".to_owned(), ToString::to_string),
        meta.bytes,
        meta.entries,
        names(&forks),
        names(&children),
    );
    out!("{}", lines(&changes));
    Ok(())
}

fn diff(
    store: &SnapshotStore,
    id: &str,
    other: Option<&str>,
    as_json: bool,
) -> Result<(), CliError> {
    let meta = store.get(&SnapshotId::parse(id)?)?;
    let changes = match other {
        None => own_changes(store, &meta)?,
        Some(other) => {
            let to = store.get(&SnapshotId::parse(other)?)?;
            if to.workdir != meta.workdir {
                return Err(CliError::usage(format!(
                    "snapshot {} is of {} and snapshot {} of {}: no diff between them",
                    meta.id,
                    quoted(&meta.workdir),
                    to.id,
                    quoted(&to.workdir)
                )));
            }
            let a = store.view(&meta.id)?;
            let b = store.view(&to.id)?;
            diff_views(a.path(), b.path(), &meta.workdir)?
        }
    };
    if as_json {
        outln!("{}", json(&json!({ "changes": changes }), false));
    } else {
        out!("{}", lines(&changes));
    }
    Ok(())
}

fn remove(store: &SnapshotStore, ids: &[String], as_json: bool) -> Result<(), CliError> {
    // Every id is checked (well-formed, existing) before anything is deleted.
    let ids = ids
        .iter()
        .map(|id| SnapshotId::parse(id))
        .collect::<Result<Vec<_>, _>>()?;
    for id in &ids {
        store.get(id)?;
    }
    for id in &ids {
        store.delete(id)?;
        if as_json {
            outln!("{}", json(&json!({ "id": id, "action": "deleted" }), false));
        } else {
            outln!("deleted {id}");
        }
    }
    Ok(())
}

/// The snapshot's changes against its workdir as it is now.
fn own_changes(store: &SnapshotStore, meta: &SnapshotMeta) -> Result<Vec<Change>, CliError> {
    let view = store.view(&meta.id)?;
    Ok(ChangeSet::compute(view.path(), &meta.workdir)?
        .changes()
        .to_vec())
}

fn lines(changes: &[Change]) -> String {
    changes
        .iter()
        .map(|c| format!("{} {}\n", c.kind.letter(), quoted(&c.path)))
        .collect()
}

fn names(list: &[String]) -> String {
    if list.is_empty() {
        "-".to_owned()
    } else {
        list.join(", ")
    }
}
