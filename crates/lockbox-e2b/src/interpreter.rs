//! The code interpreter (port 49999, `e2b-code-interpreter`): `POST /execute` streaming
//! newline-delimited JSON, and `/contexts`, on lockbox's code contexts
//! (`lockbox_runtime::Sandbox::run_code_stream`; docs/code-contexts.md).
//!
//! Languages: `python` (the default context), `bash`, and `javascript` (Node, when the
//! sandbox has `node`); others are a 400 naming `language`.

use crate::control::runtime_error;
use crate::{E2b, E2bError, Target};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use futures_util::StreamExt;
use lockbox_runtime::{
    CodeEvent, ContextId, ContextInfo, ContextOptions, DisplayData, ExecError, Language,
    RunCodeRequest, RuntimeError, Sandbox,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The code interpreter's routes.
pub fn router(e2b: E2b) -> Router {
    Router::new()
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}", delete(delete_context))
        .route("/contexts/{id}/restart", post(restart_context))
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .with_state(e2b)
}

fn bad(message: impl Into<String>) -> E2bError {
    E2bError::new(StatusCode::BAD_REQUEST, message)
}

/// The lockbox sandbox behind `target`.
fn sandbox_of(e2b: &E2b, target: &Target) -> Result<Sandbox, E2bError> {
    e2b.runtime
        .sandbox(&target.instance)
        .map_err(|_| crate::sandbox_not_found(&target.sandbox))
}

/// lockbox's language for E2B's name of one.
fn language(name: &str) -> Result<Language, E2bError> {
    match name {
        "typescript" | "r" | "java" => Err(bad(format!(
            "language: {name:?} is not supported (python, bash, javascript)"
        ))),
        other => Language::from_name(other).ok_or_else(|| {
            bad(format!(
                "language: {other:?} is not supported (python, bash, javascript)"
            ))
        }),
    }
}

/// E2B's name of a language.
fn language_name(language: Language) -> &'static str {
    match language {
        Language::Node => "javascript",
        other => other.as_str(),
    }
}

/// E2B's `Context`.
fn context_json(info: &ContextInfo) -> Value {
    json!({
        "id": info.id.as_str(),
        "language": language_name(info.language),
        "cwd": info.cwd.clone().unwrap_or_else(|| crate::HOME.to_owned()),
    })
}

/// A request body as JSON, or `{}` when empty; a 400 naming the problem otherwise.
fn body_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, E2bError> {
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(text).map_err(|e| bad(format!("request body: {e}")))
}

#[derive(Debug, Deserialize)]
struct NewContext {
    language: Option<String>,
    cwd: Option<String>,
}

async fn create_context(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, E2bError> {
    let req: NewContext = body_json(&body)?;
    let sandbox = sandbox_of(&e2b, &target)?;
    let language = language(req.language.as_deref().unwrap_or("python"))?;
    let info = sandbox
        .create_context(ContextOptions {
            id: None,
            language,
            cwd: Some(match req.cwd {
                Some(cwd) => cwd,
                None => home(&sandbox).await,
            }),
            env: env_of(&e2b, &target),
        })
        .await
        .map_err(|e| runtime_error(&e))?;
    Ok(Json(context_json(&info)))
}

/// Where contexts start unless told: the default user's home, as E2B's interpreter does.
async fn home(sandbox: &Sandbox) -> String {
    crate::envd::home_of(sandbox, crate::envd::User::User).await
}

/// The sandbox's `envVars`, for its interpreters.
fn env_of(e2b: &E2b, target: &Target) -> std::collections::BTreeMap<String, String> {
    e2b.registry
        .get(&target.sandbox)
        .map(|s| s.env.into_iter().collect())
        .unwrap_or_default()
}

async fn list_contexts(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
) -> Result<Json<Value>, E2bError> {
    let sandbox = sandbox_of(&e2b, &target)?;
    // E2B's interpreter starts with a Python and a JavaScript context, which the SDK's
    // callers expect to list; lockbox makes its contexts on first use, so listing is one
    // (the home looked up only then, not at every listing).
    let has_default = sandbox
        .list_contexts()
        .await
        .iter()
        .any(|c| c.id.as_str() == lockbox_runtime::DEFAULT_CONTEXT);
    if !has_default {
        let default = sandbox
            .create_context(ContextOptions {
                id: Some(ContextId::from(lockbox_runtime::DEFAULT_CONTEXT)),
                language: Language::Python,
                cwd: Some(home(&sandbox).await),
                env: env_of(&e2b, &target),
            })
            .await;
        if let Err(e) = default {
            if !matches!(e, RuntimeError::AlreadyExists { .. }) {
                tracing::debug!(sandbox = %target.sandbox, "no default Python context: {e}");
            }
        }
    }
    // Without `node` in the sandbox there is no JavaScript context to list.
    if let Err(e) = context_for(&e2b, &target, &sandbox, Language::Node).await {
        tracing::debug!(sandbox = %target.sandbox, "no JavaScript context: {}", e.message);
    }
    let mut contexts = sandbox.list_contexts().await;
    // The built-in ones first, as E2B lists them (its callers take the last one listed as
    // the one they made).
    contexts.sort_by_key(|c| {
        let id = c.id.as_str();
        !(id == lockbox_runtime::DEFAULT_CONTEXT || id.starts_with("e2b-"))
    });
    Ok(Json(Value::Array(
        contexts.iter().map(context_json).collect(),
    )))
}

fn context_error(id: &str, e: &RuntimeError) -> E2bError {
    match e {
        RuntimeError::ContextNotFound { .. } => E2bError::new(
            StatusCode::NOT_FOUND,
            format!("context \"{id}\" was not found"),
        ),
        other => runtime_error(other),
    }
}

async fn delete_context(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let sandbox = sandbox_of(&e2b, &target)?;
    sandbox
        .delete_context(&id)
        .await
        .map_err(|e| context_error(&id, &e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Restarting a context: a fresh interpreter under the same id, language and cwd (its
/// variables are gone).
async fn restart_context(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let sandbox = sandbox_of(&e2b, &target)?;
    let info = sandbox
        .list_contexts()
        .await
        .into_iter()
        .find(|c| c.id.as_str() == id)
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("context \"{id}\" was not found"),
            )
        })?;
    sandbox
        .delete_context(&id)
        .await
        .map_err(|e| context_error(&id, &e))?;
    sandbox
        .create_context(ContextOptions {
            id: Some(info.id),
            language: info.language,
            cwd: info.cwd,
            env: env_of(&e2b, &target),
        })
        .await
        .map_err(|e| runtime_error(&e))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct ExecuteBody {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

/// The context a run without `context_id` uses for `language`: lockbox's `default`
/// context for Python, else one named `e2b-{language}`, made on first use.
async fn context_for(
    e2b: &E2b,
    target: &Target,
    sandbox: &Sandbox,
    language: Language,
) -> Result<Option<ContextId>, E2bError> {
    if language == Language::Python {
        return Ok(None);
    }
    let id = format!("e2b-{}", language.as_str());
    if !sandbox
        .list_contexts()
        .await
        .iter()
        .any(|c| c.id.as_str() == id)
    {
        let made = sandbox
            .create_context(ContextOptions {
                id: Some(ContextId::from(id.as_str())),
                language,
                cwd: Some(home(sandbox).await),
                env: env_of(e2b, target),
            })
            .await;
        match made {
            Ok(_) | Err(RuntimeError::AlreadyExists { .. }) => {}
            Err(e) => return Err(runtime_error(&e)),
        }
    }
    Ok(Some(ContextId::from(id)))
}

/// Microseconds since the epoch (E2B's output `timestamp`).
fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// E2B's `Result` of a rich value: its MIME types under E2B's names, the rest in `extra`.
fn result_json(d: &DisplayData) -> Value {
    let mut out = Map::new();
    let mut extra = Map::new();
    for (mime, value) in &d.data {
        let key = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            _ => {
                extra.insert(mime.clone(), value.clone());
                continue;
            }
        };
        out.insert(key.to_owned(), value.clone());
    }
    // E2B's interpreter gives a text in single quotes (a string's repr: `'x'`) without them.
    if let Some(Value::String(text)) = out.get_mut("text") {
        if text.len() >= 2 && text.starts_with('\'') && text.ends_with('\'') {
            *text = text[1..text.len() - 1].to_owned();
        }
    }
    out.insert("type".into(), json!("result"));
    out.insert("is_main_result".into(), json!(d.is_main_result));
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    Value::Object(out)
}

fn error_json(e: &ExecError) -> Value {
    json!({"type": "error", "name": e.name, "value": e.value, "traceback": e.traceback})
}

fn line(v: &Value) -> bytes::Bytes {
    let mut text = v.to_string();
    text.push('\n');
    bytes::Bytes::from(text)
}

/// Whether `target`'s lockbox sandbox still serves its E2B sandbox: not killed (which
/// forgets the E2B sandbox before it deletes the lockbox one), paused or replaced.
fn still_serving(e2b: &E2b, target: &Target) -> bool {
    let serving = e2b.registry.get(&target.sandbox).is_some_and(|s| {
        s.paused.is_none() && s.instance_id(&target.sandbox) == target.instance.as_str()
    });
    serving
        && e2b
            .runtime
            .sandbox_info(&target.instance)
            .is_ok_and(|i| i.state == lockbox_runtime::SandboxState::Running)
}

async fn execute(
    State(e2b): State<E2b>,
    Extension(target): Extension<Target>,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: ExecuteBody = body_json(&body)?;
    if req.context_id.is_some() && req.language.is_some() {
        return Err(bad("context_id and language: give one of them"));
    }
    let sandbox = sandbox_of(&e2b, &target)?;
    let context = match (&req.context_id, &req.language) {
        (Some(id), _) => Some(ContextId::from(id.as_str())),
        (None, Some(name)) => {
            let language = language(name)?;
            context_for(&e2b, &target, &sandbox, language).await?
        }
        (None, None) => None,
    };
    let id = context.as_ref().map(|c| c.as_str().to_owned());
    // E2B's `execution_count`: this run's number in its context (which counts its runs
    // since it was made; a restart makes it anew).
    let ran = sandbox
        .list_contexts()
        .await
        .into_iter()
        .find(|c| c.id.as_str() == id.as_deref().unwrap_or(lockbox_runtime::DEFAULT_CONTEXT))
        .map_or(0, |c| c.runs);
    let count = ran + 1;
    let (e2b, target) = (e2b.clone(), target.clone());
    let stream = sandbox
        .run_code_stream(RunCodeRequest {
            code: req.code,
            context,
            timeout: None,
            env: req.env_vars.unwrap_or_default().into_iter().collect(),
        })
        .await
        .map_err(|e| context_error(id.as_deref().unwrap_or("default"), &e))?;
    let mut sent_error = false;
    let lines = stream.flat_map(move |event| {
        let out: Vec<Value> = match event {
            CodeEvent::Stdout { text } => {
                vec![json!({"type": "stdout", "text": text, "timestamp": now_micros()})]
            }
            CodeEvent::Stderr { text } => {
                vec![json!({"type": "stderr", "text": text, "timestamp": now_micros()})]
            }
            CodeEvent::Result(d) => vec![result_json(&d)],
            CodeEvent::Error(e) => {
                sent_error = true;
                vec![error_json(&e)]
            }
            CodeEvent::End(exec) => {
                // A run its sandbox did not outlive has no end: the connection is cut, as
                // when an E2B sandbox dies, and the SDK (finding the sandbox gone) raises
                // its "sandbox was killed" `TimeoutException`.
                let gone = exec.error.is_some() && !still_serving(&e2b, &target);
                if gone {
                    return futures_util::stream::iter(vec![Err(std::io::Error::other(
                        "the sandbox ended during the run",
                    ))]);
                }
                let mut out = Vec::new();
                if let (Some(e), false) = (&exec.error, sent_error) {
                    out.push(error_json(e));
                }
                out.push(json!({"type": "number_of_executions", "execution_count": count}));
                out.push(json!({"type": "end_of_execution"}));
                out
            }
        };
        futures_util::stream::iter(
            out.into_iter()
                .map(|v| Ok::<_, std::io::Error>(line(&v)))
                .collect::<Vec<_>>(),
        )
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rich_results_carry_e2bs_names_for_their_mime_types() {
        let mut data = std::collections::BTreeMap::new();
        data.insert("text/plain".to_owned(), json!("42"));
        data.insert("image/png".to_owned(), json!("iVBOR"));
        data.insert("application/x-other".to_owned(), json!("x"));
        let v = result_json(&DisplayData {
            data,
            is_main_result: true,
        });
        assert_eq!(v["type"], "result");
        assert_eq!(v["text"], "42");
        assert_eq!(v["png"], "iVBOR");
        assert_eq!(v["is_main_result"], true);
        assert_eq!(v["extra"]["application/x-other"], "x");
    }

    #[test]
    fn a_text_in_single_quotes_comes_without_them_as_from_e2bs_interpreter() {
        let text = |plain: &str| {
            let data = [("text/plain".to_owned(), json!(plain))].into();
            let is_main_result = true;
            result_json(&DisplayData {
                data,
                is_main_result,
            })["text"]
                .clone()
        };
        assert_eq!(text("'supertest'"), "supertest");
        assert_eq!(text("'a' + 'b'"), "a' + 'b");
        assert_eq!(text("\"it's\""), "\"it's\"");
        assert_eq!(text("'"), "'");
        assert_eq!(text("42"), "42");
    }

    #[test]
    fn e2b_language_names_map_to_lockbox_languages_or_name_the_field() {
        assert_eq!(language("python").ok(), Some(Language::Python));
        assert_eq!(language("javascript").ok(), Some(Language::Node));
        assert_eq!(language_name(Language::Node), "javascript");
        let err = language("r").unwrap_err();
        assert!(err.message.starts_with("language:"), "{}", err.message);
    }
}
