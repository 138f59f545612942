//! PostgreSQL backend: runs on many machines share one journal.
//!
//! Tables `lockbox_journal_runs` (session counter and length per run) and
//! `lockbox_journal_entries`, in the connection's schema or one named with
//! [`PostgresStorage::connect_in_schema`]. An append is one `INSERT … SELECT` whose
//! `WHERE` clause checks session and offset against the run row locked `FOR UPDATE`, followed by
//! the length bump, in one transaction: a concurrent `acquire_session` (an `UPDATE` of the same
//! row) is ordered before or after it, never between check and write. One client pipelines
//! the statements of concurrent callers over one connection.

use async_trait::async_trait;
use tokio_postgres::{Client, NoTls};

use super::Storage;
use crate::entry::RawEntry;
use crate::error::StorageError;
use crate::id::RunId;

/// A journal in a PostgreSQL database.
#[derive(Debug)]
pub struct PostgresStorage {
    /// A few connections; a run always uses the same one. PostgreSQL runs one statement at
    /// a time per connection, so more connections let commits of different runs overlap.
    clients: Vec<Client>,
    runs: String,
    entries: String,
    append_sql: String,
}

/// Advisory lock key taken while creating tables ("lockbox" in ASCII).
const SCHEMA_LOCK_KEY: i64 = 0x006c_6f63_6b62_6f78;

fn pg(op: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StorageError {
    move |source| StorageError::Postgres { op, source }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Connections opened by [`PostgresStorage::connect`] and
/// [`PostgresStorage::connect_in_schema`].
pub const DEFAULT_POSTGRES_CONNECTIONS: usize = 4;

impl PostgresStorage {
    fn client(&self, run: &RunId) -> &Client {
        // FNV-1a: stable and cheap; only spreads runs over connections.
        let hash = run
            .as_str()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        let i = usize::try_from(hash % self.clients.len() as u64).unwrap_or(0);
        &self.clients[i]
    }

    /// Connects with a libpq-style URL (`postgres://user@host:port/db`) and creates the tables
    /// in the default schema if missing.
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        Self::setup(url, None, DEFAULT_POSTGRES_CONNECTIONS).await
    }

    /// Like [`PostgresStorage::connect`], but keeps the tables in `schema` (created if
    /// missing). `schema` must be a plain lowercase identifier (`[a-z_][a-z0-9_]*`).
    pub async fn connect_in_schema(url: &str, schema: &str) -> Result<Self, StorageError> {
        Self::setup(url, Some(schema), DEFAULT_POSTGRES_CONNECTIONS).await
    }

    /// Like [`PostgresStorage::connect_in_schema`] (`schema` `None`: the default schema) with
    /// `connections` connections (at least 1).
    pub async fn connect_with(
        url: &str,
        schema: Option<&str>,
        connections: usize,
    ) -> Result<Self, StorageError> {
        Self::setup(url, schema, connections).await
    }

    async fn open_client(url: &str) -> Result<Client, StorageError> {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .map_err(pg("connect"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection closed");
            }
        });
        Ok(client)
    }

    async fn setup(
        url: &str,
        schema: Option<&str>,
        connections: usize,
    ) -> Result<Self, StorageError> {
        let client = Self::open_client(url).await?;
        let prefix = match schema {
            Some(s) => {
                let plain = !s.is_empty()
                    && s.len() <= 63
                    && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                    && s.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !plain {
                    return Err(StorageError::InvalidSchema {
                        schema: s.to_owned(),
                    });
                }
                format!("{s}.")
            }
            None => String::new(),
        };
        let runs = format!("{prefix}lockbox_journal_runs");
        let entries = format!("{prefix}lockbox_journal_entries");
        let create_schema = schema
            .map(|s| format!("CREATE SCHEMA IF NOT EXISTS {s};"))
            .unwrap_or_default();
        // Concurrent `CREATE … IF NOT EXISTS` of one table can still fail on a catalog unique
        // index; an advisory lock makes processes starting at once create the tables in turn.
        client
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY});
                 {create_schema}
                 CREATE TABLE IF NOT EXISTS {runs} (
                    run_id      TEXT PRIMARY KEY,
                    session     BIGINT NOT NULL,
                    next_offset BIGINT NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS {entries} (
                    run_id       TEXT NOT NULL,
                    entry_offset BIGINT NOT NULL,
                    session      BIGINT NOT NULL,
                    line         TEXT NOT NULL,
                    PRIMARY KEY (run_id, entry_offset)
                 );
                 COMMIT;"
            ))
            .await
            .map_err(pg("create tables"))?;
        // One statement, one round trip: lock the run row, insert only if session and offset
        // match, bump the length only if the insert happened, and report what was found.
        let append_sql = format!(
            "WITH cur AS (
                 SELECT session, next_offset FROM {runs} WHERE run_id = $1 FOR UPDATE
             ), ins AS (
                 INSERT INTO {entries} (run_id, entry_offset, session, line)
                 SELECT $1, $2, $3, $4 FROM cur
                 WHERE cur.session = $3 AND cur.next_offset = $2
                 RETURNING 1
             ), bump AS (
                 UPDATE {runs} SET next_offset = next_offset + 1
                 WHERE run_id = $1 AND EXISTS (SELECT 1 FROM ins)
                 RETURNING 1
             )
             SELECT cur.session, cur.next_offset, EXISTS (SELECT 1 FROM ins) FROM cur"
        );
        let mut clients = vec![client];
        while clients.len() < connections {
            clients.push(Self::open_client(url).await?);
        }
        Ok(Self {
            clients,
            runs,
            entries,
            append_sql,
        })
    }
}

#[async_trait]
impl Storage for PostgresStorage {
    async fn acquire_session(&self, run: &RunId) -> Result<u64, StorageError> {
        let row = self
            .client(run)
            .query_one(
                &format!(
                    "INSERT INTO {} (run_id, session, next_offset) VALUES ($1, 1, 0)
                     ON CONFLICT (run_id) DO UPDATE SET session = {}.session + 1
                     RETURNING session",
                    self.runs, self.runs
                ),
                &[&run.as_str()],
            )
            .await
            .map_err(pg("acquire session"))?;
        Ok(to_u64(row.get(0)))
    }

    async fn append(&self, run: &RunId, entry: RawEntry) -> Result<(), StorageError> {
        let row = self
            .client(run)
            .query_opt(
                &self.append_sql,
                &[
                    &run.as_str(),
                    &to_i64(entry.offset),
                    &to_i64(entry.session),
                    &entry.line,
                ],
            )
            .await
            .map_err(pg("append"))?;
        let (session, len, inserted) = row.map_or((0, 0, false), |row| {
            (
                to_u64(row.get::<_, i64>(0)),
                to_u64(row.get::<_, i64>(1)),
                row.get::<_, bool>(2),
            )
        });
        if inserted {
            return Ok(());
        }
        if entry.session != session {
            return Err(StorageError::Fenced {
                run_id: run.clone(),
                session: entry.session,
                current: session,
            });
        }
        Err(StorageError::OffsetConflict {
            run_id: run.clone(),
            offset: entry.offset,
            len,
        })
    }

    async fn read(&self, run: &RunId, from: u64) -> Result<Vec<RawEntry>, StorageError> {
        let rows = self
            .client(run)
            .query(
                &format!(
                    "SELECT entry_offset, session, line FROM {}
                     WHERE run_id = $1 AND entry_offset >= $2 ORDER BY entry_offset",
                    self.entries
                ),
                &[&run.as_str(), &to_i64(from)],
            )
            .await
            .map_err(pg("read entries"))?;
        Ok(rows
            .iter()
            .map(|row| RawEntry {
                offset: to_u64(row.get(0)),
                session: to_u64(row.get(1)),
                line: row.get(2),
            })
            .collect())
    }

    async fn list_runs(&self) -> Result<Vec<RunId>, StorageError> {
        let rows = self.clients[0]
            .query(
                &format!(
                    "SELECT run_id FROM {} WHERE next_offset > 0 ORDER BY run_id",
                    self.runs
                ),
                &[],
            )
            .await
            .map_err(pg("list runs"))?;
        Ok(rows
            .iter()
            .filter_map(|row| RunId::parse(row.get::<_, &str>(0)).ok())
            .collect())
    }
}
