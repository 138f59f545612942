//! SQLite backend (the default): one database file per journal, WAL mode, `synchronous=FULL`
//! so a committed append survives power loss.
//!
//! All writes go through one dedicated writer thread. It takes every request waiting in its
//! queue, applies them in one transaction (each under its own savepoint, so a fenced append
//! does not undo its neighbours) and commits once: when many runs append at once they share
//! one fsync (group commit). Reads use a second connection on the blocking pool; WAL lets
//! them run while the writer commits.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, TransactionBehavior};
use tokio::sync::oneshot;

use super::Storage;
use crate::entry::RawEntry;
use crate::error::StorageError;
use crate::id::RunId;

/// Most requests committed in one transaction.
const MAX_BATCH: usize = 512;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS lockbox_runs (
    run_id  TEXT PRIMARY KEY,
    session INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS lockbox_entries (
    run_id  TEXT NOT NULL,
    entry_offset INTEGER NOT NULL,
    session INTEGER NOT NULL,
    line    TEXT NOT NULL,
    PRIMARY KEY (run_id, entry_offset)
) WITHOUT ROWID;
";

/// A journal in one SQLite database file.
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    path: PathBuf,
    writer: mpsc::Sender<Request>,
    reader: Arc<Mutex<Connection>>,
    stats: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    commits: AtomicU64,
    requests: AtomicU64,
}

/// How well group commit is doing: requests (appends and session changes) per commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteStats {
    /// Transactions committed by the writer thread.
    pub commits: u64,
    /// Requests applied in them.
    pub requests: u64,
}

enum Request {
    Acquire {
        run: RunId,
        reply: oneshot::Sender<Result<u64, StorageError>>,
    },
    Append {
        run: RunId,
        entry: RawEntry,
        reply: oneshot::Sender<Result<(), StorageError>>,
    },
}

fn sql<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(rusqlite::Error) -> StorageError + 'a {
    move |source| StorageError::Sqlite {
        op,
        path: path.to_owned(),
        source,
    }
}

fn connect(path: &Path) -> Result<Connection, StorageError> {
    let conn = Connection::open(path).map_err(sql("open", path))?;
    conn.busy_timeout(Duration::from_secs(10))
        .map_err(sql("set busy timeout", path))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sql("enable WAL", path))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(sql("set synchronous=FULL", path))?;
    Ok(conn)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl SqliteStorage {
    /// Opens (creating if needed) the database at `path` and starts its writer thread.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StorageError> {
        let path = path.as_ref().to_owned();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StorageError::Io {
                op: "create directory",
                path: parent.to_owned(),
                source,
            })?;
        }
        let write_conn = connect(&path)?;
        write_conn
            .execute_batch(SCHEMA)
            .map_err(sql("create schema", &path))?;
        let reader = connect(&path)?;
        let (tx, rx) = mpsc::channel();
        let thread_path = path.clone();
        let stats = Arc::new(Counters::default());
        let thread_stats = Arc::clone(&stats);
        std::thread::Builder::new()
            .name("lockbox-journal-sqlite".into())
            .spawn(move || writer_loop(write_conn, &thread_path, &rx, &thread_stats))
            .map_err(|source| StorageError::Io {
                op: "spawn writer thread for",
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            path,
            writer: tx,
            reader: Arc::new(Mutex::new(reader)),
            stats,
        })
    }

    /// Commits and requests so far, for benchmarks and tests of group commit.
    pub fn stats(&self) -> SqliteStats {
        SqliteStats {
            commits: self.stats.commits.load(Ordering::Relaxed),
            requests: self.stats.requests.load(Ordering::Relaxed),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn send(&self, req: Request) -> Result<(), StorageError> {
        self.writer
            .send(req)
            .map_err(|_| StorageError::WorkerGone { backend: "sqlite" })
    }

    async fn with_reader<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Path) -> Result<T, StorageError> + Send + 'static,
    {
        let reader = Arc::clone(&self.reader);
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let conn = reader
                .lock()
                .map_err(|_| StorageError::WorkerGone { backend: "sqlite" })?;
            f(&conn, &path)
        })
        .await
        .map_err(|_| StorageError::WorkerGone { backend: "sqlite" })?
    }
}

fn writer_loop(mut conn: Connection, path: &Path, rx: &mpsc::Receiver<Request>, stats: &Counters) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(req) => batch.push(req),
                Err(_) => break,
            }
        }
        let outcomes = apply_batch(&mut conn, path, &batch);
        stats.commits.fetch_add(1, Ordering::Relaxed);
        stats
            .requests
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        for (req, outcome) in batch.into_iter().zip(outcomes) {
            // A caller that went away no longer wants its answer.
            match req {
                Request::Acquire { reply, .. } => {
                    let _ = reply.send(outcome);
                }
                Request::Append { reply, .. } => {
                    let _ = reply.send(outcome.map(|_| ()));
                }
            }
        }
    }
}

/// Applies a batch in one transaction; returns one outcome per request (the new session for
/// an acquire, 0 for an append). If the commit fails, every request fails.
fn apply_batch(
    conn: &mut Connection,
    path: &Path,
    batch: &[Request],
) -> Vec<Result<u64, StorageError>> {
    let failed_all = |e: rusqlite::Error, op| {
        let detail = e.to_string();
        batch
            .iter()
            .map(|_| {
                Err(StorageError::SqliteBatch {
                    op,
                    path: path.to_owned(),
                    detail: detail.clone(),
                })
            })
            .collect()
    };
    let mut txn = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(t) => t,
        Err(e) => return failed_all(e, "begin"),
    };
    let mut outcomes = Vec::with_capacity(batch.len());
    for req in batch {
        let outcome = match txn.savepoint() {
            Ok(mut sp) => {
                let result = match req {
                    Request::Acquire { run, .. } => acquire(&sp, path, run),
                    Request::Append { run, entry, .. } => append(&sp, path, run, entry).map(|()| 0),
                };
                let finished = if result.is_ok() {
                    sp.commit()
                } else {
                    sp.rollback()
                };
                match finished {
                    Ok(()) => result,
                    Err(e) => Err(sql("release savepoint", path)(e)),
                }
            }
            Err(e) => Err(sql("savepoint", path)(e)),
        };
        outcomes.push(outcome);
    }
    match txn.commit() {
        Ok(()) => outcomes,
        Err(e) => failed_all(e, "commit"),
    }
}

fn acquire(conn: &Connection, path: &Path, run: &RunId) -> Result<u64, StorageError> {
    conn.prepare_cached(
        "INSERT INTO lockbox_runs (run_id, session) VALUES (?1, 1)
         ON CONFLICT (run_id) DO UPDATE SET session = session + 1
         RETURNING session",
    )
    .and_then(|mut stmt| stmt.query_row(params![run.as_str()], |row| row.get::<_, i64>(0)))
    .map(to_u64)
    .map_err(sql("acquire session", path))
}

fn append(
    conn: &Connection,
    path: &Path,
    run: &RunId,
    entry: &RawEntry,
) -> Result<(), StorageError> {
    // The length comes from the entries' primary key (an index seek), so an append writes
    // one row in one table: one page less to put in the WAL per commit.
    let (session, len): (Option<i64>, i64) = conn
        .prepare_cached(
            "SELECT (SELECT session FROM lockbox_runs WHERE run_id = ?1),
                    (SELECT COALESCE(MAX(entry_offset) + 1, 0) FROM lockbox_entries WHERE run_id = ?1)",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![run.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
        })
        .map_err(sql("read run", path))?;
    let (session, len) = (session.map_or(0, to_u64), to_u64(len));
    if entry.session != session {
        return Err(StorageError::Fenced {
            run_id: run.clone(),
            session: entry.session,
            current: session,
        });
    }
    if entry.offset != len {
        return Err(StorageError::OffsetConflict {
            run_id: run.clone(),
            offset: entry.offset,
            len,
        });
    }
    conn.prepare_cached(
        "INSERT INTO lockbox_entries (run_id, entry_offset, session, line) VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            run.as_str(),
            to_i64(entry.offset),
            to_i64(entry.session),
            entry.line
        ])
    })
    .map_err(sql("insert entry", path))?;
    Ok(())
}

#[async_trait]
impl Storage for SqliteStorage {
    async fn acquire_session(&self, run: &RunId) -> Result<u64, StorageError> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Acquire {
            run: run.clone(),
            reply,
        })?;
        rx.await
            .map_err(|_| StorageError::WorkerGone { backend: "sqlite" })?
    }

    async fn append(&self, run: &RunId, entry: RawEntry) -> Result<(), StorageError> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Append {
            run: run.clone(),
            entry,
            reply,
        })?;
        rx.await
            .map_err(|_| StorageError::WorkerGone { backend: "sqlite" })?
    }

    async fn read(&self, run: &RunId, from: u64) -> Result<Vec<RawEntry>, StorageError> {
        let run = run.clone();
        self.with_reader(move |conn, path| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT entry_offset, session, line FROM lockbox_entries
                     WHERE run_id = ?1 AND entry_offset >= ?2 ORDER BY entry_offset",
                )
                .map_err(sql("prepare read", path))?;
            let rows = stmt
                .query_map(params![run.as_str(), to_i64(from)], |row| {
                    Ok(RawEntry {
                        offset: to_u64(row.get(0)?),
                        session: to_u64(row.get(1)?),
                        line: row.get(2)?,
                    })
                })
                .map_err(sql("read entries", path))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sql("read entries", path))
        })
        .await
    }

    async fn list_runs(&self) -> Result<Vec<RunId>, StorageError> {
        self.with_reader(|conn, path| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT run_id FROM lockbox_runs r WHERE EXISTS
                       (SELECT 1 FROM lockbox_entries e WHERE e.run_id = r.run_id)
                     ORDER BY run_id",
                )
                .map_err(sql("prepare list", path))?;
            let ids = stmt
                .query_map([], |row| row.get::<_, String>(0))
                .map_err(sql("list runs", path))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(sql("list runs", path))?;
            Ok(ids
                .into_iter()
                .filter_map(|id| RunId::parse(&id).ok())
                .collect())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{encode, Entry, EntryBody, FORMAT_VERSION};

    fn entry(run: &RunId, offset: u64, session: u64) -> RawEntry {
        encode(&Entry {
            format: FORMAT_VERSION,
            run: run.clone(),
            offset,
            session,
            at_ms: 0,
            body: EntryBody::Cancel {
                reason: String::new(),
            },
        })
        .unwrap()
    }

    /// One batch, one commit: a fenced append in the middle fails alone, its neighbours land.
    #[test]
    fn batch_failure_is_isolated_by_savepoints() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut conn = connect(&path).unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let (a, b, c) = (
            RunId::parse("a").unwrap(),
            RunId::parse("b").unwrap(),
            RunId::parse("c").unwrap(),
        );
        let mut batch = vec![];
        for run in [&a, &b, &c] {
            let (reply, _rx) = oneshot::channel();
            batch.push(Request::Acquire {
                run: run.clone(),
                reply,
            });
        }
        for (run, session) in [(&a, 1), (&b, 7), (&c, 1)] {
            let (reply, _rx) = oneshot::channel();
            batch.push(Request::Append {
                run: run.clone(),
                entry: entry(run, 0, session),
                reply,
            });
        }
        let outcomes = apply_batch(&mut conn, &path, &batch);
        let codes: Vec<_> = outcomes
            .iter()
            .map(|o| o.as_ref().map_err(StorageError::code).copied())
            .collect();
        assert_eq!(
            codes,
            [
                Ok(1),
                Ok(1),
                Ok(1),
                Ok(0),
                Err(lockbox_codes::ErrorCode::Fenced),
                Ok(0)
            ]
        );
        let rows: Vec<String> = conn
            .prepare("SELECT run_id FROM lockbox_entries ORDER BY run_id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows, ["a", "c"]);
        let len_b: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM lockbox_entries WHERE run_id = 'b'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(len_b, 0, "failed append wrote a row");
    }
}
