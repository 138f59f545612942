//! Files: read, write, list, watch, make, move, remove.

use super::{time, yes};
use crate::error::ApiError;
use lockbox_runtime::{FileKind, FileStat};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `?path=` of `GET/PUT files` and `fs/stat`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    /// Absolute inside the sandbox, or relative to its working directory.
    pub path: String,
}

/// `PUT files?path=&mode=`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PutQuery {
    /// Where to write.
    pub path: String,
    /// Permission bits, octal text (`644`, `0755`).
    #[serde(default)]
    #[param(pattern = "^[0-7]{1,4}$")]
    pub mode: Option<String>,
}

impl PutQuery {
    /// The mode as a number.
    pub fn mode(&self) -> Result<Option<u32>, ApiError> {
        self.mode
            .as_deref()
            .map(|m| {
                u32::from_str_radix(m, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| {
                        ApiError::invalid("mode", format!("mode: {m:?} is not octal bits (0644)"))
                    })
            })
            .transpose()
    }
}

/// A file's metadata as `fs/stat`, `fs/list` and `PUT files` send it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = FileStat)]
pub struct FileInfo {
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: FileKindName,
    pub size: u64,
    /// Permission bits as octal text (`"0644"`, `"4755"`): what `PUT files?mode=` takes,
    /// not the decimal 420 a client would have to convert.
    #[schema(pattern = "^[0-7]{4}$")]
    pub mode: String,
    pub modified: String,
    #[schema(required = true)]
    pub target: Option<String>,
}

impl From<FileStat> for FileInfo {
    fn from(stat: FileStat) -> FileInfo {
        FileInfo {
            path: stat.path,
            kind: match stat.kind {
                FileKind::File => FileKindName::File,
                FileKind::Dir => FileKindName::Dir,
                FileKind::Symlink => FileKindName::Symlink,
                FileKind::Other => FileKindName::Other,
            },
            size: stat.size,
            mode: format!("{:04o}", stat.mode & 0o7777),
            modified: time(stat.modified),
            target: stat.target,
        }
    }
}

/// The type of a file as `fs/stat` names it.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKindName {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device, FIFO or socket.
    Other,
}

/// `GET fs/list`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The directory.
    pub path: String,
    /// Descend into subdirectories.
    #[serde(default)]
    pub recursive: bool,
    /// Include names starting with `.`.
    #[serde(default)]
    pub hidden: bool,
}

/// `GET watch`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// The file or directory.
    pub path: String,
    /// Watch everything below a directory too (default true).
    #[serde(default = "yes")]
    pub recursive: bool,
}

/// `POST fs/mkdir`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = MkdirRequest)]
pub struct Mkdir {
    /// The directory to create.
    pub path: String,
    /// Create missing parents (default true); an existing directory is then fine.
    #[serde(default = "yes")]
    pub parents: bool,
}

/// `POST fs/move`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = MoveRequest)]
pub struct Move {
    /// Source.
    pub from: String,
    /// Destination.
    pub to: String,
    /// Replace an existing destination.
    #[serde(default)]
    pub overwrite: bool,
}

/// `POST fs/remove`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RemoveRequest)]
pub struct Remove {
    /// What to remove.
    pub path: String,
    /// Remove a directory with its contents.
    #[serde(default)]
    pub recursive: bool,
}
