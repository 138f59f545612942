//! File operations: the agent resolves and opens inside the sandbox (see
//! `lockbox_agent`), the runtime streams the bytes through the descriptors it
//! sends back, so no host privilege touches a sandbox path and nothing is buffered whole.

use lockbox_agent::{AgentError, Body, EntryStat, Op};
use std::io::SeekFrom;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::agent::AgentClient;
use crate::streams::{FileList, FileRead};
use crate::types::{ByteRange, FileKind, FileStat, WriteOptions};
use crate::RuntimeError;

/// Maps an agent failure on `path` to the API's errors. `writing`: a refusal by Landlock
/// or a read-only mount is `READ_ONLY`.
pub(crate) fn map_error(e: AgentError, path: &str, writing: bool) -> RuntimeError {
    let path = path.to_owned();
    match e.errno {
        libc::ENOENT => RuntimeError::FileNotFound { path },
        libc::EXDEV => RuntimeError::PathOutsideSandbox { path },
        libc::ENOTDIR => RuntimeError::NotADirectory { path },
        libc::EISDIR => RuntimeError::IsADirectory { path },
        libc::EEXIST => RuntimeError::AlreadyExists { path },
        libc::ENOTEMPTY => RuntimeError::invalid(
            "recursive",
            format!("{path}: directory not empty (remove it with recursive)"),
        ),
        libc::EROFS => RuntimeError::ReadOnly { path },
        libc::EACCES | libc::EPERM if writing => RuntimeError::ReadOnly { path },
        libc::EACCES | libc::EPERM => RuntimeError::PermissionDenied { path },
        libc::ELOOP => RuntimeError::invalid(
            "path",
            format!("{path}: too many symlinks, or a /proc magic link"),
        ),
        libc::EINVAL => RuntimeError::invalid("path", format!("{path}: {}", e.message)),
        libc::EOPNOTSUPP => RuntimeError::invalid(
            "xattrs",
            format!("{path}: its file system keeps no user extended attributes"),
        ),
        _ => RuntimeError::Agent(format!("failed: {}", e.message)),
    }
}

fn stat_of(e: EntryStat) -> FileStat {
    FileStat {
        path: e.path,
        kind: match e.kind.as_str() {
            "file" => FileKind::File,
            "dir" => FileKind::Dir,
            "symlink" => FileKind::Symlink,
            _ => FileKind::Other,
        },
        size: e.size,
        mode: e.mode,
        modified: lockbox_policy::time::from_unix(e.mtime, e.mtime_nsec),
        target: e.target,
        xattrs: e.xattrs,
    }
}

async fn call(
    agent: &AgentClient,
    op: Op,
    path: &str,
    writing: bool,
) -> Result<(Body, Vec<OwnedFd>), RuntimeError> {
    let (result, fds) = agent.call(op).await?;
    result
        .map(|b| (b, fds))
        .map_err(|e| map_error(e, path, writing))
}

/// Longest name and value of an extended attribute (xattr(7): `XATTR_NAME_MAX`, and a
/// value's limit on most file systems).
const XATTR_NAME_MAX: usize = 255;
const XATTR_VALUE_MAX: usize = 4096;

fn check_xattrs(xattrs: &std::collections::BTreeMap<String, String>) -> Result<(), RuntimeError> {
    for (name, value) in xattrs {
        let bad = |why: &str| RuntimeError::invalid("xattrs", format!("{name:?}: {why}"));
        if !name.starts_with("user.") || name.len() == "user.".len() {
            return Err(bad("names are in the user. namespace (user.KEY)"));
        }
        if name.len() > XATTR_NAME_MAX || name.contains('\0') {
            return Err(bad("a name is at most 255 bytes, without NUL"));
        }
        if value.len() > XATTR_VALUE_MAX || value.contains('\0') {
            return Err(bad("a value is at most 4,096 bytes, without NUL"));
        }
    }
    Ok(())
}

pub(crate) fn check_path(path: &str) -> Result<(), RuntimeError> {
    if path.is_empty() || path.contains('\0') {
        return Err(RuntimeError::invalid(
            "path",
            "empty, or contains a NUL byte",
        ));
    }
    Ok(())
}

/// `[start, end)` of `range` in a file of `size` bytes (the whole file without one).
fn span(range: Option<ByteRange>, size: u64) -> Result<(u64, u64), RuntimeError> {
    match range {
        None => Ok((0, size)),
        Some(r) => {
            let end = r.end.unwrap_or(size).min(size);
            if r.start > end || (r.start >= size && size > 0) {
                return Err(RuntimeError::invalid(
                    "range",
                    format!("{}-{:?} is outside the file's {size} bytes", r.start, r.end),
                ));
            }
            Ok((r.start, end))
        }
    }
}

/// Reads a file without a trustworthy size to its end, as `cat` would, keeping at most
/// `max` bytes: its length is then known before a byte is sent (a reply's length, a
/// range). One giving more is refused, never cut silently.
async fn read_unsized(
    mut file: tokio::fs::File,
    path: &str,
    max: usize,
) -> Result<Vec<u8>, RuntimeError> {
    let mut data = Vec::new();
    (&mut file)
        .take(max as u64 + 1)
        .read_to_end(&mut data)
        .await
        .map_err(RuntimeError::os("reading a file's descriptor"))?;
    if data.len() > max {
        return Err(RuntimeError::invalid(
            "path",
            format!(
                "{path} has no size on disk (a /proc or /sys file) and gives more than \
                 {max} bytes, the most read from such a file (as from an exec's output); \
                 read a part of it with an exec (head -c)"
            ),
        ));
    }
    Ok(data)
}

/// Opens `path` for reading. A regular file streams from its descriptor, bounded by its
/// size at open; a file whose size `stat` does not tell (`/proc`, `/sys`) is read to its
/// end first, at most `max_unsized` bytes, by the agent (what such a file shows can
/// depend on the task reading it: the sandbox's hostname, not the host's).
pub(crate) async fn read_file(
    agent: &AgentClient,
    path: &str,
    range: Option<ByteRange>,
    max_unsized: usize,
) -> Result<FileRead, RuntimeError> {
    check_path(path)?;
    let op = Op::Open {
        path: path.into(),
        max_unsized: max_unsized as u64,
    };
    let (body, fds) = call(agent, op, path, false).await?;
    let Body::Opened { size, copied } = body else {
        return Err(body.unexpected("opened").into());
    };
    let fd = fds
        .into_iter()
        .next()
        .ok_or_else(|| RuntimeError::Agent("sent no descriptor".into()))?;
    let mut file = tokio::fs::File::from_std(std::fs::File::from(fd));
    if copied {
        let mut data = read_unsized(file, path, max_unsized).await?;
        let size = data.len() as u64;
        let (start, end) = span(range, size)?;
        // Both are at most `size`, a `usize`.
        data.truncate(end as usize);
        data.drain(..start as usize);
        return Ok(FileRead {
            size,
            range: (start, end),
            body: Box::pin(std::io::Cursor::new(data)),
            read_whole: true,
        });
    }
    let (start, end) = span(range, size)?;
    file.seek(SeekFrom::Start(start))
        .await
        .map_err(RuntimeError::os("reading a file's descriptor"))?;
    Ok(FileRead {
        size,
        range: (start, end),
        body: Box::pin(file.take(end - start)),
        read_whole: false,
    })
}

/// `S_ISUID | S_ISGID`.
const SET_ID_BITS: u32 = 0o6000;

pub(crate) async fn write_file(
    agent: &AgentClient,
    path: &str,
    mut body: Pin<Box<dyn AsyncRead + Send>>,
    opts: WriteOptions,
) -> Result<FileStat, RuntimeError> {
    check_path(path)?;
    if opts.mode > 0o7777 {
        return Err(RuntimeError::invalid(
            "mode",
            "permission bits are at most 0o7777",
        ));
    }
    check_xattrs(&opts.xattrs)?;
    let op = Op::WriteBegin {
        path: path.into(),
        mode: opts.mode,
        create_parents: opts.create_parents,
        xattrs: opts.xattrs,
    };
    let (result, fds) = agent.call(op).await?;
    let b = result.map_err(|e| match e.errno {
        // Not a read-only path: lockbox's seccomp filter refuses set-id bits to everything
        // in a sandbox (set-user-id always, set-group-id where others can reach the
        // sandbox's writes), and says so with EPERM (issue 32: `mode=4755` was READ_ONLY).
        libc::EPERM if opts.mode & SET_ID_BITS != 0 => RuntimeError::invalid(
            "mode",
            format!(
                "{:04o}: the set-user-id and set-group-id bits are refused in a sandbox; \
                 give the mode without them ({:04o})",
                opts.mode,
                opts.mode & !SET_ID_BITS
            ),
        ),
        _ => map_error(e, path, true),
    })?;
    let Body::WriteStarted { token } = b else {
        return Err(b.unexpected("write_started").into());
    };
    let fd = fds
        .into_iter()
        .next()
        .ok_or_else(|| RuntimeError::Agent("sent no descriptor".into()))?;
    let mut file = tokio::fs::File::from_std(std::fs::File::from(fd));
    let copied = async {
        tokio::io::copy(&mut body, &mut file).await?;
        file.flush().await?;
        file.sync_data().await
    }
    .await;
    drop(file);
    if let Err(e) = copied {
        let _ = agent
            .call(Op::WriteEnd {
                token,
                commit: false,
            })
            .await;
        return Err(if e.kind() == std::io::ErrorKind::StorageFull {
            RuntimeError::invalid("body", format!("{path}: no space left in the sandbox"))
        } else {
            RuntimeError::os("writing a file")(e)
        });
    }
    match call(
        agent,
        Op::WriteEnd {
            token,
            commit: true,
        },
        path,
        true,
    )
    .await?
    {
        (Body::Stat(st), _) => Ok(stat_of(st)),
        (b, _) => Err(b.unexpected("stat").into()),
    }
}

pub(crate) async fn stat(agent: &AgentClient, path: &str) -> Result<FileStat, RuntimeError> {
    check_path(path)?;
    match call(agent, Op::Stat { path: path.into() }, path, false).await? {
        (Body::Stat(st), _) => Ok(stat_of(st)),
        (b, _) => Err(b.unexpected("stat").into()),
    }
}

/// Longest line of a listing (one entry, mostly its path) the runtime reads; a longer
/// one ends the listing with an error instead of growing a buffer.
const MAX_ENTRY_LINE: usize = 64 * 1024;

pub(crate) async fn list(
    agent: &AgentClient,
    path: &str,
    recursive: bool,
    hidden: bool,
) -> Result<FileList, RuntimeError> {
    check_path(path)?;
    let op = Op::List {
        path: path.into(),
        recursive,
        hidden,
    };
    let (b, fds) = call(agent, op, path, false).await?;
    let Body::Listed { .. } = b else {
        return Err(b.unexpected("listed").into());
    };
    let fd = fds
        .into_iter()
        .next()
        .ok_or_else(|| RuntimeError::Agent("sent no descriptor".into()))?;
    let mut file = tokio::fs::File::from_std(std::fs::File::from(fd));
    file.seek(SeekFrom::Start(0))
        .await
        .map_err(RuntimeError::os("reading a listing"))?;
    // The agent wrote the entries as JSON lines into a memfd: read them one at a time, so
    // a directory of a million entries never sits in the runtime's memory whole.
    let reader = tokio::io::BufReader::new(file);
    let entries = futures_util::stream::try_unfold(reader, |mut reader| async move {
        let mut line = Vec::new();
        let n = (&mut reader)
            .take(MAX_ENTRY_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .map_err(RuntimeError::os("reading a listing"))?;
        if n == 0 {
            return Ok(None);
        }
        if line.len() > MAX_ENTRY_LINE {
            return Err(RuntimeError::invalid(
                "path",
                format!(
                    "an entry's path is longer than {MAX_ENTRY_LINE} bytes; list a subdirectory"
                ),
            ));
        }
        let e: EntryStat =
            serde_json::from_slice(&line).map_err(RuntimeError::json("the agent's listing"))?;
        Ok(Some((stat_of(e), reader)))
    });
    Ok(FileList {
        inner: Box::pin(entries),
    })
}

pub(crate) async fn mkdir(
    agent: &AgentClient,
    path: &str,
    parents: bool,
) -> Result<FileStat, RuntimeError> {
    check_path(path)?;
    let op = Op::Mkdir {
        path: path.into(),
        parents,
    };
    match call(agent, op, path, true).await? {
        (Body::Stat(st), _) => Ok(stat_of(st)),
        (b, _) => Err(b.unexpected("stat").into()),
    }
}

pub(crate) async fn remove(
    agent: &AgentClient,
    path: &str,
    recursive: bool,
) -> Result<(), RuntimeError> {
    check_path(path)?;
    let op = Op::Remove {
        path: path.into(),
        recursive,
    };
    call(agent, op, path, true).await.map(drop)
}

pub(crate) async fn rename(
    agent: &AgentClient,
    from: &str,
    to: &str,
    overwrite: bool,
) -> Result<FileStat, RuntimeError> {
    check_path(from)?;
    check_path(to)?;
    let op = Op::Rename {
        from: from.into(),
        to: to.into(),
        overwrite,
    };
    match call(agent, op, from, true).await {
        Ok((Body::Stat(st), _)) => Ok(stat_of(st)),
        Ok((b, _)) => Err(b.unexpected("stat").into()),
        // The destination is what exists.
        Err(RuntimeError::AlreadyExists { .. }) => {
            Err(RuntimeError::AlreadyExists { path: to.into() })
        }
        Err(e) => Err(e),
    }
}
