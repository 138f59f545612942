//! `filesystem.Filesystem` on the runtime's file and watch APIs: every path is resolved
//! inside the sandbox (relative ones below the user's home), never on the host.

use super::connect::{self, Call, Code, ConnectError, Events};
use super::proto::*;
use super::{lock, rt_error, Ctx, Envd, Head};
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use lockbox_runtime::{ChangeKind, FileKind, FileStat, WatchEvent as Change};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

/// Events a polled watcher keeps until they are fetched; older ones are dropped beyond.
const WATCHER_BACKLOG: usize = 4096;

/// A watcher of CreateWatcher: its sandbox and the events not fetched yet. Dropping it
/// stops the watch.
#[derive(Debug)]
pub struct Watcher {
    sandbox: String,
    events: Arc<Mutex<Vec<FilesystemEvent>>>,
    task: tokio::task::AbortHandle,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// GetWatcherEvents' settle window: ticks of [`SETTLE_TICK`], at most [`SETTLE_TICKS`];
/// it ends after [`QUIET_TICKS`] without a new event (or [`EMPTY_TICKS`] with none at all).
const SETTLE_TICK: std::time::Duration = std::time::Duration::from_millis(5);
const SETTLE_TICKS: usize = 40;
const QUIET_TICKS: usize = 4;
const EMPTY_TICKS: usize = 10;

static NEXT_WATCHER: AtomicU64 = AtomicU64::new(1);

pub(super) fn routes() -> Router<Envd> {
    Router::new()
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Move", post(move_entry))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/Remove", post(remove))
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .route("/filesystem.Filesystem/CreateWatcher", post(create_watcher))
        .route(
            "/filesystem.Filesystem/GetWatcherEvents",
            post(get_watcher_events),
        )
        .route("/filesystem.Filesystem/RemoveWatcher", post(remove_watcher))
        .route("/filesystem.Filesystem/{method}", post(unknown))
}

async fn unknown(
    axum::extract::Path(method): axum::extract::Path<String>,
    req: Request,
) -> Response {
    connect::unimplemented(&req, &format!("filesystem.Filesystem/{method}"))
}

/// Go's `os.FileMode.String()`, which envd reports: type letters (`d` directory, `L`
/// symlink, `u` setuid, `g` setgid, `t` sticky; `-` for none) then `rwxrwxrwx`.
fn permissions(kind: FileKind, mode: u32) -> String {
    let mut out = String::new();
    if kind == FileKind::Dir {
        out.push('d');
    }
    if kind == FileKind::Symlink {
        out.push('L');
    }
    for (bit, letter) in [(0o4000, 'u'), (0o2000, 'g'), (0o1000, 't')] {
        if mode & bit != 0 {
            out.push(letter);
        }
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    out
}

fn entry(ctx: &Ctx, st: &FileStat) -> EntryInfo {
    let name = st.path.rsplit('/').next().unwrap_or("").to_owned();
    let r#type = match st.kind {
        FileKind::File => FILE_TYPE_FILE,
        FileKind::Dir => FILE_TYPE_DIRECTORY,
        FileKind::Symlink => FILE_TYPE_SYMLINK,
        FileKind::Other => 0,
    };
    let modified = st.modified.duration_since(UNIX_EPOCH).unwrap_or_default();
    EntryInfo {
        name,
        r#type,
        path: st.path.clone(),
        size: i64::try_from(st.size).unwrap_or(i64::MAX),
        mode: st.mode & 0o777,
        permissions: permissions(st.kind, st.mode),
        owner: ctx.user.name().to_owned(),
        group: ctx.user.name().to_owned(),
        modified_time: Some(Timestamp {
            seconds: i64::try_from(modified.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(modified.subsec_nanos()).unwrap_or_default(),
        }),
        symlink_target: st.target.clone(),
        metadata: super::metadata(&st.xattrs),
        is_symlink: st.kind == FileKind::Symlink,
    }
}

/// As [`entry`], but a symlink is described as envd does: its target's type and the
/// target's absolute path (a dangling link stays a symlink).
async fn entry_of(ctx: &Ctx, st: &FileStat) -> EntryInfo {
    let mut info = entry(ctx, st);
    if st.kind != FileKind::Symlink {
        return info;
    }
    info.is_symlink = false;
    let mut link = st.clone();
    // Follow a chain of links (as the kernel does, at most 40).
    for _ in 0..40 {
        let Some(target) = link.target.clone() else {
            break;
        };
        let dir = link.path.rsplit_once('/').map_or("", |(d, _)| d);
        let next = if target.starts_with('/') {
            target
        } else {
            format!("{dir}/{target}")
        };
        let next = normalize(&next);
        info.symlink_target = Some(next.clone());
        match ctx.sandbox.stat(&next).await {
            Ok(t) if t.kind == FileKind::Symlink => link = t,
            Ok(t) => {
                info.r#type = entry(ctx, &t).r#type;
                break;
            }
            Err(_) => break,
        }
    }
    info
}

/// `path` without `.` and `..` components (lexically, as Go's `filepath.Clean`).
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

fn need_path(path: &str, field: &str) -> Result<(), ConnectError> {
    if path.is_empty() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("{field}: empty (name a path)"),
        ));
    }
    Ok(())
}

async fn stat(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: PathRequest, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let path = ctx.resolve(&msg.path);
        let st = ctx
            .sandbox
            .stat(&path)
            .await
            .map_err(|e| rt_error(&ctx.id, e))?;
        Ok(EntryResponse {
            entry: Some(entry_of(&ctx, &st).await),
        })
    })
    .await
}

async fn make_dir(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: PathRequest, _call: Call| async move {
        need_path(&msg.path, "path")?;
        let ctx = envd.ctx(&head).await?;
        let path = ctx.resolve(&msg.path);
        if let Ok(st) = ctx.sandbox.stat(&path).await {
            let what = if st.kind == FileKind::Dir {
                "directory"
            } else {
                "path"
            };
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("{what} {path} already exists"),
            ));
        }
        let st = ctx
            .sandbox
            .mkdir(&path, true)
            .await
            .map_err(|e| rt_error(&ctx.id, e))?;
        Ok(EntryResponse {
            entry: Some(entry_of(&ctx, &st).await),
        })
    })
    .await
}

async fn move_entry(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: MoveRequest, _call: Call| async move {
        need_path(&msg.source, "source")?;
        need_path(&msg.destination, "destination")?;
        let ctx = envd.ctx(&head).await?;
        let (from, to) = (ctx.resolve(&msg.source), ctx.resolve(&msg.destination));
        let st = ctx
            .sandbox
            .rename(&from, &to, true)
            .await
            .map_err(|e| rt_error(&ctx.id, e))?;
        Ok(EntryResponse {
            entry: Some(entry_of(&ctx, &st).await),
        })
    })
    .await
}

async fn remove(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: PathRequest, _call: Call| async move {
        need_path(&msg.path, "path")?;
        let ctx = envd.ctx(&head).await?;
        let path = ctx.resolve(&msg.path);
        match ctx.sandbox.remove(&path, true).await {
            // Like envd (Go's os.RemoveAll): removing what is not there succeeds.
            Ok(()) | Err(lockbox_runtime::RuntimeError::FileNotFound { .. }) => {
                Ok(RemoveResponse {})
            }
            Err(e) => Err(rt_error(&ctx.id, e)),
        }
    })
    .await
}

/// The directory at `path` (its absolute path as the sandbox sees it), or the error the
/// SDK expects: `not_found`, or `invalid_argument` for something else than a directory.
/// A symlink to a directory is followed: the answer is the directory's own path.
async fn directory(ctx: &Ctx, path: &str) -> Result<String, ConnectError> {
    let mut st = ctx
        .sandbox
        .stat(path)
        .await
        .map_err(|e| rt_error(&ctx.id, e))?;
    if st.kind == FileKind::Symlink {
        if let Some(target) = entry_of(ctx, &st).await.symlink_target {
            if let Ok(t) = ctx.sandbox.stat(&target).await {
                st = t;
            }
        }
    }
    if st.kind != FileKind::Dir {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("path {path} is not a directory"),
        ));
    }
    Ok(st.path)
}

async fn list_dir(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: ListDirRequest, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let path = ctx.resolve(&msg.path);
        let base = directory(&ctx, &path).await?;
        let depth = msg.depth.max(1) as usize;
        let mut listing = ctx
            .sandbox
            .list_stream(&base, depth > 1, true)
            .await
            .map_err(|e| rt_error(&ctx.id, e))?;
        let prefix = if base.ends_with('/') {
            base.clone()
        } else {
            format!("{base}/")
        };
        let mut entries = Vec::new();
        while let Some(st) = listing.next().await {
            let st = st.map_err(|e| rt_error(&ctx.id, e))?;
            let within = st
                .path
                .strip_prefix(&prefix)
                .map_or(1, |rel| rel.split('/').count());
            if within <= depth {
                entries.push(entry_of(&ctx, &st).await);
            }
        }
        Ok(ListDirResponse { entries })
    })
    .await
}

/// Whether `path` is the temporary file of a lockbox file write in progress
/// (`.NAME.lockbox-TOKEN.tmp`, renamed over `NAME` when complete).
fn is_write_temp(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    let Some(rest) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
        return false;
    };
    rest.rsplit_once(".lockbox-")
        .is_some_and(|(_, token)| !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()))
}

/// A watch's changes as E2B's events, relative to the watched directory `base`. A move
/// inside the watch is a rename of the old name then a create of the new one (as
/// fsnotify reports it); overflows and partial-watch errors carry no E2B event.
///
/// lockbox writes a file atomically (a temporary file renamed over it), envd in place: the
/// temporary file is not reported, and its rename over `NAME` reads as envd's write of
/// `NAME` does (create, chmod, write).
fn fs_events(base: &str, change: Change) -> Vec<FilesystemEvent> {
    let Change::Change(change) = change else {
        return Vec::new();
    };
    if is_write_temp(&change.path) {
        return Vec::new();
    }
    let rel = |p: &str| -> String {
        p.strip_prefix(base)
            .map(|r| r.trim_start_matches('/').to_owned())
            .unwrap_or_else(|| p.to_owned())
    };
    let ev = |name: String, r#type: i32| FilesystemEvent {
        name,
        r#type,
        entry: None,
    };
    match change.kind {
        ChangeKind::Created => vec![ev(rel(&change.path), EVENT_TYPE_CREATE)],
        ChangeKind::Modified => vec![ev(rel(&change.path), EVENT_TYPE_WRITE)],
        ChangeKind::Deleted => vec![ev(rel(&change.path), EVENT_TYPE_REMOVE)],
        ChangeKind::Moved if change.from.as_deref().is_some_and(is_write_temp) => {
            let name = rel(&change.path);
            vec![
                ev(name.clone(), EVENT_TYPE_CREATE),
                ev(name.clone(), EVENT_TYPE_CHMOD),
                ev(name, EVENT_TYPE_WRITE),
            ]
        }
        ChangeKind::Moved => {
            let mut out = Vec::new();
            if let Some(from) = &change.from {
                out.push(ev(rel(from), EVENT_TYPE_RENAME));
            }
            out.push(ev(rel(&change.path), EVENT_TYPE_CREATE));
            out
        }
    }
}

/// The E2B events of a watch of `msg.path`, each with its entry when asked.
async fn watch(ctx: Ctx, msg: &WatchRequest) -> Result<Events<FilesystemEvent>, ConnectError> {
    let path = ctx.resolve(&msg.path);
    let base = directory(&ctx, &path).await?;
    let stream = ctx
        .sandbox
        .watch(&base, msg.recursive)
        .await
        .map_err(|e| rt_error(&ctx.id, e))?;
    let include = msg.include_entry;
    let ctx = Arc::new(ctx);
    let dir = base.trim_end_matches('/').to_owned();
    let events = stream
        .flat_map(move |c| futures_util::stream::iter(fs_events(&base, c)))
        .then(move |mut ev| {
            let ctx = ctx.clone();
            let full = format!("{dir}/{}", ev.name);
            async move {
                if include && ev.r#type != EVENT_TYPE_REMOVE && ev.r#type != EVENT_TYPE_RENAME {
                    if let Ok(st) = ctx.sandbox.stat(&full).await {
                        ev.entry = Some(entry_of(&ctx, &st).await);
                    }
                }
                Ok(ev)
            }
        });
    Ok(events.boxed())
}

fn keepalive_watch() -> WatchDirResponse {
    WatchDirResponse {
        event: Some(WatchEvent::Keepalive(KeepAlive {})),
    }
}

async fn watch_dir(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::server_stream(
        req,
        keepalive_watch,
        move |msg: WatchRequest, _call: Call| async move {
            let ctx = envd.ctx(&head).await?;
            let events = watch(ctx, &msg).await?;
            let start = WatchDirResponse {
                event: Some(WatchEvent::Start(KeepAlive {})),
            };
            Ok::<Events<WatchDirResponse>, ConnectError>(
                futures_util::stream::once(async move { Ok(start) })
                    .chain(events.map(|e| {
                        e.map(|ev| WatchDirResponse {
                            event: Some(WatchEvent::Filesystem(ev)),
                        })
                    }))
                    .boxed(),
            )
        },
    )
    .await
}

async fn create_watcher(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: WatchRequest, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let sandbox = ctx.id.clone();
        let mut events = watch(ctx, &msg).await?;
        let kept = Arc::new(Mutex::new(Vec::new()));
        let sink = kept.clone();
        let task = tokio::spawn(async move {
            while let Some(Ok(ev)) = events.next().await {
                let mut kept = lock(&sink);
                if kept.len() >= WATCHER_BACKLOG {
                    kept.remove(0);
                }
                kept.push(ev);
            }
        });
        let id = format!("w{}", NEXT_WATCHER.fetch_add(1, Ordering::Relaxed));
        lock(&envd.state.watchers).insert(
            id.clone(),
            Watcher {
                sandbox,
                events: kept,
                task: task.abort_handle(),
            },
        );
        Ok(WatcherId { watcher_id: id })
    })
    .await
}

fn watcher_not_found(id: &str) -> ConnectError {
    ConnectError::new(Code::NotFound, format!("watcher {id:?} not found"))
}

async fn get_watcher_events(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: WatcherId, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let kept = {
            let watchers = lock(&envd.state.watchers);
            let w = watchers
                .get(&msg.watcher_id)
                .filter(|w| w.sandbox == ctx.id)
                .ok_or_else(|| watcher_not_found(&msg.watcher_id))?;
            w.events.clone()
        };
        // Changes reach the watcher a moment after they happen (inotify, then the agent):
        // a poll right after a change waits briefly for its events and for them to settle,
        // so it sees the change whole rather than half of it.
        let mut seen = lock(&kept).len();
        let mut quiet = 0;
        for _ in 0..SETTLE_TICKS {
            tokio::time::sleep(SETTLE_TICK).await;
            let now = lock(&kept).len();
            if now != seen {
                seen = now;
                quiet = 0;
                continue;
            }
            quiet += 1;
            if quiet >= if now == 0 { EMPTY_TICKS } else { QUIET_TICKS } {
                break;
            }
        }
        let events = std::mem::take(&mut *lock(&kept));
        Ok(GetWatcherEventsResponse { events })
    })
    .await
}

async fn remove_watcher(State(envd): State<Envd>, req: Request) -> Response {
    let head = Head::of(&req);
    connect::unary(req, move |msg: WatcherId, _call: Call| async move {
        let ctx = envd.ctx(&head).await?;
        let mut watchers = lock(&envd.state.watchers);
        match watchers.get(&msg.watcher_id) {
            Some(w) if w.sandbox == ctx.id => {
                watchers.remove(&msg.watcher_id);
                Ok(RemoveWatcherResponse {})
            }
            _ => Err(watcher_not_found(&msg.watcher_id)),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lockbox_write_temporaries_are_recognised() {
        assert!(is_write_temp("/d/.f.txt.lockbox-17.tmp"));
        assert!(!is_write_temp("/d/f.txt"));
        assert!(!is_write_temp("/d/.f.lockbox-x.tmp"));
        assert_eq!(normalize("/a/b/../c/./d"), "/a/c/d");
    }

    #[test]
    fn permissions_read_like_go_file_modes() {
        assert_eq!(permissions(FileKind::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileKind::Symlink, 0o777), "Lrwxrwxrwx");
        assert_eq!(permissions(FileKind::Dir, 0o1777), "dtrwxrwxrwx");
    }
}
