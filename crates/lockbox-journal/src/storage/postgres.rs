//! PostgreSQL backend: runs on many machines share one journal.
//!
//! Tables `lockbox_journal_runs` (session counter and length per run) and
//! `lockbox_journal_entries`, in the connection's schema or one named with
//! [`PostgresStorage::connect_in_schema`]. An append is one `INSERT … SELECT` whose
//! `WHERE` clause checks session and offset against the run row locked `FOR UPDATE`, followed by
//! the length bump, in one transaction: a concurrent `acquire_session` (an `UPDATE` of the same
//! row) is ordered before or after it, never between check and write. One client pipelines
//! the statements of concurrent callers over one connection.
//!
//! Statements are prepared once per connection, so each call is one round trip. A connection
//! that breaks (server restart, `pg_terminate_backend`, network) is re-established on the
//! next call, which is retried once on the new connection; an append whose acknowledgement
//! was lost with the connection is recognised on the retry (the entry is there, with our
//! session and line) instead of being reported as a conflict. Fencing does not depend on
//! the connection: sessions live in the database.
//!
//! TLS: not supported (the driver runs with `NoTls`). `sslmode=disable` and `prefer` (the
//! default, which then connects in plain text) work; `sslmode=require` is refused when the
//! storage is opened, with a message saying so.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, Config, NoTls, Statement};

use super::Storage;
use crate::entry::RawEntry;
use crate::error::StorageError;
use crate::id::RunId;

/// A journal in a PostgreSQL database.
pub struct PostgresStorage {
    config: Config,
    /// A few connections; a run always uses the same one. PostgreSQL runs one statement at
    /// a time per connection, so more connections let commits of different runs overlap.
    conns: Vec<Conn>,
    sql: Sql,
}

impl std::fmt::Debug for PostgresStorage {
    // Not the config: it may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStorage")
            .field("dbname", &self.config.get_dbname())
            .field("runs", &self.sql.runs)
            .field("connections", &self.conns.len())
            .finish()
    }
}

/// The statements, as text (prepared on every new connection).
#[derive(Debug)]
struct Sql {
    runs: String,
    append: String,
    acquire: String,
    read: String,
    read_one: String,
    list: String,
}

/// One connection slot: the live connection with its prepared statements, or none after a
/// failure (the next call reconnects).
#[derive(Default)]
struct Conn {
    live: tokio::sync::Mutex<Option<Arc<Live>>>,
}

struct Live {
    client: Client,
    append: Statement,
    acquire: Statement,
    read: Statement,
    read_one: Statement,
    list: Statement,
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

/// A failure that a new connection may not have: the connection closed or the server ended
/// the session (`pg_terminate_backend`, shutdown).
fn connection_lost(e: &StorageError) -> bool {
    use tokio_postgres::error::SqlState;
    let StorageError::Postgres { source, .. } = e else {
        return false;
    };
    source.is_closed()
        || matches!(
            source.code(),
            Some(c) if *c == SqlState::ADMIN_SHUTDOWN || *c == SqlState::CRASH_SHUTDOWN
        )
        || std::error::Error::source(source).is_some_and(|s| s.is::<std::io::Error>())
}

/// Connections opened by [`PostgresStorage::connect`] and
/// [`PostgresStorage::connect_in_schema`].
pub const DEFAULT_POSTGRES_CONNECTIONS: usize = 4;

impl PostgresStorage {
    fn slot(&self, run: &RunId) -> usize {
        // FNV-1a: stable and cheap; only spreads runs over connections.
        let hash = run
            .as_str()
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        usize::try_from(hash % self.conns.len() as u64).unwrap_or(0)
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

    async fn open_client(config: &Config) -> Result<Client, StorageError> {
        let (client, connection) = config.connect(NoTls).await.map_err(pg("connect"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "postgres connection closed");
            }
        });
        Ok(client)
    }

    async fn open_live(&self) -> Result<Arc<Live>, StorageError> {
        let client = Self::open_client(&self.config).await?;
        let prepare = |sql: &str| {
            let client = &client;
            let sql = sql.to_owned();
            async move { client.prepare(&sql).await.map_err(pg("prepare")) }
        };
        let append = prepare(&self.sql.append).await?;
        let acquire = prepare(&self.sql.acquire).await?;
        let read = prepare(&self.sql.read).await?;
        let read_one = prepare(&self.sql.read_one).await?;
        let list = prepare(&self.sql.list).await?;
        Ok(Arc::new(Live {
            client,
            append,
            acquire,
            read,
            read_one,
            list,
        }))
    }

    /// The live connection of slot `i`, (re)connecting if there is none or it closed.
    async fn live(&self, i: usize) -> Result<Arc<Live>, StorageError> {
        let mut slot = self.conns[i].live.lock().await;
        if let Some(live) = slot.as_ref().filter(|l| !l.client.is_closed()) {
            return Ok(Arc::clone(live));
        }
        *slot = None;
        let live = self.open_live().await?;
        *slot = Some(Arc::clone(&live));
        Ok(live)
    }

    /// Forgets slot `i`'s connection if it is still `failed` (another caller may have
    /// replaced it already).
    async fn drop_live(&self, i: usize, failed: &Arc<Live>) {
        let mut slot = self.conns[i].live.lock().await;
        if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, failed)) {
            *slot = None;
        }
    }

    /// Runs `op` on slot `i`; if the connection was lost, once more on a new one.
    /// `Ok((value, retried))`.
    async fn call<T, F, Fut>(&self, i: usize, op: F) -> Result<(T, bool), StorageError>
    where
        F: Fn(Arc<Live>) -> Fut,
        Fut: std::future::Future<Output = Result<T, StorageError>>,
    {
        let live = self.live(i).await?;
        match op(Arc::clone(&live)).await {
            Err(e) if connection_lost(&e) => {
                tracing::debug!(error = %e, "postgres connection lost; reconnecting");
                self.drop_live(i, &live).await;
                let live = self.live(i).await?;
                Ok((op(live).await?, true))
            }
            other => other.map(|v| (v, false)),
        }
    }

    async fn setup(
        url: &str,
        schema: Option<&str>,
        connections: usize,
    ) -> Result<Self, StorageError> {
        let config: Config = url.parse().map_err(pg("parse connection string"))?;
        if config.get_ssl_mode() == SslMode::Require {
            return Err(StorageError::Unsupported {
                what: "TLS to PostgreSQL (sslmode=require): lockbox connects without TLS; \
                       use sslmode=disable on a trusted network, a Unix socket, or a TLS tunnel"
                    .into(),
            });
        }
        let client = Self::open_client(&config).await?;
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
        drop(client);
        // One statement, one round trip: lock the run row, insert only if session and offset
        // match, bump the length only if the insert happened, and report what was found.
        let append = format!(
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
        let sql = Sql {
            append,
            acquire: format!(
                "INSERT INTO {runs} (run_id, session, next_offset) VALUES ($1, 1, 0)
                 ON CONFLICT (run_id) DO UPDATE SET session = {runs}.session + 1
                 RETURNING session"
            ),
            read: format!(
                "SELECT entry_offset, session, line FROM {entries}
                 WHERE run_id = $1 AND entry_offset >= $2 ORDER BY entry_offset"
            ),
            read_one: format!(
                "SELECT session, line FROM {entries} WHERE run_id = $1 AND entry_offset = $2"
            ),
            list: format!("SELECT run_id FROM {runs} WHERE next_offset > 0 ORDER BY run_id"),
            runs,
        };
        let storage = Self {
            config,
            conns: (0..connections.max(1)).map(|_| Conn::default()).collect(),
            sql,
        };
        for i in 0..storage.conns.len() {
            storage.live(i).await?;
        }
        Ok(storage)
    }

    /// True if `entry` is stored exactly (same session and line) at its offset: an append
    /// whose acknowledgement was lost with its connection.
    async fn already_stored(&self, i: usize, run: &RunId, entry: &RawEntry) -> bool {
        let found = self
            .call(i, |live| async move {
                live.client
                    .query_opt(&live.read_one, &[&run.as_str(), &to_i64(entry.offset)])
                    .await
                    .map_err(pg("read entry"))
            })
            .await;
        matches!(found, Ok((Some(row), _))
            if to_u64(row.get::<_, i64>(0)) == entry.session && row.get::<_, &str>(1) == entry.line)
    }
}

#[async_trait]
impl Storage for PostgresStorage {
    async fn acquire_session(&self, run: &RunId) -> Result<u64, StorageError> {
        // A retry after a lost acknowledgement takes one more number: harmless, the newest
        // session is still ours.
        let (row, _) = self
            .call(self.slot(run), |live| async move {
                live.client
                    .query_one(&live.acquire, &[&run.as_str()])
                    .await
                    .map_err(pg("acquire session"))
            })
            .await?;
        Ok(to_u64(row.get(0)))
    }

    async fn append(&self, run: &RunId, entry: RawEntry) -> Result<(), StorageError> {
        let i = self.slot(run);
        let entry = &entry;
        let (row, retried) = self
            .call(i, |live| async move {
                live.client
                    .query_opt(
                        &live.append,
                        &[
                            &run.as_str(),
                            &to_i64(entry.offset),
                            &to_i64(entry.session),
                            &entry.line,
                        ],
                    )
                    .await
                    .map_err(pg("append"))
            })
            .await?;
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
        if retried && len == entry.offset + 1 && self.already_stored(i, run, entry).await {
            return Ok(());
        }
        Err(StorageError::OffsetConflict {
            run_id: run.clone(),
            offset: entry.offset,
            len,
        })
    }

    async fn read(&self, run: &RunId, from: u64) -> Result<Vec<RawEntry>, StorageError> {
        let (rows, _) = self
            .call(self.slot(run), |live| async move {
                live.client
                    .query(&live.read, &[&run.as_str(), &to_i64(from)])
                    .await
                    .map_err(pg("read entries"))
            })
            .await?;
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
        let (rows, _) = self
            .call(0, |live| async move {
                live.client
                    .query(&live.list, &[])
                    .await
                    .map_err(pg("list runs"))
            })
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| RunId::parse(row.get::<_, &str>(0)).ok())
            .collect())
    }
}
