//! The OpenAPI 3.0 description of the API, served at `GET /openapi.json`. Written by hand
//! next to the route table (`routes::router`); a test checks that every path and method
//! here is routed, and the schemathesis fuzz run (`scripts/fuzz-api.sh`) drives the API
//! from it.

use serde_json::{json, Map, Value};
use std::sync::OnceLock;

/// The document (built once).
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(build)
}

/// Every `(METHOD, path)` the document describes, e.g. `("GET", "/v1/sandboxes/{id}")`.
pub fn operations() -> Vec<(String, String)> {
    let mut ops = Vec::new();
    if let Some(paths) = document()["paths"].as_object() {
        for (path, item) in paths {
            if let Some(methods) = item.as_object() {
                for method in methods.keys().filter(|m| *m != "parameters") {
                    ops.push((method.to_ascii_uppercase(), path.clone()));
                }
            }
        }
    }
    ops
}

/// Longest duration any `*_ms` field accepts: 30 days.
pub const MAX_MS: u64 = 30 * 24 * 3600 * 1000;
/// Largest `grace_ms` of a kill: one minute.
pub const MAX_GRACE_MS: u64 = 60_000;
/// Largest per-process log bound: 1 GiB.
pub const MAX_LOG_BYTES: u64 = 1 << 30;

fn schema(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_body(name: &str) -> Value {
    json!({ "content": { "application/json": { "schema": schema(name) } } })
}

fn reply(description: &str, name: &str) -> Value {
    let mut body = json_body(name);
    body["description"] = json!(description);
    body
}

fn path_param(name: &str, what: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": what,
            "schema": { "type": "string" } })
}

fn query(name: &str, required: bool, what: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "query", "required": required, "description": what,
            "schema": schema })
}

/// An operation: summary, parameters, optional request body, success responses; every
/// operation also answers `4XX` with the error schema.
fn op(summary: &str, params: Vec<Value>, body: Option<Value>, ok: &[(&str, Value)]) -> Value {
    let mut responses = Map::new();
    for (status, response) in ok {
        responses.insert((*status).to_owned(), response.clone());
    }
    responses.insert(
        "4XX".into(),
        reply("error (see `code`; 401 without a valid token)", "Error"),
    );
    let mut operation = json!({ "summary": summary, "parameters": params, "responses": responses });
    if let Some(body) = body {
        operation["requestBody"] = body;
    }
    operation
}

fn required_json(name: &str) -> Option<Value> {
    let mut body = json_body(name);
    body["required"] = json!(true);
    Some(body)
}

fn optional_json(name: &str) -> Option<Value> {
    let mut body = json_body(name);
    body["required"] = json!(false);
    Some(body)
}

/// The schema of one SSE event (clients such as schemathesis validate each event with it).
fn sse_event(names: &[&str]) -> Value {
    json!({ "type": "object", "required": ["data"],
            "properties": {
                "event": { "type": "string", "enum": names },
                "data": { "type": "string", "description": "a JSON document" },
                "id": { "type": "string", "description": "the log cursor after this event" } } })
}

const EXEC_EVENTS: &[&str] = &["start", "stdout", "stderr", "exit", "error"];
const LOG_EVENTS: &[&str] = &["stdout", "stderr", "pty", "truncated", "eof"];
const WATCH_EVENTS: &[&str] = &["change", "overflow", "error"];

fn sse(description: &str) -> Value {
    json!({ "description": description,
            "content": { "text/event-stream": { "schema": sse_event(EXEC_EVENTS) } } })
}

fn diff_path() -> Value {
    query(
        "path",
        false,
        "the path, relative to the workdir (or give `path_bytes`)",
        json!({ "type": "string" }),
    )
}

fn diff_path_bytes() -> Value {
    query(
        "path_bytes",
        false,
        "the path's bytes, base64, for a name that is not UTF-8",
        json!({ "type": "string", "format": "byte" }),
    )
}

fn all_schemas() -> Value {
    let mut all = schemas();
    for more in [
        branch_schemas(),
        console_schemas(),
        snapshot_schemas(),
        context_schemas(),
        audit_schemas(),
    ] {
        if let (Some(map), Some(more)) = (all.as_object_mut(), more.as_object()) {
            map.extend(more.clone());
        }
    }
    all
}

/// The schemas of snapshots.
fn snapshot_schemas() -> Value {
    json!({
        "SnapshotRequest": { "type": "object", "additionalProperties": false, "properties": {
            "name": { "type": "string", "maxLength": 256, "pattern": "^[^\\x00-\\x1f\\x7f]*$",
                      "description": "a name for people; no control characters" },
            "include_tmp": { "type": "boolean", "default": false,
                      "description": "keep the sandbox's /tmp too: forks and restores find it in theirs" } } },
        "Snapshot": { "type": "object",
            "required": ["id", "name", "parent", "sandbox", "workdir", "created_at", "bytes", "entries"],
            "properties": {
                "id": { "type": "string" },
                "name": { "type": "string", "nullable": true },
                "parent": { "type": "string", "nullable": true },
                "sandbox": { "type": "string", "nullable": true },
                "workdir": { "oneOf": [ { "type": "string" }, { "type": "object", "required": ["bytes"],
                    "properties": { "bytes": { "type": "string", "format": "byte" } } } ] },
                "created_at": { "type": "string" },
                "bytes": { "type": "integer", "minimum": 0 },
                "entries": { "type": "integer", "minimum": 0 } } },
        "ForkRequest": { "type": "object", "additionalProperties": false, "properties": {
            "count": { "type": "integer", "minimum": 1, "default": 1,
                       "description": "how many sandboxes (at most the server's max_sandboxes)" } } },
        "ForkSandboxRequest": { "type": "object", "additionalProperties": false, "properties": {
            "count": { "type": "integer", "minimum": 1, "default": 1,
                       "description": "how many sandboxes (at most the server's max_sandboxes)" },
            "name": { "type": "string", "maxLength": 256, "pattern": "^[^\\x00-\\x1f\\x7f]*$",
                      "description": "a name for the snapshot taken first" },
            "include_tmp": { "type": "boolean", "default": false,
                      "description": "keep the sandbox's /tmp in that snapshot too" } } },
        "ForkReply": { "type": "object", "required": ["snapshot", "sandboxes"], "properties": {
            "snapshot": schema("Snapshot"),
            "sandboxes": { "type": "array", "items": schema("Sandbox") } } },
        "RestoreRequest": { "type": "object", "additionalProperties": false, "required": ["snapshot"],
            "properties": { "snapshot": { "type": "string", "description": "snapshot id" } } },
        "SnapshotList": { "type": "object", "required": ["snapshots"],
            "properties": { "snapshots": { "type": "array", "items": schema("Snapshot") } } }
    })
}

/// An operation that needs no token (the console's login and session probe).
fn public(mut operation: Value) -> Value {
    operation["security"] = json!([]);
    operation
}

/// The console's session routes, transactions and journal runs. (The console's static
/// files under `/ui` are not described: they are not part of the API.)
fn console_paths() -> Value {
    let id = |what: &str| path_param("id", what);
    json!({
        "/ui/login": {
            "post": public(op("Exchange the server token for a console session: sets the HttpOnly, SameSite=Strict `lockbox_session` cookie and the `lockbox_csrf` cookie (send its value as `X-CSRF-Token` on state-changing requests)",
                vec![], required_json("LoginRequest"),
                &[("204", json!({ "description": "logged in (cookies set)" }))]))
        },
        "/ui/logout": {
            "post": public(op("End the console session and clear its cookies", vec![], None,
                &[("204", json!({ "description": "logged out (cookies cleared)" }))]))
        },
        "/ui/session": {
            "get": public(op("Whether the session cookie is valid (401 if not)", vec![], None,
                &[("200", reply("logged in", "SessionState"))]))
        },
        "/v1/transactions": {
            "get": op("Transactions of the server's state directory (prepared, committed, aborted)", vec![], None,
                &[("200", reply("the transactions", "TxnList"))]),
            "post": op("Commit running sandboxes together (`kind: gather`): typically forks of one snapshot, or any sandboxes over one workdir; their branches are merged under a conflict policy and committed as one transaction, all or none. The changes of the snapshot layers all of them share are no conflict and go in once. 400 names the bad field (`kind`, `sandboxes`: none, one named twice, different workdirs; `conflicts`); 404 an unknown sandbox; 409 `CONFLICT` for paths several sandboxes changed under `fail` (`details.conflicts`) or a workdir changed under a sandbox since it began (unless `force`), `WORKDIR_BUSY` for a sandbox whose own commit, abort, restore or snapshot is under way. Afterwards every sandbox keeps running on its branch, as after a single commit",
                vec![], required_json("GatherRequest"),
                &[("200", reply("what each sandbox contributed, the conflicts and how they were resolved, the merged changes", "GatherResult"))])
        },
        "/v1/transactions/{id}": {
            "get": op("One transaction's record (as `lockbox txn show --json`)",
                vec![id("transaction id (`lockbox txn list`)")], None,
                &[("200", reply("the record", "Txn"))])
        },
        "/v1/journal/runs": {
            "get": op("Runs of the journal given to `lockbox serve --journal` (none: an empty list)", vec![], None,
                &[("200", reply("the runs", "JournalRuns"))])
        },
        "/v1/journal/runs/{id}": {
            "get": op("One journal run: its status and entries",
                vec![id("run id (`lockbox journal list`)")], None,
                &[("200", reply("the run", "JournalRun"))])
        }
    })
}

/// The schemas of the console's session, transactions and journal runs.
fn console_schemas() -> Value {
    let string = json!({ "type": "string" });
    let count = json!({ "type": "integer", "minimum": 0 });
    let run = json!({ "type": "object", "required": ["id", "status", "entries", "steps"],
        "properties": {
            "id": string.clone(),
            "status": { "type": "string", "enum": ["running", "suspended", "finished"] },
            "entries": count.clone(), "steps": count, "version": { "type": "string", "nullable": true },
            "metadata": {} } });
    let mut run_detail = run.clone();
    run_detail["properties"]["entries"] = json!({ "type": "array", "items": { "type": "object" } });
    json!({
        "LoginRequest": { "type": "object", "required": ["token"], "additionalProperties": false,
            "properties": { "token": string.clone() } },
        "SessionState": { "type": "object", "required": ["authenticated"],
            "properties": { "authenticated": { "type": "boolean" } } },
        "Txn": { "type": "object", "required": ["state"], "properties": {
            "id": string.clone(),
            "kind": { "type": "string", "enum": ["pipeline", "gather"] },
            "state": string.clone(),
            "created": { "type": "string", "format": "date-time" },
            "exit_code": { "type": "integer" },
            "meaning": string.clone(),
            "stages": { "type": "array", "items": { "type": "object" } },
            "report": { "type": "object", "nullable": true },
            "abort_reason": {},
            "error": string.clone() } },
        "GatherRequest": { "type": "object", "required": ["kind", "sandboxes"], "additionalProperties": false,
            "properties": {
                "kind": { "type": "string", "enum": ["gather"] },
                "sandboxes": { "type": "array", "minItems": 1, "items": string.clone(),
                    "description": "running sandboxes over one workdir, in the order the writer-wins policies go by" },
                "conflicts": { "type": "string", "enum": ["fail", "first_writer_wins", "last_writer_wins", "markers"],
                    "description": "fail (default): refuse with 409; first/last_writer_wins: the first/last sandbox listed that changed the path wins; markers: the first wins, the others' versions are kept as PATH.lockbox-<sandbox>" },
                "dry_run": { "type": "boolean", "description": "report the merged result, change nothing" },
                "force": { "type": "boolean", "description": "commit even where the workdir changed under a sandbox since it began" } } },
        "GatherResult": { "type": "object",
            "required": ["id", "kind", "committed", "dry_run", "contributions", "conflicts", "markers", "changes"],
            "properties": {
                "id": string.clone(),
                "kind": { "type": "string", "enum": ["gather"] },
                "committed": { "type": "boolean" },
                "dry_run": { "type": "boolean" },
                "contributions": { "type": "array", "items": { "type": "object", "required": ["sandbox", "changes"],
                    "properties": { "sandbox": string.clone(), "changes": { "type": "array", "items": schema("Change") } } } },
                "conflicts": { "type": "array", "items": { "type": "object", "required": ["path", "sandboxes"],
                    "properties": { "path": {}, "sandboxes": { "type": "array", "items": string.clone() },
                        "winner": { "type": "string", "nullable": true } } } },
                "markers": { "type": "array", "items": { "type": "object", "required": ["path", "kept_as", "sandbox"],
                    "properties": { "path": {}, "kept_as": {}, "sandbox": string.clone() } } },
                "changes": { "type": "array", "items": schema("Change") },
                "report": { "type": "object", "nullable": true } } },
        "TxnList": { "type": "object", "required": ["transactions"],
            "properties": { "transactions": { "type": "array", "items": schema("Txn") } } },
        "JournalRun": run_detail,
        "JournalRuns": { "type": "object", "required": ["journal", "runs"], "properties": {
            "journal": { "type": "string", "nullable": true },
            "runs": { "type": "array", "items": run } } }
    })
}

/// Kept branches of the state directory.
fn branch_paths() -> Value {
    let bid = || path_param("id", "branch id (`lockbox branch list`)");
    json!({
        "/v1/branches": {
            "get": op("Kept branches of the server's state directory", vec![], None,
                &[("200", reply("the branches", "BranchList"))])
        },
        "/v1/branches/{id}": {
            "get": op("A kept branch and its changes", vec![bid()], None,
                &[("200", reply("the branch", "BranchDetail"))])
        },
        "/v1/branches/{id}/diff": {
            "get": op("One path's diff between the workdir and the branch, as numbered hunks",
                vec![bid(), diff_path(), diff_path_bytes()], None,
                &[("200", reply("the hunks, or a summary of both sides", "FileDiff"))])
        },
        "/v1/branches/{id}/commit": {
            "post": op("Commit a kept branch (all, only/exclude paths, some hunks of files); the rest is kept or dropped",
                vec![bid()], optional_json("BranchCommitRequest"),
                &[("200", reply("what was applied", "CommitSummary"))])
        },
        "/v1/branches/{id}/abort": {
            "post": op("Remove a kept branch", vec![bid()], None,
                &[("200", reply("done", "AbortResult"))])
        }
    })
}

/// The schemas of branches and diffs.
fn branch_schemas() -> Value {
    let string = json!({ "type": "string" });
    let count = json!({ "type": "integer", "minimum": 0 });
    let boolean = json!({ "type": "boolean" });
    let name = json!({ "oneOf": [
        { "type": "string" },
        { "type": "object", "required": ["bytes"], "properties": { "bytes": { "type": "string", "format": "byte" } } }
    ] });
    let names = json!({ "type": "array", "items": name.clone() });
    let hunks = json!({ "type": "array", "items": { "type": "object", "required": ["path", "accept"],
        "additionalProperties": false,
        "properties": { "path": name.clone(), "accept": { "type": "array", "items": count.clone() } } } });
    let side = json!({ "type": "object", "required": ["type"], "properties": {
        "type": { "type": "string", "enum": ["absent", "file", "dir", "symlink", "special"] },
        "size": count.clone(), "target": name.clone() } });
    let branch = json!({ "type": "object", "required": ["id", "state", "status"], "properties": {
        "id": string.clone(), "workdir": name.clone(), "state": string.clone(), "status": string.clone(),
        "created": string.clone(), "command": {}, "changes": count.clone() } });
    let mut detail = branch.clone();
    detail["properties"]["change_list"] = json!({ "type": "array", "items": schema("Change") });
    json!({
        "Branch": branch,
        "BranchDetail": detail,
        "BranchList": { "type": "object", "required": ["branches"],
            "properties": { "branches": { "type": "array", "items": schema("Branch") } } },
        "BranchCommitRequest": { "type": "object", "additionalProperties": false, "properties": {
            "only": names.clone(), "exclude": names, "hunks": hunks, "force": boolean.clone(),
            "rest": { "type": "string", "enum": ["keep", "drop"] } } },
        "Hunk": { "type": "object", "required": ["index", "old_start", "old_lines", "new_start", "new_lines", "header", "lines"],
            "properties": {
                "index": count.clone(), "old_start": count.clone(), "old_lines": count.clone(),
                "new_start": count.clone(), "new_lines": count.clone(), "header": string.clone(),
                "lines": { "type": "array", "items": { "type": "object", "required": ["op", "text"],
                    "properties": { "op": { "type": "string", "enum": [" ", "-", "+"] }, "text": string } } },
                "no_newline_old": boolean.clone(), "no_newline_new": boolean
            } },
        "FileDiff": { "type": "object", "required": ["path", "kind"], "properties": {
            "path": name, "kind": { "type": "string", "enum": ["text", "summary"] },
            "hunks": { "type": "array", "items": schema("Hunk") }, "old": side.clone(), "new": side } }
    })
}

fn build() -> Value {
    let id = || path_param("id", "sandbox id");
    let pid = || path_param("pid", "process id (`p1`, ...)");
    let sid = || path_param("sid", "session id");
    let fpath = |what: &str| query("path", true, what, json!({ "type": "string" }));
    let boolean = json!({ "type": "boolean" });
    let no_content = json!({ "description": "done" });

    let paths = json!({
        "/healthz": {
            "get": {
                "summary": "Liveness (no token needed)",
                "security": [],
                "responses": { "200": reply("alive", "Health") }
            }
        },
        "/openapi.json": {
            "get": op("This document", vec![], None,
                &[("200", json!({ "description": "OpenAPI 3.0 document",
                    "content": { "application/json": { "schema": { "type": "object" } } } }))])
        },
        "/v1/sandboxes": {
            "post": op("Create a sandbox", vec![], optional_json("CreateSandbox"),
                &[("201", reply("created", "Sandbox"))]),
            "get": op("List sandboxes (running, the last --keep-stopped stopped ones, and lost)",
                vec![query("state", false, "only sandboxes in this state (running: the live ones)",
                    json!({ "type": "string", "enum": ["running", "stopped", "lost"] }))],
                None,
                &[("200", reply("the sandboxes", "SandboxList"))])
        },
        "/v1/sandboxes/{id}": {
            "get": op("Show a sandbox", vec![id()], None, &[("200", reply("the sandbox", "Sandbox"))]),
            "delete": op("Delete a sandbox: kill everything in it, apply on_exit to its branch",
                vec![id()], None, &[("200", reply("the stopped sandbox", "Sandbox"))])
        },
        "/v1/sandboxes/{id}/sessions": {
            "post": op("Create a session (a persistent bash)", vec![id()], optional_json("CreateSession"),
                &[("201", reply("created", "Session"))]),
            "get": op("List sessions", vec![id()], None, &[("200", reply("the sessions", "SessionList"))])
        },
        "/v1/sandboxes/{id}/sessions/{sid}": {
            "delete": op("Delete a session (kills what runs in it)", vec![id(), sid()], None,
                &[("204", no_content.clone())])
        },
        "/v1/sandboxes/{id}/exec": {
            "post": op("Run a command in a session and wait for it", vec![id()], required_json("ExecRequest"),
                &[("200", reply("how it ended, with all output", "ExecResult"))])
        },
        "/v1/sandboxes/{id}/exec/stream": {
            "post": op("Run a command in a session, streaming its output (SSE events start, stdout, stderr, exit, error)",
                vec![id()], required_json("ExecRequest"),
                &[("200", sse("events; `stdout`/`stderr` carry {data} (UTF-8 text) or {data_b64}, `exit` {exit_code, timed_out, duration_ms, session}"))])
        },
        "/v1/sandboxes/{id}/processes": {
            "post": op("Start a background process", vec![id()], required_json("StartProcess"),
                &[("201", reply("started", "Process"))]),
            "get": op("List processes", vec![id()], None, &[("200", reply("the processes", "ProcessList"))])
        },
        "/v1/sandboxes/{id}/processes/{pid}": {
            "get": op("Show a process", vec![id(), pid()], None, &[("200", reply("the process", "Process"))]),
            "delete": op("Kill a process tree (TERM, grace, KILL) and wait for it",
                vec![id(), pid(), query("grace_ms", false, "SIGTERM → SIGKILL delay (default 2000)",
                    json!({ "type": "integer", "minimum": 0, "maximum": MAX_GRACE_MS }))],
                None, &[("200", reply("the exited process", "Process"))])
        },
        "/v1/sandboxes/{id}/processes/{pid}/signal": {
            "post": op("Send a signal to the whole process tree", vec![id(), pid()], required_json("SignalRequest"),
                &[("200", reply("the process", "Process"))])
        },
        "/v1/sandboxes/{id}/processes/{pid}/logs": {
            "get": op("Read the output log from a cursor; with follow=true an SSE stream (id: = cursor, Last-Event-ID resumes)",
                vec![id(), pid(),
                    query("since", false, "cursor (0 = oldest retained byte)", json!({ "type": "integer", "minimum": 0 })),
                    query("follow", false, "stream live after the replay (SSE)", boolean.clone()),
                    query("max_bytes", false, "most bytes in a non-follow reply", json!({ "type": "integer", "minimum": 1 })),
                    json!({ "name": "Last-Event-ID", "in": "header", "required": false,
                            "description": "resume a followed stream after this cursor",
                            "schema": { "type": "string", "pattern": "^[0-9]{1,19}$" } })],
                None,
                &[("200", json!({ "description": "a chunk (JSON), or events (SSE) when following",
                    "content": {
                        "application/json": { "schema": schema("LogChunk") },
                        "text/event-stream": { "schema": sse_event(LOG_EVENTS) } } }))])
        },
        "/v1/sandboxes/{id}/processes/{pid}/stdin": {
            "post": op("Write to the process's stdin (raw body, or JSON {data|data_b64, close})",
                vec![id(), pid(), query("close", false, "close stdin after writing", boolean.clone())],
                Some(json!({ "required": false, "content": {
                    "application/octet-stream": { "schema": { "type": "string", "format": "binary" } },
                    "application/json": { "schema": schema("StdinRequest") } } })),
                &[("200", reply("written", "StdinResult"))])
        },
        "/v1/sandboxes/{id}/processes/{pid}/pty": {
            "get": op("WebSocket to a PTY process (binary frames both ways, {\"resize\":{cols,rows}} text frames, scrollback on attach); for a pipe process stdin and merged output",
                vec![id(), pid()], None, &[("101", json!({ "description": "switching to WebSocket" }))])
        },
        "/v1/sandboxes/{id}/processes/{pid}/ws": {
            "get": op("The same WebSocket as /pty (the name for interactive stdin of pipe processes)",
                vec![id(), pid()], None, &[("101", json!({ "description": "switching to WebSocket" }))])
        },
        "/v1/sandboxes/{id}/files": {
            "get": op("Read a file (Range: bytes=a-b gives 206, 416 when outside the file)",
                vec![id(), fpath("the file"),
                    json!({ "name": "Range", "in": "header", "required": false,
                            "schema": { "type": "string" }, "description": "one byte range" })],
                None,
                &[("200", json!({ "description": "the bytes",
                        "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } })),
                  ("206", json!({ "description": "the range",
                        "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } }))]),
            "put": op("Write a file atomically from the raw body (parents created)",
                vec![id(), fpath("the file"),
                    query("mode", false, "octal permission bits (default 644)",
                        json!({ "type": "string", "pattern": "^[0-7]{1,4}$" }))],
                Some(json!({ "required": false, "content": {
                    "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } })),
                &[("200", reply("the written file", "FileStat"))])
        },
        "/v1/sandboxes/{id}/fs/list": {
            "get": op("List a directory", vec![id(), fpath("the directory"),
                    query("recursive", false, "descend", boolean.clone()),
                    query("hidden", false, "include dot files", boolean.clone())],
                None, &[("200", reply("entries", "FileList"))])
        },
        "/v1/sandboxes/{id}/watch": {
            "get": op("Watch a file or directory: an SSE stream of `change` {kind: created|modified|deleted|moved, path, is_dir, from (moved)}, `overflow` {dropped (null: unknown)} and `error` {message} events until the client disconnects",
                vec![id(), fpath("the file or directory"),
                    query("recursive", false, "watch everything below a directory too (default true)", boolean.clone())],
                None,
                &[("200", json!({ "description": "events (SSE)",
                    "content": { "text/event-stream": { "schema": sse_event(WATCH_EVENTS) } } }))])
        },
        "/v1/sandboxes/{id}/audit": {
            "get": op("The network audit log of a --net-allow/--net-deny sandbox: one NetEvent per connect or send towards the host's network, per DNS query lockbox's resolver answered, and per name (SNI, Host) a relayed TLS or HTTP connection asked for. By default an SSE stream of `audit` events (the last 1,000 kept, then live ones; a stream that lags gets a `dropped` event with the count) until the client disconnects; with follow=false the kept events as JSON",
                vec![id(), query("follow", false, "stream (default true); false: the kept events as JSON", boolean.clone())],
                None,
                &[("200", json!({ "description": "events (SSE), or the kept ones (follow=false)",
                    "content": {
                        "text/event-stream": { "schema": sse_event(&["audit"]) },
                        "application/json": { "schema": schema("AuditLog") } } }))])
        },
        "/v1/sandboxes/{id}/approvals": {
            "get": op("The approval questions of a net_ask sandbox waiting for a verdict, oldest first (docs/security.md, Approvals). Each new question is also an `asked` event of the audit stream. With wait_ms, a long poll: waits up to that long for a question with an id above `after`",
                vec![id(),
                    query("after", false, "only questions with a greater id (default 0)", json!({ "type": "integer", "minimum": 0 })),
                    query("wait_ms", false, "wait up to this long for one (default 0, at most 60000)", json!({ "type": "integer", "minimum": 0, "maximum": 60000 }))],
                None, &[("200", reply("the pending questions", "Approvals"))])
        },
        "/v1/sandboxes/{id}/approvals/{qid}": {
            "post": op("Answer an approval question: once (this call), sandbox (this destination or name from now on) or deny. 404 QUESTION_NOT_FOUND if it is not pending (never asked, timed out, its caller gone), 409 QUESTION_DECIDED if answered already, 400 naming the field for a bad body",
                vec![id(), json!({ "name": "qid", "in": "path", "required": true,
                    "description": "the question's id", "schema": { "type": "integer", "minimum": 1 } })],
                required_json("Decision"), &[("200", reply("the verdict taken", "Decision"))])
        },
        "/v1/sandboxes/{id}/fs/stat": {
            "get": op("Stat a path (symlinks not followed)", vec![id(), fpath("the path")], None,
                &[("200", reply("the entry", "FileStat"))])
        },
        "/v1/sandboxes/{id}/fs/mkdir": {
            "post": op("Create a directory", vec![id()], required_json("MkdirRequest"),
                &[("200", reply("the directory", "FileStat"))])
        },
        "/v1/sandboxes/{id}/fs/move": {
            "post": op("Move or rename", vec![id()], required_json("MoveRequest"),
                &[("200", reply("the destination", "FileStat"))])
        },
        "/v1/sandboxes/{id}/fs/remove": {
            "post": op("Remove a file or directory", vec![id()], required_json("RemoveRequest"),
                &[("204", no_content.clone())])
        },
        "/v1/sandboxes/{id}/changes": {
            "get": op("What committing the sandbox's branch would do", vec![id()], None,
                &[("200", reply("the change set", "ChangeList"))])
        },
        "/v1/sandboxes/{id}/diff": {
            "get": op("One path's diff between the workdir and the branch, as numbered hunks",
                vec![id(), diff_path(), diff_path_bytes()], None,
                &[("200", reply("the hunks, or a summary of both sides", "FileDiff"))])
        },
        "/v1/sandboxes/{id}/commit": {
            "post": op("Commit the branch (all, only/exclude paths, some hunks of files) to the workdir", vec![id()],
                optional_json("CommitRequest"), &[("200", reply("what was applied", "CommitSummary"))])
        },
        "/v1/sandboxes/{id}/abort": {
            "post": op("Discard the branch's changes", vec![id()], None,
                &[("200", reply("done", "AbortResult"))])
        }
    });

    let mut paths = paths;
    for more in [
        branch_paths(),
        console_paths(),
        port_paths(),
        snapshot_paths(),
        context_paths(),
    ] {
        if let (Some(map), Some(more)) = (paths.as_object_mut(), more.as_object()) {
            map.extend(more.clone());
        }
    }
    add_links(&mut paths);
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "lockbox",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Long-lived sandboxes: sessions, processes, PTYs, files, workspace branches, exposed ports, code contexts (persistent Python/bash/Node interpreters with rich results). Every route but /healthz and the console's /ui routes needs `Authorization: Bearer <token>` (or the console's session cookie, with `X-CSRF-Token` on state-changing requests). Errors are {code, message, details}; see docs/server.md. The same sandboxes are also served as MCP tools at POST /mcp (MCP streamable HTTP transport, JSON-RPC 2.0, same bearer token; not described here: see docs/mcp.md)."
        },
        "security": [ { "bearer": [] } ],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": all_schemas()
        }
    })
}

/// Exposed ports and their proxy. The proxy is a prefix: every method and every path
/// below `/v1/sandboxes/{id}/ports/{port}/` goes to the sandboxed server (GET is described,
/// as the document cannot say "any"); its replies are the sandboxed server's own.
fn snapshot_paths() -> Value {
    json!({
        "/v1/sandboxes/{id}/snapshots": {
            "post": op("Snapshot the sandbox's files (its branch): its processes are paused while the branch is copied, then go on. Processes' memory is not captured. 409 NO_WORKDIR without a workdir",
                vec![path_param("id", "sandbox id")], optional_json("SnapshotRequest"),
                &[("201", reply("the snapshot", "Snapshot"))])
        },
        "/v1/snapshots": {
            "get": op("List snapshots, oldest first", vec![], None,
                &[("200", reply("the snapshots", "SnapshotList"))])
        },
        "/v1/sandboxes/{id}/restore": {
            "post": op("Roll the sandbox back to a snapshot of its workdir: its processes, sessions and contexts are stopped, \
                its branch discarded, and it starts again (same id and policy) seeing exactly the snapshot's files. \
                Processes' memory is not restored. 400 INVALID_REQUEST for a snapshot of another workdir",
                vec![path_param("id", "sandbox id")], required_json("RestoreRequest"),
                &[("200", reply("the sandbox, running again", "Sandbox"))])
        },
        "/v1/sandboxes/{id}/fork": {
            "post": op("Snapshot the sandbox, then create `count` sandboxes from that snapshot (as POST /v1/snapshots/{id}/fork): \
                the snapshot stays, delete it once its forks are gone",
                vec![path_param("id", "sandbox id")], optional_json("ForkSandboxRequest"),
                &[("201", reply("the snapshot and the forks", "ForkReply"))])
        },
        "/v1/snapshots/{id}/fork": {
            "post": op("Create `count` sandboxes from the snapshot (forks), with the policy of the sandbox it was taken of: \
                each sees exactly the snapshot's files and writes to its own layer. All or none; LIMIT_REACHED past max_sandboxes",
                vec![path_param("id", "snapshot id")], optional_json("ForkRequest"),
                &[("201", reply("the forks", "SandboxList"))])
        },
        "/v1/snapshots/{id}/diff": {
            "get": op("What changed from the snapshot to another snapshot or to a running sandbox of the same workdir \
                (none given: the snapshot's own changes against the workdir as it is now)",
                vec![path_param("id", "snapshot id"),
                     query("to_snapshot", false, "another snapshot of the same workdir", json!({ "type": "string" })),
                     query("to_sandbox", false, "a running sandbox of the same workdir", json!({ "type": "string" }))],
                None, &[("200", reply("the changes, sorted by path", "ChangeList"))])
        },
        "/v1/snapshots/{id}": {
            "get": op("One snapshot (404 SNAPSHOT_NOT_FOUND)", vec![path_param("id", "snapshot id")], None,
                &[("200", reply("the snapshot", "Snapshot"))]),
            "delete": op("Delete a snapshot (409 SNAPSHOT_IN_USE while forks or other snapshots use it)",
                vec![path_param("id", "snapshot id")], None,
                &[("204", json!({ "description": "deleted" }))])
        }
    })
}

fn port_paths() -> Value {
    let id = || path_param("id", "sandbox id");
    let port = || {
        json!({ "name": "port", "in": "path", "required": true,
                "description": "the port inside the sandbox (1-65535)",
                "schema": { "type": "integer", "minimum": 1, "maximum": 65535 } })
    };
    let upstream = json!({ "description": "the sandboxed server's reply, as it sent it \
        (502 PORT_NOT_LISTENING when nothing listens; WebSocket upgrades are carried through)",
        "content": { "*/*": { "schema": {} } } });
    json!({
        "/v1/sandboxes/{id}/ports": {
            "post": op("Expose a port of the sandbox (through the proxy below; with host_loopback also on a host 127.0.0.1 port)",
                vec![id()], required_json("ExposePort"), &[("201", reply("exposed", "Port"))]),
            "get": op("List exposed ports", vec![id()], None, &[("200", reply("the ports", "PortList"))])
        },
        "/v1/sandboxes/{id}/ports/{port}": {
            "delete": op("Stop exposing a port (its host listener closes)", vec![id(), port()], None,
                &[("204", json!({ "description": "done" }))])
        },
        "/v1/sandboxes/{id}/ports/{port}/": {
            "get": op("Proxy (prefix, any method) to the server on the exposed port: the root path. \
                Authorization, lockbox's cookies and X-CSRF-Token are removed, Host becomes localhost:PORT",
                vec![id(), port()], None, &[("default", upstream.clone())])
        },
        "/v1/sandboxes/{id}/ports/{port}/{path}": {
            "get": op("Proxy (prefix, any method, any path below) to the server on the exposed port",
                vec![id(), port(), path_param("path", "the path on the sandboxed server (may contain /)")],
                None, &[("default", upstream)])
        }
    })
}

/// Code contexts and their runs.
fn context_paths() -> Value {
    let id = || path_param("id", "sandbox id");
    let cid = || {
        path_param(
            "cid",
            "context id (`default`: the sandbox's Python context, created on first use)",
        )
    };
    json!({
        "/v1/sandboxes/{id}/contexts": {
            "post": op("Create a code context: a persistent python, bash or node interpreter (started on its first run). \
                400 INVALID_REQUEST naming `language` for another language; 409 ALREADY_EXISTS; LIMIT_REACHED beyond 16",
                vec![id()], optional_json("CreateContext"), &[("201", reply("created", "Context"))]),
            "get": op("List code contexts", vec![id()], None, &[("200", reply("the contexts", "ContextList"))])
        },
        "/v1/sandboxes/{id}/contexts/{cid}": {
            "delete": op("Delete a code context, killing its interpreter (404 CONTEXT_NOT_FOUND)", vec![id(), cid()], None,
                &[("204", json!({ "description": "done" }))])
        },
        "/v1/sandboxes/{id}/contexts/{cid}/run": {
            "post": op("Run code in a context: stdout/stderr, rich results (MIME bundles), the error. A timeout \
                interrupts (SIGINT: error KeyboardInterrupt, state kept), then after 2 s kills the interpreter \
                (error Timeout, state_lost); a crash is error InterpreterDied. 404 CONTEXT_NOT_FOUND",
                vec![id(), cid()], required_json("RunCode"), &[("200", reply("the execution", "Execution"))])
        },
        "/v1/sandboxes/{id}/contexts/{cid}/run/stream": {
            "post": op("Run code in a context, streamed as server-sent events: stdout, stderr ({text}), result \
                (a MIME bundle), error ({name, value, traceback}), then end (the whole Execution)",
                vec![id(), cid()], required_json("RunCode"),
                &[("200", json!({ "description": "events",
                    "content": { "text/event-stream": { "schema": sse_event(CODE_EVENTS) } } }))])
        }
    })
}

const CODE_EVENTS: &[&str] = &["stdout", "stderr", "result", "error", "end"];

/// OpenAPI links from the operations that create things to those that use them, so a
/// stateful client (and schemathesis' stateful phase) can follow ids it was given.
fn add_links(paths: &mut Value) {
    let Some(map) = paths.as_object_mut() else {
        return;
    };
    let mut sandbox_links = Map::new();
    let mut process_links = Map::new();
    let mut session_links = Map::new();
    let mut context_links = Map::new();
    for (path, item) in map.iter() {
        let Some(methods) = item.as_object() else {
            continue;
        };
        for method in methods.keys() {
            let name = format!("{method}{}", path.replace(['/', '{', '}'], "_"));
            let op_ref = format!(
                "#/paths/{}/{method}",
                path.replace('~', "~0").replace('/', "~1")
            );
            if path.starts_with("/v1/sandboxes/{id}/processes/{pid}") {
                process_links.insert(
                    name,
                    json!({ "operationRef": op_ref, "parameters": {
                    "id": "$request.path.id", "pid": "$response.body#/id" } }),
                );
            } else if path == "/v1/sandboxes/{id}/sessions/{sid}" {
                session_links.insert(
                    name,
                    json!({ "operationRef": op_ref, "parameters": {
                    "id": "$request.path.id", "sid": "$response.body#/id" } }),
                );
            } else if path.starts_with("/v1/sandboxes/{id}/contexts/{cid}") {
                context_links.insert(
                    name,
                    json!({ "operationRef": op_ref, "parameters": {
                    "id": "$request.path.id", "cid": "$response.body#/id" } }),
                );
            } else if path.starts_with("/v1/sandboxes/{id}")
                && !path.contains("{pid}")
                && !path.contains("{sid}")
                // A watch streams until the client leaves: a client following links to
                // exercise every operation would wait on it forever. So does an audit.
                && !path.ends_with("/watch")
                && !path.ends_with("/audit")
                && !path.contains("{qid}")
                && !path.contains("{cid}")
            {
                sandbox_links.insert(
                    name,
                    json!({ "operationRef": op_ref, "parameters": {
                    "id": "$response.body#/id" } }),
                );
            }
        }
    }
    for (path, links) in [
        ("/v1/sandboxes", sandbox_links),
        ("/v1/sandboxes/{id}/processes", process_links),
        ("/v1/sandboxes/{id}/sessions", session_links),
        ("/v1/sandboxes/{id}/contexts", context_links),
    ] {
        if let Some(created) = map
            .get_mut(path)
            .and_then(|item| item.pointer_mut("/post/responses/201"))
        {
            created["links"] = Value::Object(links);
        }
    }
}

/// Exactly one of `name` (text) and `name_b64` (see `output.rs`).
fn one_of_fields(name: &str) -> Value {
    json!({ "oneOf": [ { "required": [name] }, { "required": [format!("{name}_b64")] } ] })
}

/// The schemas of the network audit log: a supervisor's decision
/// (`lockbox_confine::NetEvent`) and the kept ones.
fn audit_schemas() -> Value {
    json!({
        "Approvals": { "type": "object", "required": ["approvals"],
            "properties": { "approvals": { "type": "array", "items": schema("Question") } } },
        "Question": { "type": "object",
            "required": ["id", "ts", "kind", "protocol", "pid", "command", "timeout_ms"],
            "description": "may this process reach this destination? (docs/security.md, Approvals)",
            "properties": {
                "id": { "type": "integer", "minimum": 1 },
                "ts": { "type": "string", "format": "date-time" },
                "kind": { "type": "string", "enum": ["connect", "send", "dns"] },
                "name": { "type": "string", "description": "the name asked (dns), or the one an approved answer gave the address for" },
                "address": { "type": "string" },
                "port": { "type": "integer", "minimum": 0, "maximum": 65535 },
                "protocol": { "type": "string", "enum": ["tcp", "udp"] },
                "pid": { "type": "integer", "minimum": 0 },
                "command": { "type": "string" },
                "timeout_ms": { "type": "integer", "minimum": 0 } } },
        "Decision": { "type": "object", "required": ["decision"],
            "properties": {
                "id": { "type": "integer", "minimum": 1, "description": "in the reply" },
                "decision": { "type": "string", "enum": ["once", "sandbox", "deny"] } } },
        "AuditLog": { "type": "object", "required": ["events"],
            "properties": { "events": { "type": "array", "items": schema("NetEvent") } } },
        "NetEvent": net_event()
    })
}

fn net_event() -> Value {
    let string = json!({ "type": "string" });
    let count = json!({ "type": "integer", "minimum": 0 });
    json!({ "type": "object", "required": ["ts", "kind"],
            "description": "one decision of the network supervisor (docs/security.md, Audit log)",
            "properties": {
                "ts": { "type": "string", "format": "date-time" },
                "sandbox": string,
                "kind": { "type": "string", "enum": ["connect", "send", "dns", "tls", "http", "request", "dropped"] },
                "decision": { "type": "string", "enum": ["allowed", "denied", "asked"] },
                "reason": string,
                "protocol": { "type": "string", "enum": ["tcp", "udp"] },
                "address": string,
                "port": { "type": "integer", "minimum": 0, "maximum": 65535 },
                "name": string,
                "sni": string,
                "host": string,
                "method": string,
                "path": string,
                "credential": string,
                "status": { "type": "integer", "minimum": 100, "maximum": 599 },
                "qtype": string,
                "answers": { "type": "array", "items": { "type": "string" } },
                "refused": { "type": "array", "items": { "type": "string" } },
                "pid": count,
                "command": string,
                "count": count,
                "question": { "type": "integer", "minimum": 1,
                    "description": "the approval question this event poses (asked) or settles" }
            } })
}

fn schemas() -> Value {
    let string = json!({ "type": "string" });
    let strings = json!({ "type": "array", "items": { "type": "string" } });
    let string_map = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    let boolean = json!({ "type": "boolean" });
    let count = json!({ "type": "integer", "minimum": 0 });
    let ms = json!({ "type": "integer", "minimum": 1, "maximum": MAX_MS });
    let size = json!({ "oneOf": [ { "type": "integer", "minimum": 0 },
                                  { "type": "string", "example": "512M" } ] });
    let b64 = json!({ "type": "string", "format": "byte" });
    // A file name is bytes (lockbox_policy::name): a string when it is UTF-8, else its bytes.
    let name = json!({ "oneOf": [
        { "type": "string" },
        { "type": "object", "required": ["bytes"], "additionalProperties": false,
          "properties": { "bytes": b64 },
          "description": "a name that is not UTF-8: its bytes, base64" } ] });
    let names = json!({ "type": "array", "items": name });
    let hunk_choices = json!({ "type": "array", "items": { "type": "object",
        "required": ["path", "accept"], "additionalProperties": false,
        "properties": { "path": name, "accept": { "type": "array", "items": count } } } });
    let nullable = |t: &str| json!({ "type": t, "nullable": true });
    let object = |props: Value, required: &[&str]| {
        let mut o = json!({ "type": "object", "properties": props, "additionalProperties": false });
        if !required.is_empty() {
            o["required"] = json!(required);
        }
        o
    };
    json!({
        "Error": {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": { "type": "string", "enum": lockbox_policy::ErrorCode::ALL.iter().map(|c| c.as_str()).collect::<Vec<_>>() },
                "message": string,
                "details": { "type": "object" }
            }
        },
        "Health": { "type": "object", "properties": { "status": string, "version": string } },
        "CreateSandbox": object(json!({
            "fs_readable": strings, "fs_writable": strings, "default_reads": boolean,
            "net": { "oneOf": [
                { "type": "string", "enum": ["none", "host"] },
                { "type": "object", "required": ["allow"], "additionalProperties": false,
                  "properties": { "allow": strings },
                  "description": "Only these destinations ([tcp://|udp://]HOST:PORTS; HOST a name, *.name for its subdomains, an address or block). The sandbox's resolver is lockbox: listed names are resolved when asked, other names get NXDOMAIN, and an address opens once an answer gave it." },
                { "type": "object", "required": ["deny"], "additionalProperties": false,
                  "properties": { "deny": strings },
                  "description": "The host's network except these destinations (names resolved once at start; no *. names)." }
            ] },
            "max_memory": size, "max_processes": { "type": "integer", "minimum": 1 },
            "max_open_files": { "type": "integer", "minimum": 1 }, "max_file_size": size,
            "max_inodes": { "type": "integer", "minimum": 1 },
            "timeout_ms": ms, "kill_grace_ms": { "type": "integer", "minimum": 0, "maximum": MAX_GRACE_MS },
            "env": string_map, "clean_env": boolean, "cwd": string, "hostname": string,
            "workdir": name, "on_exit": { "type": "string", "enum": ["keep", "commit", "abort"] },
            "idle_timeout_ms": ms, "labels": string_map,
            "net_ask": { "type": "boolean", "description": "with net allow: ask (GET approvals) instead of refusing an unlisted destination" },
            "net_ask_timeout_ms": { "type": "integer", "minimum": 1, "maximum": MAX_MS, "description": "how long a question waits for its verdict (default 30000)" },
            "from_snapshot": { "type": "string", "description": "start from this snapshot's files (a fork); workdir is then the snapshot's" },
            "http_auth": { "type": "array", "items": { "type": "string" }, "description": "'HOST bearer NAME' or 'HOST header HEADER-NAME NAME': lockbox terminates the sandbox's HTTPS to HOST (allowed by name in net.allow) with a CA of the sandbox's own and puts the server's credential NAME (lockbox serve --credential) on each request; the sandbox never sees it (docs/security.md, Credentials). An unknown NAME or a HOST not allowed by name is 400" },
            "http_allow": { "type": "array", "items": { "type": "string" }, "description": "'METHOD HOST/PATH-PREFIX' (METHOD may be *): on HOST (intercepted as http_auth does), only listed requests pass; others get 403 from lockbox" }
        }), &[]),
        "Sandbox": {
            "type": "object",
            "required": ["id", "state", "created_at", "labels", "sessions", "processes"],
            "properties": {
                "id": string, "state": { "type": "string", "enum": ["running", "stopped", "lost"] },
                "created_at": string, "workdir": nullable("string"), "branch": nullable("string"),
                "branch_action": { "type": "string", "enum": ["kept", "committed", "aborted", "empty"] },
                "labels": string_map, "sessions": count, "processes": count,
                "policy": { "allOf": [schema("PolicySummary")], "nullable": true },
                "usage": { "allOf": [schema("ResourceUse")], "nullable": true }
            }
        },
        "PolicySummary": {
            "type": "object",
            "required": ["net", "net_destinations", "default_reads", "fs_readable", "fs_writable",
                "max_memory_bytes", "max_processes", "max_cpu_time_ms", "max_file_size_bytes", "idle_timeout_ms"],
            "properties": {
                "net": { "type": "string", "enum": ["none", "host", "allow", "deny"] },
                "net_destinations": strings, "default_reads": boolean,
                "fs_readable": names, "fs_writable": names,
                "max_memory_bytes": nullable("integer"), "max_processes": nullable("integer"),
                "max_cpu_time_ms": nullable("integer"), "max_file_size_bytes": nullable("integer"),
                "idle_timeout_ms": nullable("integer")
            }
        },
        "ResourceUse": {
            "type": "object",
            "required": ["processes", "threads", "rss_bytes", "cpu_ms"],
            "properties": { "processes": count, "threads": count, "rss_bytes": count, "cpu_ms": count }
        },
        "SandboxList": { "type": "object", "required": ["sandboxes"],
            "properties": { "sandboxes": { "type": "array", "items": schema("Sandbox") } } },
        "CreateSession": object(json!({
            "id": { "type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$" }, "cwd": string, "env": string_map
        }), &[]),
        "Session": { "type": "object", "required": ["id", "pid", "created_at", "busy"],
            "properties": { "id": string, "pid": { "type": "integer" }, "created_at": string, "busy": boolean } },
        "SessionList": { "type": "object", "required": ["sessions"],
            "properties": { "sessions": { "type": "array", "items": schema("Session") } } },
        "ExecRequest": object(json!({
            "command": string, "session": string, "cwd": string, "env": string_map,
            "timeout_ms": ms, "stdin_b64": b64, "stdin": string
        }), &["command"]),
        // Each stream once: text when UTF-8 and no longer than base64, else base64.
        "ExecResult": { "type": "object",
            "required": ["exit_code", "timed_out", "duration_ms", "session",
                         "stdout_truncated", "stderr_truncated"],
            "properties": {
                "exit_code": { "type": "integer" }, "stdout_b64": b64, "stderr_b64": b64,
                "stdout": string, "stderr": string, "timed_out": boolean,
                "duration_ms": { "type": "number" }, "session": string,
                "stdout_truncated": boolean, "stderr_truncated": boolean
            },
            "allOf": [ one_of_fields("stdout"), one_of_fields("stderr") ] },
        "PtySize": object(json!({
            "cols": { "type": "integer", "minimum": 1, "maximum": 65535 },
            "rows": { "type": "integer", "minimum": 1, "maximum": 65535 }
        }), &["cols", "rows"]),
        "StartProcess": object(json!({
            "argv": { "type": "array", "items": { "type": "string" }, "minItems": 1 },
            "command": string, "session": string, "cwd": string, "env": string_map,
            "pty": schema("PtySize"),
            "log_bytes": { "type": "integer", "minimum": 1, "maximum": MAX_LOG_BYTES },
            "stdin": boolean
        }), &[]),
        "Process": { "type": "object",
            "required": ["id", "pid", "command", "state", "started_at", "pty", "log_end"],
            "properties": {
                "id": string, "pid": { "type": "integer" }, "command": strings,
                "state": { "type": "string", "enum": ["running", "exited"] },
                "exit_code": nullable("integer"), "signal": nullable("integer"),
                "started_at": string, "pty": boolean, "log_end": count
            } },
        "ProcessList": { "type": "object", "required": ["processes"],
            "properties": { "processes": { "type": "array", "items": schema("Process") } } },
        "SignalRequest": object(json!({
            "signal": { "oneOf": [ { "type": "integer", "minimum": 1, "maximum": 64 },
                                   { "type": "string", "example": "TERM" } ] }
        }), &["signal"]),
        "LogSegment": { "type": "object", "required": ["stream", "offset"],
            "properties": {
                "stream": { "type": "string", "enum": ["stdout", "stderr", "pty"] },
                "offset": count, "data_b64": b64, "data": string
            },
            "oneOf": one_of_fields("data")["oneOf"] },
        "LogChunk": { "type": "object", "required": ["segments", "next", "truncated", "eof"],
            "properties": {
                "segments": { "type": "array", "items": schema("LogSegment") },
                "next": count, "truncated": boolean, "eof": boolean
            } },
        "StdinRequest": object(json!({ "data": string, "data_b64": b64, "close": boolean }), &[]),
        "StdinResult": { "type": "object", "properties": { "written": count, "closed": boolean } },
        "FileStat": { "type": "object", "required": ["path", "kind", "size", "mode", "modified"],
            "properties": {
                "path": string, "kind": { "type": "string", "enum": ["file", "dir", "symlink", "other"] },
                "size": count,
                "mode": { "type": "string", "pattern": "^[0-7]{4}$",
                          "description": "permission bits, octal (\"0644\")" },
                "modified": string, "target": nullable("string")
            } },
        "FileList": { "type": "object", "required": ["entries"],
            "properties": { "entries": { "type": "array", "items": schema("FileStat") } } },
        "MkdirRequest": object(json!({ "path": string, "parents": boolean }), &["path"]),
        "MoveRequest": object(json!({ "from": string, "to": string, "overwrite": boolean }), &["from", "to"]),
        "RemoveRequest": object(json!({ "path": string, "recursive": boolean }), &["path"]),
        "Change": { "type": "object",
            "properties": {
                "path": name,
                "kind": { "type": "string", "enum": ["added", "modified", "deleted", "type_changed"] },
                "file_type": { "type": "string", "enum": ["file", "dir", "symlink", "special"] },
                "size": count,
                "mode": { "type": "string", "pattern": "^[0-7]{4}$",
                          "description": "permission bits, octal (\"0644\")" }
            } },
        "ChangeList": { "type": "object", "required": ["changes"],
            "properties": { "changes": { "type": "array", "items": schema("Change") } } },
        "CommitRequest": object(json!({ "only": names, "exclude": names, "force": boolean,
            "hunks": hunk_choices }), &[]),
        "CommitSummary": { "type": "object", "required": ["report", "remaining"],
            "properties": { "report": { "type": "object" }, "remaining": count } },
        "ExposePort": object(json!({
            "port": { "type": "integer", "minimum": 1, "maximum": 65535 },
            "host_loopback": boolean
        }), &["port"]),
        "Port": { "type": "object", "required": ["port", "path"],
            "properties": { "port": { "type": "integer", "minimum": 1, "maximum": 65535 },
                "path": string, "host_address": string } },
        "PortList": { "type": "object", "required": ["ports"],
            "properties": { "ports": { "type": "array", "items": schema("Port") } } },
        "AbortResult": { "type": "object", "properties": { "aborted": boolean } }
    })
}

/// The schemas of code contexts.
fn context_schemas() -> Value {
    let string = json!({ "type": "string" });
    let strings = json!({ "type": "array", "items": { "type": "string" } });
    let string_map = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    let boolean = json!({ "type": "boolean" });
    let count = json!({ "type": "integer", "minimum": 0 });
    let ms = json!({ "type": "integer", "minimum": 1, "maximum": MAX_MS });
    let nullable = |t: &str| json!({ "type": t, "nullable": true });
    let object = |props: Value, required: &[&str]| {
        let mut o = json!({ "type": "object", "properties": props, "additionalProperties": false });
        if !required.is_empty() {
            o["required"] = json!(required);
        }
        o
    };
    json!({
        "CreateContext": object(json!({
            "id": { "type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$" },
            "language": { "type": "string", "enum": ["python", "python3", "bash", "sh", "node", "javascript", "js"], "default": "python" },
            "cwd": string, "env": string_map
        }), &[]),
        "Context": { "type": "object", "required": ["id", "language", "created_at", "runs", "restarts"],
            "properties": { "id": string, "language": string, "cwd": nullable("string"), "created_at": string,
                "pid": nullable("integer"), "runs": count, "restarts": count } },
        "ContextList": { "type": "object", "required": ["contexts"],
            "properties": { "contexts": { "type": "array", "items": schema("Context") } } },
        "RunCode": object(json!({ "code": string, "timeout_ms": ms }), &["code"]),
        "DisplayData": { "type": "object", "required": ["data", "is_main_result"],
            "description": "a MIME bundle: text/plain, text/html, text/markdown, image/svg+xml and \
                application/json as they are; image/png, image/jpeg, application/pdf base64",
            "properties": { "data": { "type": "object", "additionalProperties": {} }, "is_main_result": boolean } },
        "ExecError": { "type": "object", "required": ["name", "value", "traceback"],
            "properties": { "name": string, "value": string, "traceback": string } },
        "Execution": { "type": "object",
            "required": ["context", "results", "logs", "timed_out", "state_lost", "truncated", "duration_ms"],
            "properties": {
                "context": string,
                "results": { "type": "array", "items": schema("DisplayData") },
                "logs": { "type": "object", "required": ["stdout", "stderr"],
                    "properties": { "stdout": strings, "stderr": strings } },
                "error": { "allOf": [schema("ExecError")], "nullable": true },
                "exit_code": nullable("integer"),
                "timed_out": boolean, "state_lost": boolean, "truncated": boolean, "duration_ms": count
            } }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_reference_resolves() {
        let doc = document();
        let text = doc.to_string();
        for piece in text.split("#/components/schemas/").skip(1) {
            let name: String = piece.chars().take_while(|c| c.is_alphanumeric()).collect();
            assert!(
                doc["components"]["schemas"].get(&name).is_some(),
                "dangling $ref {name}"
            );
        }
        assert!(operations().len() >= 30, "{:?}", operations());
        let links = &doc["paths"]["/v1/sandboxes"]["post"]["responses"]["201"]["links"];
        assert!(links.as_object().unwrap().len() >= 15, "{links}");
    }
}
