//! Paused E2B sandboxes on disk, so they survive a restart of `lockbox serve`: one JSON
//! file per paused sandbox, `STATE/e2b/paused/ID.json` (mode 0600: it holds the sandbox's
//! access token and `envVars`), written when it is paused and removed when it is resumed
//! or killed. [`load`] reads them back when the E2B layer starts.
//!
//! Running sandboxes are not kept: their processes die with the server (lockbox deletes
//! its sandboxes as it stops), so there would be nothing to connect to.

use crate::registry::E2bSandbox;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The version of [`Record`]'s layout; a file of another version is skipped.
const VERSION: u32 = 1;

/// Why a paused sandbox could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Writing or removing its file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The sandbox is not paused (only paused ones are kept).
    #[error("sandbox {0} is not paused")]
    NotPaused(String),
}

/// What is kept of a paused sandbox: its [`E2bSandbox`] less what only a running one has
/// (its instance, timer, lock).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    version: u32,
    id: String,
    template: String,
    metadata: BTreeMap<String, String>,
    access_token: Option<String>,
    env: HashMap<String, String>,
    started_at: SystemTime,
    end_at: SystemTime,
    internet: bool,
    auto_pause: bool,
    /// The snapshot it resumes from.
    paused: String,
    owned_snapshots: Vec<String>,
    events: Vec<(SystemTime, String)>,
}

/// `STATE/e2b/paused`.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("e2b").join("paused")
}

/// Whether `id` can name a file (lockbox ids can; anything else is never written).
fn file_name_ok(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PersistError + '_ {
    move |source| PersistError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes paused sandbox `id` atomically (a temporary file, fsync, rename, fsync of the
/// directory): a crash leaves the old file or the new one, never half of one.
pub fn save(state_dir: &Path, id: &str, sandbox: &E2bSandbox) -> Result<(), PersistError> {
    let Some(paused) = sandbox.paused.clone() else {
        return Err(PersistError::NotPaused(id.to_owned()));
    };
    if !file_name_ok(id) {
        return Err(PersistError::Io {
            path: dir(state_dir),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a sandbox id"),
        });
    }
    let events = sandbox
        .events
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let record = Record {
        version: VERSION,
        id: id.to_owned(),
        template: sandbox.template.clone(),
        metadata: sandbox.metadata.clone(),
        access_token: sandbox.access_token.clone(),
        env: sandbox.env.clone(),
        started_at: sandbox.started_at,
        end_at: sandbox.end_at,
        internet: sandbox.internet,
        auto_pause: sandbox.auto_pause,
        paused,
        owned_snapshots: sandbox.owned_snapshots.clone(),
        events,
    };
    let dir = dir(state_dir);
    // Only the server's user may read the tokens below.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io(&dir))?;
    let path = dir.join(format!("{id}.json"));
    let tmp = dir.join(format!(".{id}.json.tmp"));
    let text = serde_json::to_vec_pretty(&record)
        .map_err(|e| io(&path)(std::io::Error::other(e.to_string())))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp))?;
    file.write_all(&text).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io(&dir))?;
    Ok(())
}

/// Removes the file of `id` (resumed or killed); none is fine.
pub fn forget(state_dir: &Path, id: &str) -> Result<(), PersistError> {
    if !file_name_ok(id) {
        return Ok(());
    }
    let path = dir(state_dir).join(format!("{id}.json"));
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&path)(e)),
    }
}

/// Keeps E2B sandbox `id` as it is now: its file written if it is paused, removed if not.
/// A failure is logged, not returned: the call that changed the sandbox succeeded, only
/// surviving a restart is lost (said in the warning).
pub(crate) fn keep(state_dir: &Path, id: &str, sandbox: &E2bSandbox) {
    let kept = match sandbox.paused {
        Some(_) => save(state_dir, id, sandbox),
        None => forget(state_dir, id),
    };
    if let Err(e) = kept {
        tracing::warn!(sandbox = %id, "keeping a paused E2B sandbox across restarts: {e}");
    }
}

/// Removes the file of `id` if any, logging a failure (see [`keep`]).
pub(crate) fn drop_kept(state_dir: &Path, id: &str) {
    if let Err(e) = forget(state_dir, id) {
        tracing::warn!(sandbox = %id, "removing a paused E2B sandbox's file: {e}");
    }
}

/// The sandbox one file holds, or why not.
fn read(path: &Path) -> Result<(String, E2bSandbox), String> {
    let text = std::fs::read(path).map_err(|e| e.to_string())?;
    let record: Record = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    if record.version != VERSION {
        return Err(format!(
            "layout version {} is not {VERSION}",
            record.version
        ));
    }
    let expected = path.file_stem().and_then(|s| s.to_str());
    if expected != Some(record.id.as_str()) || !file_name_ok(&record.id) {
        return Err(format!("it names sandbox {:?}", record.id));
    }
    let sandbox = E2bSandbox {
        template: record.template,
        metadata: record.metadata,
        access_token: record.access_token,
        env: record.env,
        started_at: record.started_at,
        end_at: record.end_at,
        internet: record.internet,
        paused: Some(record.paused),
        auto_pause: record.auto_pause,
        owned_snapshots: record.owned_snapshots,
        events: std::sync::Arc::new(std::sync::Mutex::new(record.events)),
        ..E2bSandbox::default()
    };
    Ok((record.id, sandbox))
}

/// The paused sandboxes kept in `STATE/e2b/paused` whose pause snapshot still exists
/// (`exists` says so; a file whose snapshot is gone is removed). A file that cannot be read
/// is skipped with a warning and left for the user to look at: one bad file never stops
/// the server.
pub fn load(
    state_dir: &Path,
    exists: impl Fn(&str) -> Result<bool, String>,
) -> Vec<(String, E2bSandbox)> {
    let dir = dir(state_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!("not restoring paused E2B sandboxes: {}: {e}", dir.display());
            return Vec::new();
        }
    };
    let mut loaded = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let (id, sandbox) = match read(&path) {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(
                    "skipping paused E2B sandbox file {} (left in place): {e}",
                    path.display()
                );
                continue;
            }
        };
        let snapshot = sandbox.paused.clone().unwrap_or_default();
        match exists(&snapshot) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(sandbox = %id, %snapshot, "forgetting a paused E2B sandbox: its snapshot was deleted");
                if let Err(e) = forget(state_dir, &id) {
                    tracing::warn!(sandbox = %id, "{e}");
                }
                continue;
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, %snapshot, "skipping a paused E2B sandbox: its snapshot: {e}");
                continue;
            }
        }
        sandbox.log("restored as paused after a server restart");
        loaded.push((id, sandbox));
    }
    loaded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paused_sandbox() -> E2bSandbox {
        let s = E2bSandbox {
            template: "base".into(),
            metadata: BTreeMap::from([("k".into(), "v".into())]),
            access_token: Some("tok".into()),
            env: HashMap::from([("A".into(), "1".into())]),
            paused: Some("snap-1".into()),
            owned_snapshots: vec!["snap-0".into(), "snap-1".into()],
            auto_pause: true,
            ..E2bSandbox::default()
        };
        s.log("paused");
        s
    }

    #[test]
    fn a_saved_paused_sandbox_loads_back_and_a_bad_file_is_skipped() {
        let state = lockbox_testkit::sandboxes::scratch();
        save(state.path(), "sb-1", &paused_sandbox()).unwrap();
        let file = dir(state.path()).join("sb-1.json");
        let mode = std::fs::metadata(&file).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        std::fs::write(dir(state.path()).join("bad.json"), b"[").unwrap();
        // A file whose name is not the id it holds is not trusted.
        std::fs::copy(&file, dir(state.path()).join("other.json")).unwrap();

        let loaded = load(state.path(), |_| Ok(true));
        assert_eq!(loaded.len(), 1);
        let (id, s) = &loaded[0];
        assert_eq!(id, "sb-1");
        assert_eq!(s.paused.as_deref(), Some("snap-1"));
        assert_eq!(s.metadata["k"], "v");
        assert_eq!(s.env["A"], "1");
        assert_eq!(s.access_token.as_deref(), Some("tok"));
        assert_eq!(s.owned_snapshots, ["snap-0", "snap-1"]);
        assert!(s.auto_pause && s.instance.is_none());
        assert!(dir(state.path()).join("bad.json").exists());

        // Its snapshot gone: forgotten, file and all.
        assert!(load(state.path(), |_| Ok(false)).is_empty());
        assert!(!file.exists());
    }

    #[test]
    fn only_a_paused_sandbox_is_saved() {
        let state = lockbox_testkit::sandboxes::scratch();
        let running = E2bSandbox::default();
        assert!(matches!(
            save(state.path(), "sb-1", &running),
            Err(PersistError::NotPaused(_))
        ));
        forget(state.path(), "sb-1").unwrap();
        assert!(load(state.path(), |_| Ok(true)).is_empty());
    }
}
