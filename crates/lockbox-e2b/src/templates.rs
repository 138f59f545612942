//! E2B templates as lockbox images: the SDK's `Template` (`from_image`, `from_dockerfile`,
//! `copy`, `run_cmd`, `apt_install`, `pip_install`, `set_envs`, `set_workdir`, ...) turns its
//! steps into build requests on the client; here they become one Dockerfile built by
//! [`lockbox_image::build`] into the server's image store, tagged with the template's name.
//! A sandbox created with that name (`Sandbox.create("name")`) runs on the image.
//!
//! The SDK's calls, in order:
//! 1. `POST /v3/templates` `{name, tags}` → `{templateID, buildID, names, tags, aliases}`;
//! 2. for each `copy`, `GET /templates/{id}/files/{hash}` → `{present, url}`, and if not
//!    present a `PUT` of the files' tar (gzip or not) to `url` (a one-time upload URL on this
//!    server: the SDK sends no API key with it);
//! 3. `POST /v2/templates/{id}/builds/{buildID}` `{fromImage | fromTemplate, steps, force}`:
//!    the build starts (202);
//! 4. `GET /templates/{id}/builds/{buildID}/status?logsOffset=N` until `ready` or `error`
//!    (with the failing step's number, which the SDK maps to the caller's source line).
//!
//! Differences from E2B (docs/e2b.md): `set_envs` values are build-time only, as in E2B:
//! exported to the later `RUN` steps, not kept in the image; `set_user` and a step's user are recorded, not switched (an image
//! sandbox's processes have one uid); `set_start_cmd`/`set_ready_cmd` run as each sandbox
//! of the template starts ([`crate::template_start`]); `fromTemplate` takes another template built here; E2B's `base` image
//! (`e2bdev/base`) is pulled like any other reference.

use crate::{E2b, E2bError};
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;
use tokio::io::AsyncWriteExt;

/// The largest upload of one `copy` step's files.
const MAX_UPLOAD: u64 = 4 << 30;
/// Log entries in one status answer (the SDK reads on until it gets none).
const LOG_PAGE: usize = 100;

#[derive(Clone)]
struct Templates {
    e2b: E2b,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// Template id (its name without tag) → its builds.
    builds: HashMap<String, HashMap<String, Build>>,
    /// Upload token → (template id, files hash).
    uploads: HashMap<String, (String, String)>,
}

struct Build {
    /// The image names the build tags (`name:tag` for each tag).
    names: Vec<String>,
    /// When it was requested (RFC 3339).
    created: String,
    status: &'static str,
    logs: Vec<Value>,
    reason: Option<Value>,
}

impl Templates {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data: a panic elsewhere leaves it usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn dir(&self, sub: &str) -> PathBuf {
        self.e2b.runtime.state_dir().join("e2b").join(sub)
    }
}

/// The template routes. Every route but the upload URL needs the API key.
pub fn router(e2b: E2b) -> Router {
    let state = Templates {
        e2b: e2b.clone(),
        inner: Arc::default(),
    };
    // The same check as the control plane's (X-API-Key, or a bearer token: a fleet's router
    // sends the node's token as one).
    let authed = Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{id}/files/{hash}", get(file_link))
        .route("/v2/templates/{id}/builds/{build}", post(start_build))
        .route("/templates/{id}/builds/{build}/status", get(status))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/{id}/tags", get(tags))
        .layer(axum::middleware::from_fn_with_state(
            e2b.clone(),
            crate::control::require_api_key,
        ));
    // A built template carried to another server (a fleet's router copies it).
    let copies = Router::new()
        .route(
            "/templates/{id}/archive",
            get(crate::template_copies::export).put(crate::template_copies::import),
        )
        .layer(axum::middleware::from_fn_with_state(
            e2b.clone(),
            crate::control::require_api_key,
        ))
        .with_state(e2b.clone());
    Router::new()
        .route("/templates/{id}/files/{hash}/{token}", put(upload))
        .merge(authed)
        .with_state(state)
        .merge(copies)
}

pub(crate) fn random_hex(bytes: usize) -> Result<String, E2bError> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| {
        E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no randomness: {e}"),
        )
    })?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// A version-4 UUID, as E2B's build ids are (the SDK parses them as UUIDs).
fn random_uuid() -> Result<String, E2bError> {
    let h = random_hex(16)?;
    let variant = ["8", "9", "a", "b"][usize::from(h.as_bytes()[16] % 4)];
    Ok(format!(
        "{}-{}-4{}-{variant}{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    ))
}

/// A template's id: its name without a tag (E2B names are `name[:tag]`).
pub(crate) fn split_name(name: &str) -> (String, Option<String>) {
    match name.rsplit_once(':') {
        Some((n, tag)) if !tag.contains('/') => (n.to_owned(), Some(tag.to_owned())),
        _ => (name.to_owned(), None),
    }
}

pub(crate) fn check_name(field: &str, name: &str) -> Result<(), E2bError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        && !name.starts_with(['.', '-', '/']);
    if ok {
        Ok(())
    } else {
        Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("{field} {name:?}: use lowercase letters, digits, '.', '_', '-' and '/' (an image name)"),
        ))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BuildRequest {
    name: String,
    #[serde(default)]
    tags: Vec<String>,
}

async fn request_build(
    State(t): State<Templates>,
    body: Result<Json<BuildRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, E2bError> {
    let Json(req) = body.map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let (id, tag) = split_name(&req.name);
    check_name("name", &id)?;
    let mut tags: Vec<String> = tag.into_iter().chain(req.tags).collect();
    if tags.is_empty() {
        tags.push("latest".to_owned());
    }
    for tag in &tags {
        check_name("tag", tag)?;
    }
    let build_id = random_uuid()?;
    let names: Vec<String> = tags.iter().map(|tag| format!("{id}:{tag}")).collect();
    t.lock().builds.entry(id.clone()).or_default().insert(
        build_id.clone(),
        Build {
            names: names.clone(),
            created: lockbox_policy::time::format(SystemTime::now()),
            status: "waiting",
            logs: Vec::new(),
            reason: None,
        },
    );
    let body = json!({
        "templateID": id, "buildID": build_id, "public": false,
        "names": names, "tags": tags, "aliases": [id],
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

fn upload_path(t: &Templates, hash: &str) -> Result<PathBuf, E2bError> {
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("files hash {hash:?}: expected 64 hex digits"),
        ));
    }
    Ok(t.dir("uploads").join(hash.to_ascii_lowercase()))
}

async fn file_link(
    State(t): State<Templates>,
    Path((id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<(StatusCode, Json<Value>), E2bError> {
    let path = upload_path(&t, &hash)?;
    if path.exists() {
        return Ok((StatusCode::CREATED, Json(json!({"present": true}))));
    }
    let token = random_hex(16)?;
    t.lock()
        .uploads
        .insert(token.clone(), (id.clone(), hash.clone()));
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .filter(|p| *p == "https")
        .unwrap_or("http");
    let url = format!("{scheme}://{host}/templates/{id}/files/{hash}/{token}");
    Ok((
        StatusCode::CREATED,
        Json(json!({"present": false, "url": url})),
    ))
}

async fn upload(
    State(t): State<Templates>,
    Path((id, hash, token)): Path<(String, String, String)>,
    body: Body,
) -> Result<StatusCode, E2bError> {
    let granted = t.lock().uploads.remove(&token);
    if granted != Some((id, hash.clone())) {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            "unknown or used upload URL: ask GET /templates/{id}/files/{hash} for one",
        ));
    }
    let path = upload_path(&t, &hash)?;
    let io = |e: std::io::Error| {
        E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("storing the upload: {e}"),
        )
    };
    let dir = t.dir("uploads");
    tokio::fs::create_dir_all(&dir).await.map_err(io)?;
    let part = dir.join(format!(".{token}.part"));
    let mut file = tokio::fs::File::create(&part).await.map_err(io)?;
    let mut stream = body.into_data_stream();
    let mut size = 0u64;
    let written: Result<(), E2bError> = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                E2bError::new(StatusCode::BAD_REQUEST, format!("reading the upload: {e}"))
            })?;
            size += chunk.len() as u64;
            if size > MAX_UPLOAD {
                return Err(E2bError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the upload is larger than {MAX_UPLOAD} bytes"),
                ));
            }
            file.write_all(&chunk).await.map_err(io)?;
        }
        file.sync_all().await.map_err(io)
    }
    .await;
    if let Err(e) = written {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(e);
    }
    tokio::fs::rename(&part, &path).await.map_err(io)?;
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartBuild {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<Value>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    steps: Vec<TemplateStep>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TemplateStep {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    force: Option<bool>,
    files_hash: Option<String>,
}

/// The Dockerfile of a template's steps, and for each of its lines the SDK's step number
/// (0 is the base; step N is the N-th instruction), for errors.
struct Plan {
    dockerfile: String,
    line_step: Vec<usize>,
    hashes: Vec<String>,
    no_cache: bool,
    notes: Vec<String>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

fn json_array(items: &[&str]) -> String {
    serde_json::to_string(items).unwrap_or_default()
}

fn plan(t: &Templates, start: &StartBuild) -> Result<Plan, E2bError> {
    let bad = |m: String| E2bError::new(StatusCode::BAD_REQUEST, m);
    for (field, cmd) in [
        ("startCmd", &start.start_cmd),
        ("readyCmd", &start.ready_cmd),
    ] {
        if cmd.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err(bad(format!("{field}: empty (leave it out)")));
        }
    }
    if start.from_image_registry.is_some() {
        return Err(bad("fromImageRegistry: give registry credentials to lockbox serve (~/.docker/config.json or $REGISTRY_AUTH_FILE), not to the template".into()));
    }
    let base = match (&start.from_image, &start.from_template) {
        (Some(image), None) => image.clone(),
        (None, Some(template)) => {
            let (id, tag) = split_name(template);
            format!("{id}:{}", tag.as_deref().unwrap_or("latest"))
        }
        _ => return Err(bad("give exactly one of fromImage and fromTemplate".into())),
    };
    let mut df = vec![format!("FROM {base}")];
    let mut line_step = vec![0];
    let mut hashes = Vec::new();
    let mut notes = Vec::new();
    let mut no_cache = start.force;
    let mut build_env: Vec<String> = Vec::new();
    for (i, step) in start.steps.iter().enumerate() {
        let n = i + 1;
        no_cache |= step.force.unwrap_or(false);
        let arg = |k: usize| step.args.get(k).map(String::as_str).unwrap_or("");
        let line = match step.kind.as_str() {
            "RUN" => {
                if !arg(1).is_empty() {
                    notes.push(format!("step {n}: RUN as {:?}: lockbox runs every step as the image's uid 0 (one uid per sandbox)", arg(1)));
                }
                let script = format!("{}{}", build_env.concat(), arg(0));
                format!("RUN {}", json_array(&["/bin/sh", "-c", &script]))
            }
            "COPY" => {
                let hash = step
                    .files_hash
                    .clone()
                    .ok_or_else(|| bad(format!("step {n}: COPY without filesHash")))?;
                let path = upload_path(t, &hash)?;
                if !path.exists() {
                    return Err(bad(format!(
                        "step {n}: COPY {}: its files ({hash}) were not uploaded",
                        arg(0)
                    )));
                }
                hashes.push(hash.clone());
                let src = arg(0).trim_start_matches("./");
                let glob = src.contains(['*', '?', '[']);
                let from = if glob || src.is_empty() || src == "." {
                    format!("{hash}/")
                } else {
                    format!("{hash}/{src}")
                };
                let mode = arg(3);
                let chmod = if mode.is_empty() {
                    String::new()
                } else {
                    format!("--chmod={mode} ")
                };
                format!("COPY {chmod}{}", json_array(&[&from, arg(1)]))
            }
            "ENV" => {
                // Build-time only, as in E2B: exported to the RUN steps after it, not kept
                // in the image's config.
                for kv in step.args.chunks(2) {
                    let (k, v) = (&kv[0], kv.get(1).map(String::as_str).unwrap_or(""));
                    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                        return Err(bad(format!(
                            "step {n}: ENV name {k:?}: letters, digits and _ only"
                        )));
                    }
                    build_env.push(format!("export {k}='{}'; ", v.replace('\'', "'\\''")));
                }
                continue;
            }
            "WORKDIR" => format!("WORKDIR {}", arg(0)),
            "USER" => {
                notes.push(format!(
                    "step {n}: USER {}: recorded, not switched (one uid per sandbox)",
                    arg(0)
                ));
                continue;
            }
            other => {
                return Err(bad(format!(
                    "step {n}: unknown instruction {other:?} (RUN, COPY, ENV, WORKDIR, USER)"
                )))
            }
        };
        if line.contains('\n') && !line.starts_with("RUN [") && !line.starts_with("COPY") {
            return Err(bad(format!("step {n}: a value with a line break")));
        }
        df.push(line);
        line_step.push(n);
    }
    Ok(Plan {
        dockerfile: df.join("\n") + "\n",
        line_step,
        hashes,
        no_cache,
        notes,
        start_cmd: start.start_cmd.clone(),
        ready_cmd: start.ready_cmd.clone(),
    })
}

fn log_entry(level: &str, message: &str, step: Option<usize>) -> Value {
    let ts = lockbox_policy::time::format(SystemTime::now());
    let mut v = json!({"timestamp": ts, "level": level, "message": message});
    if let Some(s) = step {
        v["step"] = json!(s.to_string());
    }
    v
}

async fn start_build(
    State(t): State<Templates>,
    Path((id, build_id)): Path<(String, String)>,
    body: Result<Json<StartBuild>, axum::extract::rejection::JsonRejection>,
) -> Result<StatusCode, E2bError> {
    let Json(start) = body.map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let names = {
        let inner = t.lock();
        let build = inner
            .builds
            .get(&id)
            .and_then(|b| b.get(&build_id))
            .ok_or_else(|| {
                E2bError::new(
                    StatusCode::NOT_FOUND,
                    format!("template {id} has no build {build_id}"),
                )
            })?;
        if build.status != "waiting" {
            return Err(E2bError::new(
                StatusCode::CONFLICT,
                format!("build {build_id} was started already"),
            ));
        }
        build.names.clone()
    };
    let plan = plan(&t, &start)?;
    set(&t, &id, &build_id, |b| {
        b.status = "building";
        for note in &plan.notes {
            b.logs.push(log_entry("warn", note, None));
        }
    });
    let t2 = t.clone();
    tokio::task::spawn_blocking(move || {
        let outcome = run_build(&t2, &id, &build_id, &names, &plan);
        set(&t2, &id, &build_id, |b| match outcome {
            Ok(line) => {
                b.logs.push(log_entry("info", &line, None));
                b.status = "ready";
            }
            Err((message, step)) => {
                b.logs.push(log_entry("error", &message, step));
                let mut reason = json!({"message": message});
                if let Some(s) = step {
                    reason["step"] = json!(s.to_string());
                }
                b.reason = Some(reason);
                b.status = "error";
            }
        });
    });
    Ok(StatusCode::ACCEPTED)
}

fn set(t: &Templates, id: &str, build_id: &str, f: impl FnOnce(&mut Build)) {
    if let Some(b) = t
        .lock()
        .builds
        .get_mut(id)
        .and_then(|b| b.get_mut(build_id))
    {
        f(b);
    }
}

/// Builds `plan` (on this blocking thread, with a runtime of its own: a build's future is
/// not `Send`); Ok(the last log line) or Err((message, the SDK's step number)).
fn run_build(
    t: &Templates,
    id: &str,
    build_id: &str,
    names: &[String],
    plan: &Plan,
) -> Result<String, (String, Option<usize>)> {
    let fail = |m: String| (m, None);
    let context = t.dir("contexts").join(build_id);
    let result = (|| {
        std::fs::create_dir_all(&context).map_err(|e| fail(format!("build context: {e}")))?;
        for hash in &plan.hashes {
            let dest = context.join(hash);
            if dest.exists() {
                continue;
            }
            let src = upload_path(t, hash).map_err(|e| fail(e.message))?;
            unpack_upload(&src, &dest).map_err(|e| fail(format!("files {hash}: {e}")))?;
        }
        let store = lockbox_image::Store::in_state_dir(&t.e2b.runtime.state_dir())
            .map_err(|e| fail(e.to_string()))?;
        let opts = lockbox_image::build::BuildOptions {
            context: context.clone(),
            dockerfile: plan.dockerfile.clone(),
            // Also NAME:BUILD_ID: clients pin a build by creating from `name:buildID`
            // (Harbor's E2B environment does).
            tags: names
                .iter()
                .cloned()
                .chain(std::iter::once(format!("{id}:{build_id}")))
                .collect(),
            no_cache: plan.no_cache,
            policy: lockbox_policy::Policy {
                net: lockbox_policy::Net::Host,
                ..lockbox_policy::Policy::default()
            },
            ..Default::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail(format!("build runtime: {e}")))?;
        let mut step = 0;
        let report = rt.block_on(lockbox_image::build::build(&store, &opts, &mut |line| {
            if let Some(n) = line
                .strip_prefix("STEP ")
                .and_then(|r| r.split_once('/'))
                .and_then(|(n, _)| n.parse::<usize>().ok())
            {
                step = plan.line_step.get(n - 1).copied().unwrap_or(step);
            }
            set(t, id, build_id, |b| {
                b.logs.push(log_entry("info", line, Some(step)))
            });
        }));
        let r = report.map_err(|e| {
            let step = match &e {
                lockbox_image::build::BuildError::RunFailed { line, .. }
                | lockbox_image::build::BuildError::Step { line, .. }
                | lockbox_image::build::BuildError::Sandbox { line, .. } => {
                    plan.line_step.get(line.saturating_sub(1)).copied()
                }
                _ => None,
            };
            (e.to_string(), step)
        })?;
        // What every sandbox of the template starts with (or, rebuilt without, no longer).
        let cmds = crate::template_start::StartCmds {
            image: r.image.id.clone(),
            start: plan.start_cmd.clone(),
            ready: plan.ready_cmd.clone(),
        };
        let mut all = names.to_vec();
        all.push(format!("{id}:{build_id}"));
        crate::template_start::record(&t.e2b.runtime.state_dir(), &all, &cmds)
            .map_err(|e| fail(format!("recording its start and ready commands: {e}")))?;
        Ok(format!(
            "built {} as {} ({} of {} layer steps cached)",
            r.image.id,
            names.join(", "),
            r.cached,
            r.layer_steps
        ))
    })();
    let _ = std::fs::remove_dir_all(&context);
    result
}

/// Unpacks an uploaded tar (gzip or plain) into `dest`: regular files, directories and
/// symlinks, every path kept beneath `dest` (the tar crate refuses `..` and absolute names).
fn unpack_upload(src: &std::path::Path, dest: &std::path::Path) -> std::io::Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(src)?;
    let mut magic = [0u8; 2];
    let gz = file.read(&mut magic)? == 2 && magic == [0x1f, 0x8b];
    let file = std::fs::File::open(src)?;
    let reader: Box<dyn Read> = if gz {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let part = dest.with_extension("part");
    let _ = std::fs::remove_dir_all(&part);
    std::fs::create_dir_all(&part)?;
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        if kind.is_file() || kind.is_dir() || kind.is_symlink() {
            entry.unpack_in(&part)?;
        }
    }
    std::fs::rename(&part, dest)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusQuery {
    #[serde(default)]
    logs_offset: usize,
}

async fn status(
    State(t): State<Templates>,
    Path((id, build_id)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Result<Json<Value>, E2bError> {
    let inner = t.lock();
    let b = inner
        .builds
        .get(&id)
        .and_then(|b| b.get(&build_id))
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("template {id} has no build {build_id}"),
            )
        })?;
    let entries: Vec<Value> = b
        .logs
        .iter()
        .skip(q.logs_offset)
        .take(LOG_PAGE)
        .cloned()
        .collect();
    let logs: Vec<Value> = entries.iter().map(|e| e["message"].clone()).collect();
    let mut body = json!({
        "templateID": id, "buildID": build_id, "status": b.status,
        "logs": logs, "logEntries": entries,
    });
    if let Some(r) = &b.reason {
        body["reason"] = r.clone();
    }
    Ok(Json(body))
}

/// The tags of a template's builds here, newest first (404 for a name never built here).
async fn tags(State(t): State<Templates>, Path(id): Path<String>) -> Result<Json<Value>, E2bError> {
    let inner = t.lock();
    let builds = inner
        .builds
        .get(&id)
        .ok_or_else(|| E2bError::new(StatusCode::NOT_FOUND, format!("template {id} not found")))?;
    let mut all: Vec<(&String, &String, &Build)> = builds
        .iter()
        .flat_map(|(bid, b)| b.names.iter().map(move |n| (n, bid, b)))
        .collect();
    all.sort_by(|a, b| b.2.created.cmp(&a.2.created));
    let list: Vec<Value> = all
        .into_iter()
        .filter_map(|(name, bid, b)| {
            let tag = name.rsplit_once(':')?.1;
            Some(json!({"tag": tag, "buildID": bid, "createdAt": b.created}))
        })
        .collect();
    Ok(Json(Value::Array(list)))
}

async fn alias(
    State(t): State<Templates>,
    Path(alias): Path<String>,
) -> Result<Json<Value>, E2bError> {
    let (id, tag) = split_name(&alias);
    // The templates every sandbox may use without a build (E2B's are public ones).
    if tag.as_deref().is_none_or(|t| t == "latest")
        && crate::control::HOST_TEMPLATES.contains(&id.as_str())
    {
        return Ok(Json(json!({"templateID": id, "public": true})));
    }
    let building_or_built = t
        .lock()
        .builds
        .get(&id)
        .is_some_and(|b| b.values().any(|b| b.status != "error"));
    if building_or_built {
        return Ok(Json(json!({"templateID": id, "public": false})));
    }
    let reference = format!("{id}:{}", tag.as_deref().unwrap_or("latest"));
    let store = lockbox_image::Store::in_state_dir(&t.e2b.runtime.state_dir())
        .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match store.get(&reference) {
        Ok(Some(_)) => Ok(Json(json!({"templateID": id, "public": false}))),
        Ok(None) => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template {alias} not found"),
        )),
        Err(e) => Err(E2bError::new(StatusCode::BAD_REQUEST, e.to_string())),
    }
}
