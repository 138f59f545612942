//! Sandbox metadata in SQLite (`STATE/sandboxes.sqlite`): what was created, when, with
//! which workdir and branch, and how it ended. Rows still `running` when a runtime opens
//! were left by a previous one that died: they become `lost` (their branches are kept).

use rusqlite::{params, Connection};
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::types::{BranchAction, PolicySummary, SandboxId, SandboxInfo, SandboxState};
use crate::RuntimeError;

#[derive(Debug)]
pub(crate) struct Store {
    conn: Mutex<Connection>,
}

/// The workdir column: bytes (or, as written by earlier versions, text).
fn workdir_of(v: rusqlite::types::ValueRef<'_>) -> Option<PathBuf> {
    match v {
        rusqlite::types::ValueRef::Blob(b) | rusqlite::types::ValueRef::Text(b) => {
            Some(PathBuf::from(std::ffi::OsStr::from_bytes(b)))
        }
        _ => None,
    }
}

fn db_error(e: rusqlite::Error) -> RuntimeError {
    RuntimeError::Database(e)
}

impl Store {
    /// Opens (creating) the database and marks rows of a previous runtime `lost`.
    pub fn open(state_dir: &Path) -> Result<Store, RuntimeError> {
        let conn = Connection::open(state_dir.join("sandboxes.sqlite")).map_err(db_error)?;
        // `synchronous = NORMAL`: in WAL mode a commit survives the runtime's crash (kill -9)
        // but not the machine's, and costs no fsync — which was most of a pooled sandbox's
        // creation. A machine crash ends the sandboxes these rows describe anyway; branches
        // and snapshots have their own durable records (lockbox-cow).
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA busy_timeout = 5000;
             CREATE TABLE IF NOT EXISTS sandboxes (
                 id TEXT PRIMARY KEY,
                 state TEXT NOT NULL,
                 created_at TEXT NOT NULL,
                 workdir TEXT,
                 branch TEXT,
                 branch_action TEXT,
                 labels TEXT NOT NULL,
                 spec TEXT NOT NULL
             );
             UPDATE sandboxes SET state = 'lost', branch_action = 'kept' WHERE state = 'running';",
        )
        .map_err(db_error)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, info: &SandboxInfo, spec: &serde_json::Value) -> Result<(), RuntimeError> {
        let labels = serde_json::to_string(&info.labels)
            .map_err(RuntimeError::json("a sandbox's labels"))?;
        self.conn()
            .execute(
                "INSERT INTO sandboxes (id, state, created_at, workdir, branch, branch_action, labels, spec)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6, ?7)",
                params![
                    info.id.as_str(),
                    info.state.as_str(),
                    // The text the API shows: it sorts as the time does.
                    lockbox_policy::time::format(info.created_at),
                    // Bytes, not text: a lossy copy would name another directory.
                    info.workdir.as_ref().map(|p| p.as_os_str().as_bytes().to_vec()),
                    info.branch.as_ref().map(lockbox_cow::BranchId::as_str),
                    labels,
                    spec.to_string(),
                ],
            )
            .map(drop)
            .map_err(db_error)
    }

    pub fn update(
        &self,
        id: &str,
        state: SandboxState,
        branch: Option<&lockbox_cow::BranchId>,
        branch_action: Option<BranchAction>,
    ) -> Result<(), RuntimeError> {
        self.conn()
            .execute(
                "UPDATE sandboxes SET state = ?2, branch = ?3, branch_action = ?4 WHERE id = ?1",
                params![
                    id,
                    state.as_str(),
                    branch.map(lockbox_cow::BranchId::as_str),
                    branch_action.map(BranchAction::as_str)
                ],
            )
            .map(drop)
            .map_err(db_error)
    }

    /// Replaces the spec recorded for sandbox `id` (its network was replaced).
    pub fn update_spec(&self, id: &str, spec: &serde_json::Value) -> Result<(), RuntimeError> {
        self.conn()
            .execute(
                "UPDATE sandboxes SET spec = ?2 WHERE id = ?1",
                params![id, spec.to_string()],
            )
            .map(drop)
            .map_err(db_error)
    }

    /// Forgets all `stopped` rows but the `keep` most recently created ones (rowid: the
    /// insertion order, which a millisecond `created_at` may not tell apart), and all `lost`
    /// rows but the `keep` most recent: those piled up forever, one per sandbox running when
    /// a server died (issue 32: 1,227 after 50 kills, listing 15 times slower). Their
    /// branches stay in the branch store (`lockbox branch list`) for review.
    pub fn prune_ended(&self, keep: usize) -> Result<(), RuntimeError> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        self.conn()
            .execute(
                "DELETE FROM sandboxes WHERE state IN ('stopped', 'lost') AND id NOT IN
                   (SELECT id FROM sandboxes WHERE state = 'stopped'
                    ORDER BY rowid DESC LIMIT ?1) AND id NOT IN
                   (SELECT id FROM sandboxes WHERE state = 'lost'
                    ORDER BY rowid DESC LIMIT ?1)",
                params![keep],
            )
            .map(drop)
            .map_err(db_error)
    }

    /// Every recorded sandbox, oldest first (sessions/processes 0: not running here).
    pub fn list(&self) -> Result<Vec<SandboxInfo>, RuntimeError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, state, created_at, workdir, branch, branch_action, labels, spec
                 FROM sandboxes ORDER BY created_at, id",
            )
            .map_err(db_error)?;
        let rows = stmt
            .query_map([], |r| {
                let state: String = r.get(1)?;
                let labels: String = r.get(6)?;
                Ok(SandboxInfo {
                    id: SandboxId::from(r.get::<_, String>(0)?),
                    state: match state.as_str() {
                        "running" => SandboxState::Running,
                        "stopped" => SandboxState::Stopped,
                        _ => SandboxState::Lost,
                    },
                    // Every row's time was written by `insert`; one that does not read
                    // back (a hand-edited database) lists as 1970 rather than hiding the
                    // sandbox and its kept branch.
                    created_at: lockbox_policy::time::parse(&r.get::<_, String>(2)?)
                        .unwrap_or(std::time::UNIX_EPOCH),
                    workdir: workdir_of(r.get_ref(3)?),
                    // Written from a `BranchId`; text that is not one names no branch.
                    branch: r
                        .get::<_, Option<String>>(4)?
                        .and_then(|b| lockbox_cow::BranchId::parse(&b).ok()),
                    branch_action: r
                        .get::<_, Option<String>>(5)?
                        .as_deref()
                        .and_then(BranchAction::parse),
                    labels: serde_json::from_str::<BTreeMap<String, String>>(&labels)
                        .unwrap_or_else(|e| {
                            tracing::warn!(
                                "a sandbox row's labels do not read ({e}): listed without"
                            );
                            BTreeMap::new()
                        }),
                    sessions: 0,
                    processes: 0,
                    policy: serde_json::from_str(&r.get::<_, String>(7)?)
                        .ok()
                        .and_then(crate::record::spec_from_json)
                        .map(|spec| PolicySummary::of(&spec)),
                    usage: None,
                })
            })
            .map_err(db_error)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(db_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(store: &Store, id: &str, state: &str) {
        store
            .conn()
            .execute(
                "INSERT INTO sandboxes (id, state, created_at, labels, spec)
                 VALUES (?1, ?2, '2026-12-01T00:00:00Z', '{}', '{}')",
                params![id, state],
            )
            .unwrap();
    }

    fn ids(store: &Store, state: &str) -> Vec<String> {
        let conn = store.conn();
        let mut stmt = conn
            .prepare("SELECT id FROM sandboxes WHERE state = ?1 ORDER BY rowid")
            .unwrap();
        let rows = stmt.query_map(params![state], |r| r.get(0)).unwrap();
        rows.map(Result::unwrap).collect()
    }

    /// Issue 32: `lost` rows (sandboxes running when a server died) piled up forever; they
    /// get the retention of stopped ones, each state its own `keep` most recent.
    #[test]
    fn issue_32_lost_rows_are_pruned_like_stopped_ones() {
        let dir = tempfile::tempdir().unwrap();
        for server in 0..5 {
            let store = Store::open(dir.path()).unwrap();
            store.prune_ended(2).unwrap();
            add(&store, &format!("s{server}"), "stopped");
            add(&store, &format!("r{server}"), "running");
        }
        let store = Store::open(dir.path()).unwrap();
        store.prune_ended(2).unwrap();
        assert_eq!(ids(&store, "lost"), ["r3", "r4"]);
        assert_eq!(ids(&store, "stopped"), ["s3", "s4"]);
    }
}
