//! A template's start and ready commands (`set_start_cmd`, `set_ready_cmd`; `startCmd` and
//! `readyCmd` of the build request). E2B runs them while it builds and snapshots the
//! template with the start command running; lockbox has no memory snapshots, so it runs
//! them as each sandbox of the template starts: the start command as a background process
//! (`/bin/sh -c`, in the image's working directory), then the ready command every
//! [`READY_EVERY`] until it exits 0, for at most [`READY_BOUND`] (or the sandbox's timeout,
//! if shorter). The create answers only then; if the ready command never succeeds, the
//! sandbox is deleted and the create fails.
//!
//! The commands are kept beside the image store, one file per template tag
//! (`e2b/start/NAME:TAG.json`), with the image id they were built with: a tag moved to
//! another image (rebuilt elsewhere, retagged) no longer has them.

use crate::{E2b, E2bError};
use axum::http::StatusCode;
use lockbox_runtime::{ProcessCommand, ProcessSpec, ProcessState, Sandbox};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest a create waits for the ready command (under the SDK's 60 s request timeout).
pub const READY_BOUND: Duration = Duration::from_secs(50);
/// The pause between two runs of the ready command.
pub const READY_EVERY: Duration = Duration::from_millis(100);

/// What a template tag starts with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartCmds {
    /// The image the tag named when it was built.
    pub image: String,
    /// Run in the background as the sandbox starts.
    pub start: Option<String>,
    /// Run until it exits 0 before the create answers.
    pub ready: Option<String>,
}

fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("e2b").join("start")
}

/// The file of `name` (`id:tag`): `/` (a path in an image name) escaped.
fn file(state_dir: &Path, name: &str) -> PathBuf {
    let escaped = name.replace('%', "%25").replace('/', "%2F");
    dir(state_dir).join(format!("{escaped}.json"))
}

/// Records `cmds` for each of `names` (`id:tag`), or forgets what they had when `cmds` has
/// neither command (a rebuild without them).
pub fn record(state_dir: &Path, names: &[String], cmds: &StartCmds) -> std::io::Result<()> {
    if cmds.start.is_none() && cmds.ready.is_none() {
        for name in names {
            match std::fs::remove_file(file(state_dir, name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        return Ok(());
    }
    std::fs::create_dir_all(dir(state_dir))?;
    let text = serde_json::to_vec(cmds).map_err(std::io::Error::other)?;
    for name in names {
        let path = file(state_dir, name);
        let part = path.with_extension("part");
        std::fs::write(&part, &text)?;
        std::fs::rename(&part, &path)?;
    }
    Ok(())
}

/// The recorded start commands of `name` (`id:tag`) as their file holds them (JSON), if any.
pub(crate) fn raw(state_dir: &Path, name: &str) -> Option<Vec<u8>> {
    std::fs::read(file(state_dir, name)).ok()
}

/// What template `template` (`id[:tag]`) starts with and the image's working directory,
/// if it was built here with a start or ready command and its tag still names that image.
fn lookup(e2b: &E2b, template: &str) -> Option<(StartCmds, Option<String>)> {
    let (id, tag) = crate::templates::split_name(template);
    let name = format!("{id}:{}", tag.as_deref().unwrap_or("latest"));
    let state_dir = e2b.runtime.state_dir();
    let text = std::fs::read(file(&state_dir, &name)).ok()?;
    let cmds: StartCmds = serde_json::from_slice(&text).ok()?;
    let store = lockbox_image::Store::in_state_dir(&state_dir).ok()?;
    let image = store.get(&name).ok()??;
    (image.id == cmds.image).then_some((cmds, image.config.working_dir.filter(|d| !d.is_empty())))
}

/// Runs template `template`'s start and ready commands in its new sandbox `sandbox` (not yet
/// known to E2B), waiting at most `life` (the sandbox's timeout) or [`READY_BOUND`]. On
/// failure the sandbox is deleted and the error says why. Nothing for other templates.
pub(crate) async fn start(
    e2b: &E2b,
    template: &str,
    sandbox: &str,
    life: Duration,
) -> Result<(), E2bError> {
    let Some((cmds, cwd)) = lookup(e2b, template) else {
        return Ok(());
    };
    // A create given up on by its caller (its future dropped) leaves nothing running either.
    let mut guard = DeleteOnDrop {
        e2b: Some(e2b.clone()),
        sandbox: sandbox.to_owned(),
    };
    let outcome = match e2b.runtime.sandbox(sandbox) {
        Ok(handle) => run(&handle, &cmds, cwd, life.min(READY_BOUND)).await,
        Err(e) => Err(format!("its sandbox: {e}")),
    };
    guard.e2b = None;
    let Err(why) = outcome else {
        return Ok(());
    };
    // Deleted before the create answers: nothing of it is left running.
    if let Err(e) = e2b.runtime.delete_sandbox(sandbox).await {
        tracing::warn!(sandbox = %sandbox, "deleting a sandbox whose template did not start: {e}");
    }
    Err(E2bError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("template \"{template}\": {why}; the sandbox was deleted"),
    ))
}

/// Deletes the sandbox when dropped while `e2b` is set (the create's future was dropped
/// while it waited for the ready command).
struct DeleteOnDrop {
    e2b: Option<E2b>,
    sandbox: String,
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let (Some(e2b), Ok(rt)) = (self.e2b.take(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        let id = std::mem::take(&mut self.sandbox);
        rt.spawn(async move {
            if let Err(e) = e2b.runtime.delete_sandbox(&id).await {
                tracing::warn!(sandbox = %id, "deleting a sandbox whose create was given up: {e}");
            }
        });
    }
}

/// `/bin/sh -c script` in `cwd`, its stdin `/dev/null`.
fn shell(script: &str, cwd: &Option<String>) -> ProcessSpec {
    ProcessSpec {
        command: ProcessCommand::Argv(vec!["/bin/sh".into(), "-c".into(), script.into()]),
        cwd: cwd.clone(),
        env: Default::default(),
        pty: None,
        log_bytes: None,
        stdin: false,
    }
}

/// Starts `cmds.start` and waits for `cmds.ready` for at most `bound`: Err(why) if it
/// never succeeded.
async fn run(
    sb: &Sandbox,
    cmds: &StartCmds,
    cwd: Option<String>,
    bound: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + bound;
    let started = match &cmds.start {
        Some(start) => Some(
            sb.start_process(shell(start, &cwd))
                .await
                .map_err(|e| format!("its start command could not be started: {e}"))?,
        ),
        None => None,
    };
    let Some(ready) = &cmds.ready else {
        return Ok(());
    };
    let mut last = String::from("it never ran");
    let mut finished = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match once(sb, ready, &cwd, left).await {
            Ok(Some(0)) => return Ok(()),
            Ok(Some(code)) => {
                last = format!("its last run exited with {code}");
                finished = true;
            }
            // A run cut by the bound says less than the last one that finished.
            Ok(None) if finished => {}
            Ok(None) => last = "its run was still running at the bound".into(),
            Err(e) => last = format!("its last run could not start: {e}"),
        }
        tokio::time::sleep(READY_EVERY.min(deadline.saturating_duration_since(Instant::now())))
            .await;
    }
    let mut why = format!(
        "its ready command {ready:?} did not exit 0 within {} s ({last})",
        bound.as_secs_f64()
    );
    if let Some(p) = started.and_then(|p| sb.process(p.id.as_str()).ok()) {
        if p.state == ProcessState::Exited {
            why.push_str(&format!(
                "; its start command had exited ({})",
                match (p.exit_code, p.signal) {
                    (Some(c), _) => format!("code {c}"),
                    (None, Some(s)) => format!("signal {s}"),
                    _ => "no status".into(),
                }
            ));
        }
    }
    Err(why)
}

/// One run of the ready command, killed after `bound`: its exit code, `None` if killed
/// at the bound (or by a signal).
async fn once(
    sb: &Sandbox,
    ready: &str,
    cwd: &Option<String>,
    bound: Duration,
) -> Result<Option<i32>, lockbox_runtime::RuntimeError> {
    let deadline = Instant::now() + bound;
    let p = sb.start_process(shell(ready, cwd)).await?;
    let id = p.id.as_str().to_owned();
    loop {
        let info = sb.process(&id)?;
        if info.state == ProcessState::Exited {
            return Ok(info.exit_code);
        }
        if Instant::now() >= deadline {
            let _ = sb.kill_process(&id, Duration::ZERO).await;
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebuild_without_commands_forgets_what_each_tag_had() {
        let dir = lockbox_testkit::scratch("lockbox-e2b-start-");
        let names = vec!["team/app:latest".to_owned(), "team/app:b1".to_owned()];
        let cmds = StartCmds {
            image: "sha256:1".into(),
            start: Some("sleep 600".into()),
            ready: Some("true".into()),
        };
        record(dir.path(), &names, &cmds).unwrap_or_else(|e| panic!("{e}"));
        let kept = std::fs::read(file(dir.path(), "team/app:latest")).unwrap_or_default();
        assert_eq!(serde_json::from_slice::<StartCmds>(&kept).ok(), Some(cmds));
        // `/` in an image name is escaped: one file per tag, in the one directory.
        assert!(dir.path().join("e2b/start/team%2Fapp:b1.json").exists());

        let none = StartCmds {
            image: "sha256:2".into(),
            ..StartCmds::default()
        };
        record(dir.path(), &names, &none).unwrap_or_else(|e| panic!("{e}"));
        assert!(!file(dir.path(), "team/app:latest").exists());
        assert!(!file(dir.path(), "team/app:b1").exists());
    }
}
