//! Carries out a [`ToolCall`] with one call into the runtime and shapes the result as MCP
//! content: a text block a model reads (exec output, a unified diff, a file's text; JSON
//! otherwise) and the same data as `structuredContent`. Errors become tool errors
//! (`isError`) with the lockbox code, message and details.

use super::tools::ToolCall;
use crate::error::ApiError;
use crate::scope::Scope;
use crate::wire::{self, each, CommitSummary, FileDiffReply, FileInfo, SandboxInfo};
use base64::Engine;
use futures_util::StreamExt;
use lockbox_policy::ErrorCode;
use lockbox_runtime::{
    ByteRange, ContextOptions, ExecRequest, ExecResult, Execution, RunCodeRequest, Runtime,
    RuntimeError, Sandbox, SessionOptions, WriteOptions,
};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

/// Runs the call; `Ok` is the `tools/call` result.
/// Every sandbox and snapshot a call names must be the scope's (`*_NOT_FOUND` otherwise,
/// through `sandbox`), and what it creates is admitted under the scope's ceiling first.
pub async fn run(runtime: &Runtime, scope: &Scope, call: ToolCall) -> Result<Value, ApiError> {
    // The scope's own sandbox `id`, running.
    let sandbox = |id: &str| -> Result<Sandbox, ApiError> {
        scope.sandbox(id)?;
        Ok(runtime.sandbox(id)?)
    };
    Ok(match call {
        ToolCall::CreateSandbox(mut spec) => {
            let _admitted = scope.admit(runtime, &mut spec)?;
            let info = runtime.create_sandbox(*spec).await?;
            scope.adopt_sandboxes([info.id.as_str()]);
            json_result(&SandboxInfo::from(info))
        }
        ToolCall::ListSandboxes { state } => {
            let mut sandboxes = runtime.list_sandboxes()?;
            sandboxes.retain(|s| state.is_none_or(|state| s.state == state));
            sandboxes.retain(|s| scope.owns_sandbox(&s.id));
            json_result(&json!({ "sandboxes": each::<_, SandboxInfo>(sandboxes) }))
        }
        ToolCall::DeleteSandbox { id } => {
            scope.sandbox(&id)?;
            json_result(&SandboxInfo::from(runtime.delete_sandbox(&id).await?))
        }
        ToolCall::Exec {
            id,
            request,
            max_output,
        } => {
            let sandbox = sandbox(&id)?;
            let result =
                crate::routes::exec::detached(async move { exec(&sandbox, request).await }).await?;
            exec_result(&result, max_output)
        }
        ToolCall::ReadFile {
            id,
            path,
            offset,
            length,
        } => {
            let sandbox = sandbox(&id)?;
            let range = ByteRange {
                start: offset,
                end: Some(offset.saturating_add(length)),
            };
            let mut read = sandbox.read_file(&path, Some(range)).await?;
            let mut data = Vec::new();
            read.body.read_to_end(&mut data).await.map_err(|e| {
                ApiError::new(
                    lockbox_policy::ErrorCode::Internal,
                    format!("reading {path}: {e}"),
                )
            })?;
            file_result(&path, read.size, read.range.0, &data)
        }
        ToolCall::WriteFile {
            id,
            path,
            data,
            mode,
        } => {
            let sandbox = sandbox(&id)?;
            let options = WriteOptions {
                mode: mode.unwrap_or(WriteOptions::default().mode),
                create_parents: true,
                ..WriteOptions::default()
            };
            let body = Box::pin(std::io::Cursor::new(data));
            json_result(&FileInfo::from(
                sandbox.write_file(&path, body, options).await?,
            ))
        }
        ToolCall::ListFiles {
            id,
            path,
            recursive,
            hidden,
            limit,
        } => {
            let sandbox = sandbox(&id)?;
            let mut stream = sandbox.list_stream(&path, recursive, hidden).await?;
            let mut entries = Vec::new();
            let mut truncated = false;
            while let Some(entry) = stream.next().await {
                if entries.len() == limit {
                    truncated = true;
                    break;
                }
                entries.push(FileInfo::from(entry?));
            }
            json_result(&json!({ "entries": entries, "truncated": truncated }))
        }
        ToolCall::Changes { id } => {
            let sandbox = sandbox(&id)?;
            json_result(&wire::ReviewReply::from(sandbox.review().await?))
        }
        ToolCall::Diff { id, path } => {
            let sandbox = sandbox(&id)?;
            let diff = sandbox.diff(path.clone()).await?;
            diff_result(&FileDiffReply::new(path, diff))
        }
        ToolCall::Commit { id, selection } => {
            let sandbox = sandbox(&id)?;
            json_result(&CommitSummary::from(sandbox.commit(selection).await?))
        }
        ToolCall::RunCode {
            id,
            request,
            language,
            max_output,
        } => {
            let sandbox = sandbox(&id)?;
            let exec = crate::routes::exec::detached(async move {
                run_code(&sandbox, request, language).await
            })
            .await?;
            run_code_result(&exec, max_output)
        }
        ToolCall::Snapshot { id, options } => {
            let snapshot = sandbox(&id)?.snapshot_with(options).await?;
            scope.adopt_snapshot(&snapshot.id);
            json_result(&wire::SnapshotInfo::from(snapshot))
        }
        ToolCall::ListSnapshots => {
            let mut snapshots = runtime.list_snapshots()?;
            snapshots.retain(|s| scope.owns_snapshot(&s.id));
            json_result(&wire::SnapshotList {
                snapshots: each(snapshots),
            })
        }
        ToolCall::Fork { snapshot, count } => {
            let _admitted = scope.admit_fork(runtime, &snapshot, count)?;
            let forks = runtime.fork_snapshot(&snapshot, count).await?;
            scope.adopt_sandboxes(forks.iter().map(|f| f.id.as_str()));
            json_result(&wire::SandboxList {
                sandboxes: each(forks),
            })
        }
        ToolCall::Restore { id, snapshot } => {
            scope.snapshot(&snapshot)?;
            sandbox(&id)?.restore(&snapshot).await?;
            json_result(&SandboxInfo::from(runtime.sandbox_info(&id)?))
        }
        ToolCall::DeleteSnapshot { snapshot } => {
            scope.snapshot(&snapshot)?;
            runtime.delete_snapshot(&snapshot).await?;
            json_result(&json!({ "deleted": true }))
        }
        ToolCall::Abort { id } => {
            sandbox(&id)?.abort().await?;
            json_result(&json!({ "aborted": true }))
        }
    })
}

/// Runs the command; a named session that does not exist yet is created first (an agent
/// names its shells as it goes; `/v1` creates them with their own route).
async fn exec(sandbox: &Sandbox, request: ExecRequest) -> Result<ExecResult, RuntimeError> {
    let Some(name) = request.session.clone() else {
        return sandbox.exec(request).await;
    };
    match sandbox.exec(request.clone()).await {
        Err(e) if e.code() == ErrorCode::SessionNotFound => {
            let options = SessionOptions {
                id: Some(name),
                ..SessionOptions::default()
            };
            match sandbox.create_session(options).await {
                // Another call made it in between: as good.
                Err(e) if e.code() != ErrorCode::AlreadyExists => return Err(e),
                _ => {}
            }
            sandbox.exec(request).await
        }
        other => other,
    }
}

/// Runs code; a named context that does not exist yet is created first with `language`.
async fn run_code(
    sandbox: &Sandbox,
    request: RunCodeRequest,
    language: String,
) -> Result<Execution, RuntimeError> {
    match sandbox.run_code(request.clone()).await {
        Err(e) if e.code() == ErrorCode::ContextNotFound => {
            let options = ContextOptions {
                id: request.context.clone(),
                language: crate::wire::language(&language)?,
                ..ContextOptions::default()
            };
            match sandbox.create_context(options).await {
                Err(e) if e.code() != ErrorCode::AlreadyExists => return Err(e),
                _ => {}
            }
            sandbox.run_code(request).await
        }
        other => other,
    }
}

/// An execution as MCP content: the text a model reads (output, results' text, the error),
/// PNG and JPEG results as image content, the whole execution as `structuredContent`.
fn run_code_result(e: &Execution, max: usize) -> Value {
    let mut text = String::new();
    let mut content = Vec::new();
    for (name, chunks) in [("stdout", &e.logs.stdout), ("stderr", &e.logs.stderr)] {
        let all = chunks.concat();
        if all.is_empty() {
            continue;
        }
        let (body, cut) = shown(all.as_bytes(), max);
        text.push_str(&format!("--- {name} ---\n{body}\n"));
        if cut || e.truncated {
            text.push_str(&format!("[{name} truncated]\n"));
        }
    }
    for r in &e.results {
        for mime in ["image/png", "image/jpeg"] {
            if let Some(Value::String(b64)) = r.data.get(mime) {
                content.push(json!({ "type": "image", "data": b64, "mimeType": mime }));
            }
        }
        let label = if r.is_main_result {
            "result"
        } else {
            "display"
        };
        if let Some(Value::String(plain)) = r.data.get("text/plain") {
            let (body, _) = shown(plain.as_bytes(), max);
            text.push_str(&format!("--- {label} ---\n{body}\n"));
        }
    }
    if let Some(err) = &e.error {
        text.push_str(&format!(
            "--- error: {}: {} ---\n{}",
            err.name, err.value, err.traceback
        ));
        if e.state_lost {
            text.push_str("\n(the interpreter was replaced: the context's state is lost)");
        }
    }
    if text.is_empty() {
        text.push_str("(no output)");
    }
    content.insert(0, json!({ "type": "text", "text": text }));
    json!({
        "content": content,
        "structuredContent": serde_json::to_value(wire::Execution::from(e.clone()))
            .unwrap_or_default(),
        "isError": false,
    })
}

/// A result whose text is its JSON.
fn json_result(value: &impl serde::Serialize) -> Value {
    let value = serde_json::to_value(value).unwrap_or_else(|e| json!({ "error": e.to_string() }));
    let structured = match value {
        Value::Object(_) => value,
        other => json!({ "value": other }),
    };
    let text = serde_json::to_string_pretty(&structured).unwrap_or_default();
    result(text, structured)
}

fn result(text: String, structured: Value) -> Value {
    json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
        "isError": false,
    })
}

/// At most `max` bytes of `bytes` as text (invalid UTF-8 replaced); whether it was cut.
fn shown(bytes: &[u8], max: usize) -> (String, bool) {
    let cut = bytes.len() > max;
    let head = &bytes[..bytes.len().min(max)];
    (String::from_utf8_lossy(head).into_owned(), cut)
}

fn exec_result(r: &ExecResult, max: usize) -> Value {
    let (stdout, out_cut) = shown(&r.stdout, max);
    let (stderr, err_cut) = shown(&r.stderr, max);
    let stdout_truncated = out_cut || r.stdout_truncated;
    let stderr_truncated = err_cut || r.stderr_truncated;
    let duration_ms = crate::output::ms(r.duration);
    let mut text = format!("exit_code: {}", r.exit_code);
    if r.timed_out {
        text.push_str(" (timed out: killed)");
    }
    for (name, body, cut, total) in [
        ("stdout", &stdout, stdout_truncated, r.stdout.len()),
        ("stderr", &stderr, stderr_truncated, r.stderr.len()),
    ] {
        if body.is_empty() && !cut {
            continue;
        }
        text.push_str(&format!("\n--- {name} ---\n{body}"));
        if cut {
            let kept = total.min(max);
            text.push_str(&format!(
                "\n[{name} truncated: its first {kept} bytes shown]"
            ));
        }
    }
    result(
        text,
        json!({
            "exit_code": r.exit_code,
            "timed_out": r.timed_out,
            "stdout": stdout,
            "stderr": stderr,
            "stdout_truncated": stdout_truncated,
            "stderr_truncated": stderr_truncated,
            "duration_ms": duration_ms,
            "session": r.session.as_str(),
        }),
    )
}

/// The media type of a whole image file, by its magic bytes (what a client can show).
fn image_type(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if data.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if data.len() >= 12 && data.starts_with(b"RIFF") && &data[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

fn file_result(path: &str, size: u64, offset: u64, data: &[u8]) -> Value {
    let end = offset + data.len() as u64;
    let truncated = end < size;
    if let Some(mime) = image_type(data).filter(|_| offset == 0 && !truncated) {
        // A whole image: as MCP image content, which a client can show or a model can see.
        let b64 = base64::engine::general_purpose::STANDARD.encode(data);
        return json!({
            "content": [
                { "type": "image", "data": b64, "mimeType": mime },
                { "type": "text", "text": format!("[{path}: {size} bytes, {mime}]") },
            ],
            "structuredContent": {
                "path": path, "size": size, "offset": 0, "length": data.len(),
                "truncated": false, "mime_type": mime, "content_b64": b64,
            },
            "isError": false,
        });
    }
    let mut structured = json!({
        "path": path, "size": size, "offset": offset, "length": data.len(), "truncated": truncated,
    });
    let text = match std::str::from_utf8(data) {
        Ok(text) => {
            structured["content"] = json!(text);
            text.to_owned()
        }
        Err(_) => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(data);
            structured["content_b64"] = json!(b64);
            format!("[{path}: {} bytes, not UTF-8; base64:]\n{b64}", data.len())
        }
    };
    let text = if truncated {
        format!("{text}\n[{path}: bytes {offset}-{end} of {size} shown; read on with offset {end}]")
    } else {
        text
    };
    result(text, structured)
}

/// A unified diff of the hunks (`@@ ... @@ hunk N`), or the summary of both sides.
fn diff_result(reply: &FileDiffReply) -> Value {
    let structured =
        serde_json::to_value(reply).unwrap_or_else(|e| json!({ "error": e.to_string() }));
    let path = reply.path.display();
    let text = match structured["hunks"].as_array() {
        Some(hunks) => {
            let mut text = format!("--- a/{path}\n+++ b/{path}\n");
            for hunk in hunks {
                text.push_str(&format!(
                    "{} hunk {}\n",
                    hunk["header"].as_str().unwrap_or("@@"),
                    hunk["index"]
                ));
                for line in hunk["lines"].as_array().into_iter().flatten() {
                    let op = line["op"].as_str().unwrap_or(" ");
                    let body = line["text"].as_str().unwrap_or("");
                    text.push_str(op);
                    text.push_str(body);
                    if !body.ends_with('\n') {
                        text.push('\n');
                    }
                }
            }
            text
        }
        None => serde_json::to_string_pretty(&structured).unwrap_or_default(),
    };
    result(text, structured)
}

/// An error as a tool result: `CODE: message` for the model, `{code, message, details}`
/// as structured content. With `redact`, lockbox's own failures (5xx-class) say only that
/// the server log has them, and are logged, as the HTTP API does.
pub fn tool_error(e: ApiError, redact: bool) -> Value {
    let (message, details) = if redact && e.status().is_server_error() {
        tracing::error!(code = %e.code, message = %e.message, details = %e.details, "mcp tool call failed");
        ("internal error (see the server log)".to_owned(), json!({}))
    } else {
        (e.message, e.details)
    };
    json!({
        "content": [{ "type": "text", "text": format!("{}: {message}", e.code) }],
        "structuredContent": { "code": e.code, "message": message, "details": details },
        "isError": true,
    })
}
