//! The [`Storage`] seam and its backends: [`SqliteStorage`] (default, embedded),
//! [`FileStorage`] (JSONL, one file per run) and [`PostgresStorage`] (shared by many machines).
//! [`StorageUrl`] turns `sqlite:PATH | file:DIR | postgres://…` into one of them.
//!
//! Backends store opaque checksummed lines ([`RawEntry`]); they know only offsets and
//! sessions, which they need to enforce the two invariants every backend must hold
//! atomically with the write: *no gaps* (an append lands exactly at the run's length) and
//! *one writer* (an append from a session older than the run's newest is refused).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

use crate::entry::RawEntry;
use crate::error::{JournalError, StorageError};
use crate::id::RunId;

mod file;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use file::FileStorage;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStorage, DEFAULT_POSTGRES_CONNECTIONS};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStats, SqliteStorage};

/// Durable storage of runs. Every method is atomic; every `Ok` from `append` or
/// `acquire_session` means the change survives a crash of the process (and, as far as the
/// backend's fsync/commit allows, of the machine).
#[async_trait]
pub trait Storage: Send + Sync + fmt::Debug {
    /// Takes a session number for `run` higher than every number taken before. From then on
    /// appends with lower numbers fail with [`StorageError::Fenced`].
    async fn acquire_session(&self, run: &RunId) -> Result<u64, StorageError>;

    /// Appends `entry` to `run`. Fails with [`StorageError::Fenced`] when `entry.session` is not
    /// the run's newest session, and with [`StorageError::OffsetConflict`] when `entry.offset`
    /// is not the run's current length.
    async fn append(&self, run: &RunId, entry: RawEntry) -> Result<(), StorageError>;

    /// The run's entries with offset `>= from`, in offset order (empty for an unknown run).
    async fn read(&self, run: &RunId, from: u64) -> Result<Vec<RawEntry>, StorageError>;

    /// Every run holding at least one entry, sorted.
    async fn list_runs(&self) -> Result<Vec<RunId>, StorageError>;
}

/// Where a journal lives, parsed from `--journal`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageUrl {
    /// `sqlite:PATH`: one SQLite database file.
    Sqlite(PathBuf),
    /// `file:DIR`: one JSONL file per run in a directory.
    File(PathBuf),
    /// `postgres://…` or `postgresql://…`: a PostgreSQL connection string, passed as is.
    Postgres(String),
}

impl StorageUrl {
    /// Parses `sqlite:PATH`, `file:DIR`, `postgres://…` or `postgresql://…`. `sqlite://PATH`
    /// and `file://DIR` are accepted too.
    pub fn parse(input: &str) -> Result<Self, JournalError> {
        let invalid = |reason| JournalError::InvalidStorageUrl {
            input: input.to_owned(),
            reason,
        };
        if input.starts_with("postgres://") || input.starts_with("postgresql://") {
            return Ok(Self::Postgres(input.to_owned()));
        }
        let (scheme, rest) = input
            .split_once(':')
            .ok_or_else(|| invalid("missing scheme"))?;
        let path = rest.strip_prefix("//").unwrap_or(rest);
        if path.is_empty() {
            return Err(invalid("empty path"));
        }
        match scheme {
            "sqlite" => Ok(Self::Sqlite(PathBuf::from(path))),
            "file" => Ok(Self::File(PathBuf::from(path))),
            _ => Err(invalid("unknown scheme")),
        }
    }

    /// Opens (creating if needed) the storage this URL names.
    pub async fn open(&self) -> Result<Arc<dyn Storage>, JournalError> {
        Ok(match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(path) => Arc::new(SqliteStorage::open(path)?),
            #[cfg(not(feature = "sqlite"))]
            Self::Sqlite(_) => return Err(not_built("sqlite")),
            Self::File(dir) => Arc::new(FileStorage::open(dir)?),
            #[cfg(feature = "postgres")]
            Self::Postgres(url) => Arc::new(PostgresStorage::connect(url).await?),
            #[cfg(not(feature = "postgres"))]
            Self::Postgres(_) => return Err(not_built("postgres")),
        })
    }
}

/// A backend left out of this build (its cargo feature is off).
#[cfg(not(all(feature = "sqlite", feature = "postgres")))]
fn not_built(feature: &str) -> JournalError {
    StorageError::Unsupported {
        what: format!(
            "this build has no {feature} journal (lockbox-journal's `{feature}` feature is off)"
        ),
    }
    .into()
}

impl StorageUrl {
    /// Opens the storage this URL names only if it exists: for commands that read a
    /// journal, which must not create one (or its directories) as a side effect.
    pub async fn open_existing(&self) -> Result<Arc<dyn Storage>, JournalError> {
        let missing = |why: String| JournalError::NoJournal {
            url: self.to_string(),
            why,
        };
        match self {
            Self::Sqlite(path) if !path.is_file() => {
                return Err(missing(format!("{} is not a file", path.display())))
            }
            Self::File(dir) if !dir.is_dir() => {
                return Err(missing(format!("{} is not a directory", dir.display())))
            }
            _ => {}
        }
        self.open().await
    }
}

impl std::str::FromStr for StorageUrl {
    type Err = JournalError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for StorageUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            Self::File(p) => write!(f, "file:{}", p.display()),
            Self::Postgres(u) => f.write_str(u),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_scheme() {
        assert_eq!(
            StorageUrl::parse("sqlite:/tmp/j.db").unwrap(),
            StorageUrl::Sqlite("/tmp/j.db".into())
        );
        assert_eq!(
            StorageUrl::parse("sqlite://rel/j.db").unwrap(),
            StorageUrl::Sqlite("rel/j.db".into())
        );
        assert_eq!(
            StorageUrl::parse("file:runs").unwrap(),
            StorageUrl::File("runs".into())
        );
        assert_eq!(
            StorageUrl::parse("postgresql://u@127.0.0.1:5433/db").unwrap(),
            StorageUrl::Postgres("postgresql://u@127.0.0.1:5433/db".into())
        );
        for bad in ["", "nothing", "sqlite:", "mysql://x", "file://"] {
            assert_eq!(
                StorageUrl::parse(bad).unwrap_err().code(),
                "INVALID_STORAGE_URL",
                "{bad:?}"
            );
        }
    }
}
