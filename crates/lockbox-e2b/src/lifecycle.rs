//! Pause, resume, fork and snapshots of E2B sandboxes, on lockbox's snapshots.
//!
//! lockbox snapshots a sandbox's **files** (its branch, and here its `/tmp`, the E2B home),
//! never its processes' memory. So:
//! - **pause** takes a snapshot and deletes the lockbox sandbox: a paused sandbox holds no
//!   processes; **resume** (or `connect`) starts a fork of that snapshot, which keeps the
//!   E2B id (the registry maps it to the new lockbox sandbox, [`E2bSandbox::instance`]) and
//!   finds its files, not its processes;
//! - **fork** snapshots a running sandbox (it goes on) and starts `count` forks of it;
//! - **snapshots** (`create_snapshot`) are lockbox snapshots that `Sandbox.create` takes as a
//!   template, by id or name; the SDK deletes them as templates (`DELETE /templates/{id}`).
//!
//! Asking for memory (`memory: true`: the SDK's `mode="full"`) is a 400 naming the field;
//! the SDK's default leaves it out and gets the files-only snapshot.

use crate::control::{bad, created, known, not_found, runtime_error, timeout_or, Body};
use crate::registry::{E2bSandbox, E2bSnapshot};
use crate::{E2b, E2bError};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lockbox_runtime::{RuntimeError, SnapshotInfo, SnapshotOptions};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime};

/// The timeout of a resumed or forked sandbox when the request gives none (E2B's
/// `ResumedSandbox` and `SandboxForkRequest` default).
pub const RESUME_TIMEOUT: Duration = Duration::from_secs(15);
/// The most forks one request makes (E2B's `SandboxForkRequest.count` maximum).
pub const MAX_FORKS: i64 = 100;

/// A 400 for `field: true`, which asks for memory lockbox does not keep.
fn no_memory(field: &str) -> E2bError {
    bad(format!(
        "{field}: lockbox snapshots keep a sandbox's files, not its memory (its processes end); leave {field} out or use mode \"filesystem\""
    ))
}

fn conflict(message: impl Into<String>) -> E2bError {
    E2bError::new(StatusCode::CONFLICT, message)
}

/// A snapshot of the files of E2B sandbox `id` (which must run): its branch and `/tmp`.
async fn take(
    e2b: &E2b,
    id: &str,
    sandbox: &E2bSandbox,
    name: String,
) -> Result<SnapshotInfo, E2bError> {
    let handle = e2b
        .runtime
        .sandbox(sandbox.instance_id(id))
        .map_err(|_| not_found(id))?;
    handle
        .snapshot_with(SnapshotOptions {
            name: Some(name),
            include_tmp: true,
        })
        .await
        .map_err(|e| match e {
            RuntimeError::NoWorkdir { .. } => bad(format!(
                "sandbox {id} was not made by E2B's create (it has no workdir): lockbox cannot snapshot it"
            )),
            other => runtime_error(&other),
        })
}

/// Pauses E2B sandbox `id`: snapshots its files, then deletes the lockbox sandbox. 409 if
/// it is paused already. With `generation` (an expiry), only if it is still that one.
pub(crate) async fn pause_now(
    e2b: &E2b,
    id: &str,
    generation: Option<u64>,
) -> Result<(), E2bError> {
    let lifecycle = e2b.registry.get(id).ok_or_else(|| not_found(id))?.lifecycle;
    let _held = lifecycle.lock().await;
    let sandbox = known(e2b, id)?;
    if sandbox.paused.is_some() {
        return Err(conflict(format!("sandbox {id} is already paused")));
    }
    if generation.is_some_and(|g| g != sandbox.generation) {
        return Err(conflict(format!("sandbox {id} was resumed meanwhile")));
    }
    let snapshot = take(e2b, id, &sandbox, format!("e2b pause of {id}")).await?;
    let snapshot = snapshot.id.as_str().to_owned();
    if let Err(e) = e2b.runtime.delete_sandbox(sandbox.instance_id(id)).await {
        tracing::warn!(sandbox = %id, "deleting a paused E2B sandbox's instance: {e}");
    }
    let paused = e2b.registry.update(id, |s| {
        s.paused = Some(snapshot.clone());
        s.owned_snapshots.push(snapshot.clone());
    });
    if let Some(s) = paused {
        s.log(format!("paused (snapshot {snapshot}; its processes ended)"));
        // A paused sandbox outlives the server, as E2B's do.
        e2b.persist(id, &s);
    }
    Ok(())
}

/// Resumes paused E2B sandbox `id`: a fork of its pause snapshot serves it from now on,
/// for `timeout`. 409 if it is not paused.
pub(crate) async fn resume_now(
    e2b: &E2b,
    id: &str,
    timeout: Duration,
) -> Result<E2bSandbox, E2bError> {
    let lifecycle = e2b.registry.get(id).ok_or_else(|| not_found(id))?.lifecycle;
    let _held = lifecycle.lock().await;
    let sandbox = known(e2b, id)?;
    let Some(snapshot) = sandbox.paused.clone() else {
        return Err(conflict(format!("sandbox {id} is already running")));
    };
    let made = e2b
        .runtime
        .fork_snapshot(&snapshot, 1)
        .await
        .map_err(|e| runtime_error(&e))?;
    let instance = made
        .into_iter()
        .next()
        .map(|i| i.id.as_str().to_owned())
        .ok_or_else(|| bad("the paused sandbox's fork was not made"))?;
    let resumed = e2b
        .registry
        .update(id, |s| {
            s.paused = None;
            s.instance = Some(instance.clone());
            s.end_at = SystemTime::now() + timeout;
            s.generation += 1;
        })
        .ok_or_else(|| not_found(id))?;
    resumed.log(format!("resumed (lockbox sandbox {instance})"));
    // Running, it dies with the server: nothing to keep.
    e2b.persist(id, &resumed);
    tokio::spawn(crate::control::expire(
        e2b.clone(),
        id.to_owned(),
        resumed.generation,
    ));
    Ok(resumed)
}

/// `POST /sandboxes/{id}/pause` (E2B's `SandboxPauseRequest`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PauseBody {
    memory: Option<bool>,
    /// The agent answers every call or the sandbox is gone: nothing to require.
    #[allow(dead_code)]
    require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204, 409 if paused already (the SDK's `pause()` then
/// answers `False`), 404 if unknown.
pub(crate) async fn pause(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Body(body): Body<PauseBody>,
) -> Result<StatusCode, E2bError> {
    if body.memory == Some(true) {
        return Err(no_memory("memory"));
    }
    pause_now(&e2b, &id, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume` (E2B's `ResumedSandbox`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResumeBody {
    timeout: Option<i64>,
    auto_pause: Option<bool>,
}

/// `POST /sandboxes/{id}/resume` (deprecated by E2B for `connect`): 201 with the sandbox,
/// 409 if it runs.
pub(crate) async fn resume(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Body(body): Body<ResumeBody>,
) -> Result<Response, E2bError> {
    let timeout = timeout_or("timeout", body.timeout, RESUME_TIMEOUT)?;
    let mut sandbox = resume_now(&e2b, &id, timeout).await?;
    if let Some(auto_pause) = body.auto_pause {
        sandbox = e2b
            .registry
            .update(&id, |s| s.auto_pause = auto_pause)
            .ok_or_else(|| not_found(&id))?;
    }
    Ok((StatusCode::CREATED, Json(created(&id, &sandbox))).into_response())
}

/// `POST /sandboxes/{id}/fork` (E2B's `SandboxForkRequest`).
#[derive(Debug, Deserialize)]
pub(crate) struct ForkBody {
    timeout: Option<i64>,
    count: Option<i64>,
}

/// `POST /sandboxes/{id}/fork`: snapshots the running sandbox (it goes on, its id and end
/// of life unchanged) and starts `count` forks of it, each an E2B sandbox of its own (the
/// source's template, metadata, environment and `autoPause`; its own token). 201 with one
/// result per fork; lockbox makes all of them or none, so a failure is every entry's error.
pub(crate) async fn fork(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Body(body): Body<ForkBody>,
) -> Result<Response, E2bError> {
    let timeout = timeout_or("timeout", body.timeout, RESUME_TIMEOUT)?;
    let count = body.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(bad(format!("count: from 1 to {MAX_FORKS}, got {count}")));
    }
    let count = usize::try_from(count).map_err(|_| bad("count: out of range"))?;
    let source = known(&e2b, &id)?;
    if source.paused.is_some() {
        return Err(conflict(format!(
            "sandbox {id} is paused: connect to it (resume) before forking it"
        )));
    }
    let snapshot = take(&e2b, &id, &source, format!("e2b fork of {id}")).await?;
    let snapshot = snapshot.id.as_str().to_owned();
    // The source and every fork try to delete it as they end: the last one does.
    e2b.registry
        .update(&id, |s| s.owned_snapshots.push(snapshot.clone()));
    let made = match e2b.runtime.fork_snapshot(&snapshot, count).await {
        Ok(made) => made,
        Err(e) => {
            let error = runtime_error(&e);
            let entry = json!({"error": {"code": error.status.as_u16(), "message": error.message}});
            return Ok((StatusCode::CREATED, Json(vec![entry; count])).into_response());
        }
    };
    let mut results = Vec::with_capacity(made.len());
    for info in made {
        let fork_id = info.id.as_str().to_owned();
        let now = SystemTime::now();
        let forked = E2bSandbox {
            template: source.template.clone(),
            metadata: source.metadata.clone(),
            access_token: Some(crate::control::access_token()?),
            env: source.env.clone(),
            started_at: now,
            end_at: now + timeout,
            internet: source.internet,
            auto_pause: source.auto_pause,
            // The snapshot and those the source lies on (its pauses): the last sandbox
            // of them all to end deletes each (one still in use is refused, so kept).
            owned_snapshots: [source.owned_snapshots.clone(), vec![snapshot.clone()]].concat(),
            ..E2bSandbox::default()
        };
        forked.log(format!("forked from sandbox {id} (snapshot {snapshot})"));
        e2b.registry.insert(&fork_id, forked.clone());
        tokio::spawn(crate::control::expire(e2b.clone(), fork_id.clone(), 0));
        results.push(json!({"sandbox": created(&fork_id, &forked)}));
    }
    if let Some(s) = e2b.registry.get(&id) {
        s.log(format!(
            "forked {} time(s) (snapshot {snapshot})",
            results.len()
        ));
    }
    Ok((StatusCode::CREATED, Json(results)).into_response())
}

/// `POST /sandboxes/{id}/snapshots` (E2B's `SandboxSnapshotRequest`).
#[derive(Debug, Deserialize)]
pub(crate) struct SnapshotBody {
    name: Option<String>,
    memory: Option<bool>,
}

/// E2B's `SnapshotInfo` of `s`.
fn snapshot_json(s: &E2bSnapshot) -> Value {
    json!({"snapshotID": s.id, "names": s.name.iter().collect::<Vec<_>>()})
}

/// `POST /sandboxes/{id}/snapshots`: a snapshot of the running sandbox's files (it goes
/// on), kept until deleted; `Sandbox.create(snapshot_id)` (or its name) starts from it.
pub(crate) async fn snapshot(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
    Body(body): Body<SnapshotBody>,
) -> Result<Response, E2bError> {
    if body.memory == Some(true) {
        return Err(no_memory("memory"));
    }
    let name = body.name.filter(|n| !n.is_empty());
    if let Some(n) = &name {
        if crate::control::HOST_TEMPLATES.contains(&n.as_str()) {
            return Err(bad(format!(
                "name: {n:?} is a template of lockbox's; choose another name"
            )));
        }
    }
    let sandbox = known(&e2b, &id)?;
    if sandbox.paused.is_some() {
        return Err(conflict(format!(
            "sandbox {id} is paused: connect to it (resume) before taking a snapshot"
        )));
    }
    let label = name
        .clone()
        .unwrap_or_else(|| format!("e2b snapshot of {id}"));
    let info = take(&e2b, &id, &sandbox, label).await?;
    let taken = E2bSnapshot {
        id: info.id.as_str().to_owned(),
        name,
        sandbox: id.clone(),
    };
    e2b.registry.add_snapshot(taken.clone());
    sandbox.log(format!("snapshot {} taken", taken.id));
    Ok((StatusCode::CREATED, Json(snapshot_json(&taken))).into_response())
}

/// `GET /snapshots` query.
#[derive(Debug, Deserialize)]
pub(crate) struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<String>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// `GET /snapshots`: the snapshots taken through E2B (and not deleted), oldest first,
/// filtered by `sandboxID` and `name` (a name or an id), paged by `limit` (1–100) and
/// `nextToken` (`x-next-token`).
pub(crate) async fn list_snapshots(
    State(e2b): State<E2b>,
    Query(query): Query<SnapshotQuery>,
) -> Result<Response, E2bError> {
    let limit = match query.limit.as_deref() {
        None | Some("") => crate::control::MAX_PAGE,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=crate::control::MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(bad(format!(
                    "limit: a number from 1 to {}, got {text:?}",
                    crate::control::MAX_PAGE
                )))
            }
        },
    };
    let name = query.name.as_deref().filter(|n| !n.is_empty());
    let sandbox = query.sandbox_id.as_deref().filter(|n| !n.is_empty());
    let all: Vec<(usize, E2bSnapshot)> = e2b
        .registry
        .snapshots()
        .into_iter()
        .enumerate()
        .filter(|(_, s)| sandbox.is_none_or(|id| s.sandbox == id))
        .filter(|(_, s)| name.is_none_or(|n| s.id == n || s.name.as_deref() == Some(n)))
        // Deleted through lockbox's own API meanwhile: gone here too.
        .filter(|(_, s)| e2b.runtime.snapshot_info(&s.id).is_ok())
        .collect();
    let after = match query.next_token.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(
            t.parse::<usize>()
                .map_err(|_| bad(format!("nextToken: {t:?} is not one this server gave")))?,
        ),
    };
    let rest: Vec<_> = all
        .iter()
        .filter(|(i, _)| after.is_none_or(|a| *i > a))
        .collect();
    let page = &rest[..rest.len().min(limit)];
    let mut headers = HeaderMap::new();
    if rest.len() > limit {
        if let Some((i, _)) = page.last() {
            if let Ok(v) = HeaderValue::from_str(&i.to_string()) {
                headers.insert("x-next-token", v);
            }
        }
    }
    let body: Vec<Value> = page.iter().map(|(_, s)| snapshot_json(s)).collect();
    Ok((headers, Json(body)).into_response())
}

/// `DELETE /templates/{id}`, which the SDK's `Sandbox.delete_snapshot` sends: deletes a
/// snapshot (204; 404 if there is none of that id, 409 while sandboxes lie on it or it is
/// an E2B sandbox's own: its pause, a fork's source).
/// Deleting an image template is not supported (501).
pub(crate) async fn delete_snapshot(
    State(e2b): State<E2b>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    if lockbox_runtime::SnapshotId::parse(&id).is_err() {
        return Err(E2bError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("DELETE /templates/{id}: deleting templates is not supported by lockbox's E2B API (lockbox image rm deletes an image); snapshots are deleted here"),
        ));
    }
    // A paused sandbox's snapshot (or a fork's source) goes with its sandbox, not before.
    if let Some((owner, _)) = e2b
        .registry
        .all()
        .into_iter()
        .find(|(_, s)| s.owned_snapshots.contains(&id))
    {
        return Err(conflict(format!(
            "snapshot {id} belongs to E2B sandbox {owner} (its pause or fork): it is deleted with that sandbox"
        )));
    }
    let deleted = e2b.runtime.delete_snapshot(&id).await;
    if e2b.runtime.snapshot_info(&id).is_err() {
        e2b.registry.remove_snapshot(&id);
    }
    deleted.map_err(|e| runtime_error(&e))?;
    Ok(StatusCode::NO_CONTENT)
}
