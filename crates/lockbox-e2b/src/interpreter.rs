//! The code interpreter (port 49999, `e2b-code-interpreter`'s `run_code` and contexts) on
//! lockbox's code contexts (`lockbox_runtime`'s persistent Python, bash and Node
//! interpreters):
//! - `POST /execute` `{code, context_id?, language?, env_vars?}` streams newline-delimited
//!   JSON: `stdout`/`stderr` `{text, timestamp}`, `result` (a MIME bundle as E2B names its
//!   formats: `text`, `html`, `markdown`, `svg`, `png`, `jpeg`, `pdf`, `latex`, `json`,
//!   `javascript`, plus `is_main_result`), `error` `{name, value, traceback}`, then
//!   `number_of_executions` and `end_of_execution`;
//! - `POST /contexts` `{language?, cwd?}`, `GET /contexts`, `POST /contexts/{id}/restart`,
//!   `DELETE /contexts/{id}`.
//!
//! A run without a context uses one default context per language (Python's is lockbox's
//! `default`). `env_vars` for one run is refused (400): a context's environment is fixed
//! when its interpreter starts; give variables on sandbox create (`envs`).

use crate::{E2b, E2bError, Target};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use bytes::Bytes;
use futures_util::StreamExt;
use lockbox_runtime::{CodeEvent, ContextInfo, ContextOptions, Language, RunCodeRequest};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

/// The code interpreter's routes.
pub fn router(e2b: E2b) -> Router {
    Router::new()
        .route("/health", get(|| async { "OK" }))
        .route("/execute", post(execute))
        .route("/contexts", post(create).get(list))
        .route("/contexts/{id}", delete(remove))
        .route("/contexts/{id}/restart", post(restart))
        .with_state(e2b)
}

fn runtime_error(e: lockbox_runtime::RuntimeError) -> E2bError {
    let status = match e.code() {
        lockbox_codes::ErrorCode::SandboxNotFound | lockbox_codes::ErrorCode::ContextNotFound => {
            StatusCode::NOT_FOUND
        }
        lockbox_codes::ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
        lockbox_codes::ErrorCode::LimitReached => StatusCode::TOO_MANY_REQUESTS,
        lockbox_codes::ErrorCode::AlreadyExists => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    E2bError::new(status, e.to_string())
}

#[derive(Deserialize)]
struct Execute {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<HashMap<String, String>>,
}

fn language(name: Option<&str>) -> Result<Language, E2bError> {
    match name {
        None => Ok(Language::Python),
        Some(n) => Language::from_name(&n.to_ascii_lowercase()).ok_or_else(|| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("language {n:?}: lockbox runs python, bash and javascript (node)"),
            )
        }),
    }
}

/// The context a run without one uses for `lang`: Python's is lockbox's `default`; the
/// others are made on first use.
async fn default_context(
    sandbox: &lockbox_runtime::Sandbox,
    lang: Language,
) -> Result<Option<String>, E2bError> {
    if lang == Language::Python {
        return Ok(None);
    }
    let id = format!("default-{}", lang.as_str());
    if !sandbox.list_contexts().await.iter().any(|c| *c.id == *id) {
        let opts = ContextOptions {
            id: Some(id.clone().into()),
            language: lang,
            ..ContextOptions::default()
        };
        match sandbox.create_context(opts).await {
            Ok(_) => {}
            // Another run made it meanwhile.
            Err(e) if e.code() == lockbox_codes::ErrorCode::AlreadyExists => {}
            Err(e) => return Err(runtime_error(e)),
        }
    }
    Ok(Some(id))
}

fn now() -> String {
    lockbox_policy::time::format(SystemTime::now())
}

/// E2B's name for each MIME type of a result.
const FORMATS: &[(&str, &str)] = &[
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
];

fn result_line(data: &BTreeMap<String, Value>, is_main_result: bool) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), json!("result"));
    let mut extra = Map::new();
    for (mime, value) in data {
        match FORMATS.iter().find(|(m, _)| m == mime) {
            Some((_, name)) => {
                out.insert((*name).into(), value.clone());
            }
            None => {
                extra.insert(mime.clone(), value.clone());
            }
        }
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    out.insert("is_main_result".into(), json!(is_main_result));
    Value::Object(out)
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

async fn execute(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    body: Result<Json<Execute>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, E2bError> {
    let Json(req) = body.map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    if req.env_vars.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "env_vars: lockbox fixes a context's environment when its interpreter starts; give \
             variables on Sandbox.create (envs) instead",
        ));
    }
    let sandbox = e2b
        .runtime
        .sandbox(&target.sandbox)
        .map_err(runtime_error)?;
    let context = match (&req.context_id, &req.language) {
        (Some(_), Some(_)) => {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                "give context_id or language, not both",
            ))
        }
        (Some(id), None) => Some(id.clone()),
        (None, lang) => default_context(&sandbox, language(lang.as_deref())?).await?,
    };
    let stream = sandbox
        .run_code_stream(RunCodeRequest {
            code: req.code,
            context: context.clone().map(Into::into),
            timeout: None,
        })
        .await
        .map_err(runtime_error)?;
    let id = context.unwrap_or_else(|| lockbox_runtime::DEFAULT_CONTEXT.to_owned());
    let lines = stream
        .then(move |event| {
            let sandbox = sandbox.clone();
            let id = id.clone();
            async move {
                let out = match event {
                    CodeEvent::Stdout { text } => {
                        vec![json!({"type": "stdout", "text": text, "timestamp": now()})]
                    }
                    CodeEvent::Stderr { text } => {
                        vec![json!({"type": "stderr", "text": text, "timestamp": now()})]
                    }
                    CodeEvent::Result(d) => vec![result_line(&d.data, d.is_main_result)],
                    CodeEvent::Error(e) => vec![json!({
                        "type": "error", "name": e.name, "value": e.value, "traceback": e.traceback,
                    })],
                    CodeEvent::End(_) => {
                        let runs = sandbox
                            .list_contexts()
                            .await
                            .into_iter()
                            .find(|c| *c.id == *id)
                            .map_or(0, |c| c.runs);
                        vec![
                            json!({"type": "number_of_executions", "execution_count": runs}),
                            json!({"type": "end_of_execution"}),
                        ]
                    }
                };
                futures_util::stream::iter(
                    out.into_iter()
                        .map(|v| Ok::<_, std::convert::Infallible>(line(&v))),
                )
            }
        })
        .flatten();
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

fn context_json(c: &ContextInfo) -> Value {
    json!({
        "id": c.id.to_string(),
        "language": match c.language { Language::Node => "javascript", l => l.as_str() },
        "cwd": c.cwd.clone().unwrap_or_else(|| "/".to_owned()),
    })
}

#[derive(Deserialize, Default)]
struct CreateContext {
    language: Option<String>,
    cwd: Option<String>,
}

async fn create(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    body: Option<Json<CreateContext>>,
) -> Result<Json<Value>, E2bError> {
    let req = body.map(|Json(b)| b).unwrap_or_default();
    let sandbox = e2b
        .runtime
        .sandbox(&target.sandbox)
        .map_err(runtime_error)?;
    let opts = ContextOptions {
        language: language(req.language.as_deref())?,
        cwd: req.cwd,
        ..ContextOptions::default()
    };
    let info = sandbox.create_context(opts).await.map_err(runtime_error)?;
    Ok(Json(context_json(&info)))
}

async fn list(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
) -> Result<Json<Value>, E2bError> {
    let sandbox = e2b
        .runtime
        .sandbox(&target.sandbox)
        .map_err(runtime_error)?;
    let all: Vec<Value> = sandbox
        .list_contexts()
        .await
        .iter()
        .map(context_json)
        .collect();
    Ok(Json(Value::Array(all)))
}

async fn remove(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let sandbox = e2b
        .runtime
        .sandbox(&target.sandbox)
        .map_err(runtime_error)?;
    sandbox.delete_context(&id).await.map_err(runtime_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A fresh interpreter in the same context (its variables and imports are gone).
async fn restart(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let sandbox = e2b
        .runtime
        .sandbox(&target.sandbox)
        .map_err(runtime_error)?;
    let info = sandbox
        .list_contexts()
        .await
        .into_iter()
        .find(|c| *c.id == *id)
        .ok_or_else(|| E2bError::new(StatusCode::NOT_FOUND, format!("context {id} not found")))?;
    sandbox.delete_context(&id).await.map_err(runtime_error)?;
    let opts = ContextOptions {
        id: Some(info.id.clone()),
        language: info.language,
        cwd: info.cwd.clone(),
        ..ContextOptions::default()
    };
    sandbox.create_context(opts).await.map_err(runtime_error)?;
    Ok(StatusCode::NO_CONTENT)
}
