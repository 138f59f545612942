//! The tools: each one's name, description and JSON schema (what `tools/list` shows, limits
//! and errors included), and the one conversion of its arguments into a [`ToolCall`]. The
//! argument shapes are those of the `/v1` bodies (`wire`) plus `sandbox_id`, so a field means
//! the same thing on both front ends.

use crate::error::ApiError;
use crate::wire::{self, CreateSandbox, DiffQuery};
use lockbox_runtime::{ExecRequest, SandboxSpec, SandboxState, Selection};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use utoipa::ToSchema;

/// `exec` without `timeout_ms`: two minutes (an agent's command must not hang its turn).
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 120_000;
/// Bytes of stdout, and of stderr, an `exec` result shows by default.
pub const DEFAULT_MAX_OUTPUT: usize = 64 << 10;
/// The most `max_output_bytes` may ask for.
pub const MAX_OUTPUT: usize = 1 << 20;
/// Bytes `read_file` returns by default.
pub const DEFAULT_READ: u64 = 256 << 10;
/// The most `length` may ask for.
pub const MAX_READ: u64 = 4 << 20;
/// Entries `list_files` returns by default.
pub const DEFAULT_LIST: usize = 1000;
/// The most `limit` may ask for.
pub const MAX_LIST: usize = 100_000;

/// A tool call with checked arguments: the only thing `run` accepts.
#[derive(Debug)]
pub enum ToolCall {
    /// `create_sandbox`.
    CreateSandbox(Box<SandboxSpec>),
    /// `list_sandboxes`.
    ListSandboxes {
        /// Only sandboxes in this state.
        state: Option<SandboxState>,
    },
    /// `delete_sandbox`.
    DeleteSandbox {
        /// The sandbox.
        id: String,
    },
    /// `exec`.
    Exec {
        /// The sandbox.
        id: String,
        /// The command.
        request: ExecRequest,
        /// Bytes of each stream shown.
        max_output: usize,
    },
    /// `read_file`.
    ReadFile {
        /// The sandbox.
        id: String,
        /// The file.
        path: String,
        /// First byte.
        offset: u64,
        /// Bytes at most.
        length: u64,
    },
    /// `write_file`.
    WriteFile {
        /// The sandbox.
        id: String,
        /// The file.
        path: String,
        /// Its new content.
        data: Vec<u8>,
        /// Permission bits.
        mode: Option<u32>,
    },
    /// `list_files`.
    ListFiles {
        /// The sandbox.
        id: String,
        /// The directory.
        path: String,
        /// Descend.
        recursive: bool,
        /// Dot files too.
        hidden: bool,
        /// Entries at most.
        limit: usize,
    },
    /// `changes`.
    Changes {
        /// The sandbox.
        id: String,
    },
    /// `diff`.
    Diff {
        /// The sandbox.
        id: String,
        /// The path, relative to the workdir.
        path: PathBuf,
    },
    /// `commit`.
    Commit {
        /// The sandbox.
        id: String,
        /// What to commit.
        selection: Selection,
    },
    /// `abort`.
    Abort {
        /// The sandbox.
        id: String,
    },
    /// `snapshot`.
    Snapshot {
        /// The sandbox.
        id: String,
        /// Its name, and whether `/tmp` goes in.
        options: lockbox_runtime::SnapshotOptions,
    },
    /// `list_snapshots`.
    ListSnapshots,
    /// `fork`.
    Fork {
        /// The snapshot.
        snapshot: String,
        /// How many sandboxes.
        count: usize,
    },
    /// `restore`.
    Restore {
        /// The sandbox.
        id: String,
        /// Its snapshot to roll back to.
        snapshot: String,
    },
    /// `delete_snapshot`.
    DeleteSnapshot {
        /// The snapshot.
        snapshot: String,
    },
    /// `run_code`.
    RunCode {
        /// The sandbox.
        id: String,
        /// The run (its context named).
        request: lockbox_runtime::RunCodeRequest,
        /// The language of a named context created by this call.
        language: String,
        /// Bytes of stdout, and of stderr, shown.
        max_output: usize,
    },
}

/// The names of the tools, in `tools/list` order.
pub fn tool_names() -> Vec<&'static str> {
    TOOLS.iter().map(|t| t.0).collect()
}

type Schema = fn() -> Value;

/// Name, description, input schema.
const TOOLS: &[(&str, &str, Schema)] = &[
    (
        "create_sandbox",
        "Create a confined Linux sandbox and return its info (id, state, policy). \
        Without workdir it sees the host's /usr, /bin, /lib, /etc read-only and a private /tmp; \
        with workdir, that host directory is mounted at the same path through a copy-on-write \
        branch: writes stay in the branch until `commit`. Network is loopback-only unless \
        net is \"host\" or lists destinations ({\"allow\": [\"pypi.org:443\"]}). Every grant (fs_readable, fs_writable, workdir, net, limits) must lie \
        within the operator's ceiling. Errors: BEYOND_CEILING (a grant beyond the ceiling: \
        details.field names it, details.ceiling says what is allowed; ask for less), \
        INVALID_REQUEST (a field, named in details.field), \
        NOT_A_DIRECTORY / FILE_NOT_FOUND (workdir), LIMIT_REACHED (too many sandboxes), \
        SETUP_FAILED / FEATURE_MISSING (this host cannot build the sandbox).",
        create_schema,
    ),
    (
        "list_sandboxes",
        "List the sandboxes of this server (running, stopped and lost) with \
        their id, state, workdir and labels.",
        list_sandboxes_schema,
    ),
    (
        "delete_sandbox",
        "Stop a sandbox's processes and delete it; its branch is kept, \
        committed or discarded as its on_exit says (keep by default: uncommitted changes \
        are not lost). Errors: SANDBOX_NOT_FOUND.",
        id_only_schema,
    ),
    (
        "exec",
        "Run a bash command line in a session of the sandbox (a persistent shell: cd \
        and exported variables carry over to the next exec in the same session; a named \
        session is created on first use) and wait \
        for it. Result: exit code, stdout, stderr (each cut to max_output_bytes, saying so), \
        duration. A command still running after timeout_ms (default 120000) is killed with \
        its process tree and reports exit code 124 and timed_out. Output is shown as UTF-8 \
        (invalid bytes replaced). Errors: SANDBOX_NOT_FOUND, SANDBOX_NOT_RUNNING, \
        SESSION_NOT_FOUND, INVALID_REQUEST.",
        exec_schema,
    ),
    (
        "run_code",
        "Run Python (or bash) code in a persistent interpreter of the sandbox (a code \
        context, like a notebook kernel: variables, imports and functions carry over to the \
        next run in the same context). Without `context` the sandbox's default Python context \
        is used; a named context is created on first use with `language` (python, bash or node). \
        Result: stdout, stderr, the value of the last expression, rich results (matplotlib \
        figures and PNG images come back as image content; HTML, JSON and other MIME types \
        in structuredContent.results), and the error with its name, value and traceback. \
        After timeout_ms (default 120000) the code is interrupted (KeyboardInterrupt, state \
        kept); if it does not stop within 2 s the interpreter is killed (error Timeout, \
        state_lost: the next run starts fresh). A crash is error InterpreterDied (state_lost). \
        Errors: SANDBOX_NOT_FOUND, SANDBOX_NOT_RUNNING, INVALID_REQUEST (language, \
        timeout_ms), LIMIT_REACHED (16 contexts).",
        run_code_schema,
    ),
    (
        "read_file",
        "Read a file inside the sandbox (as the sandbox sees it: a workdir path \
        shows the branch's version). Returns up to `length` bytes (default 262144, at most \
        4194304) from `offset`, as text when UTF-8 else base64, and whether more follows; \
        a whole PNG, JPEG, GIF or WebP file comes back as image content. \
        Errors: FILE_NOT_FOUND, IS_A_DIRECTORY, PERMISSION_DENIED, PATH_OUTSIDE_SANDBOX, \
        INVALID_REQUEST (offset past the end).",
        read_schema,
    ),
    (
        "write_file",
        "Write a whole file inside the sandbox atomically (a temporary file \
        renamed over it), creating missing parent directories. In a workdir the write goes \
        to the branch; `commit` applies it to the host. Give exactly one of content (text) \
        and content_b64. Errors: PERMISSION_DENIED / READ_ONLY (the path is not writable in \
        the sandbox), PATH_OUTSIDE_SANDBOX, NOT_A_DIRECTORY, INVALID_REQUEST.",
        write_schema,
    ),
    (
        "list_files",
        "List a directory inside the sandbox, sorted by name (depth first when \
        recursive; symlinks are not followed). At most `limit` entries (default 1000, at \
        most 100000); `truncated` says when there were more. Errors: FILE_NOT_FOUND, \
        NOT_A_DIRECTORY, PERMISSION_DENIED.",
        list_files_schema,
    ),
    (
        "changes",
        "What the sandbox changed in its workdir so far (its branch against the \
        host directory): each path with added / modified / deleted, type, size, mode and the \
        digest of its content, and review_token (the whole listing's digest), which a commit \
        that follows this review passes as its review. \
        Errors: NO_WORKDIR (the sandbox has none), SANDBOX_NOT_FOUND.",
        id_only_schema,
    ),
    (
        "diff",
        "One changed path's diff against the host workdir, as a unified diff with \
        numbered hunks (the numbers `commit`'s hunks take), or a summary of both sides for \
        binary files, directories and symlinks, with the digest of the content the hunks were \
        made from. Errors: NO_WORKDIR, NOT_CHANGED (the path has no change), INVALID_REQUEST.",
        diff_schema,
    ),
    (
        "commit",
        "Apply the sandbox's changes to the host workdir, durably and all at once; \
        the sandbox keeps running on what it committed. Without arguments everything is \
        committed; only / exclude select paths (a directory covers its subtree), hunks \
        commits some hunks of a file; review binds the commit to what changes / diff showed \
        (their [{path, digest}], or changes' review_token). Errors: STALE_BASE (the host \
        changed those paths since the sandbox read them: re-run on the new state, or force), \
        STALE_REVIEW (the branch changed since the review, or a path was not in it: nothing \
        applied, call changes again), NO_WORKDIR, BAD_HUNK, SPECIAL_FILES.",
        commit_schema,
    ),
    (
        "abort",
        "Discard every uncommitted change of the sandbox's workdir branch: its \
        processes and sessions are stopped and it restarts on a fresh branch (same id and \
        policy). Errors: NO_WORKDIR, SANDBOX_NOT_FOUND.",
        id_only_schema,
    ),
    (
        "snapshot",
        "Freeze the sandbox's files (its workdir branch; /tmp too with include_tmp) into \
        an immutable snapshot, while its processes keep running (they are paused for the \
        copy). Processes' memory is not captured: forks and restores start fresh processes, \
        with each shell session back in its recorded cwd and exported variables. Result: the \
        snapshot (id, name, parent, created). Errors: NO_WORKDIR (the sandbox has none), \
        SANDBOX_NOT_FOUND, SANDBOX_NOT_RUNNING, LIMIT_REACHED (the server's disk budget).",
        snapshot_schema,
    ),
    (
        "list_snapshots",
        "List the server's snapshots (id, name, parent snapshot, the sandbox taken of, \
        created). Errors: INTERNAL (the state directory could not be read).",
        no_args_schema,
    ),
    (
        "fork",
        "Create `count` new sandboxes from a snapshot: each sees exactly the snapshot's \
        files, writes to a branch of its own and can be committed on its own (a path a \
        sibling committed first is STALE_BASE unless forced). Result: the new sandboxes. \
        Errors: SNAPSHOT_NOT_FOUND, BEYOND_CEILING (the snapshot's policy is beyond the \
        operator's ceiling), LIMIT_REACHED (the server's max sandboxes), INVALID_REQUEST.",
        fork_schema,
    ),
    (
        "restore",
        "Roll the sandbox back to one of its snapshots: its processes are stopped, its \
        files become the snapshot's, its sessions restart in the snapshot's cwd and \
        variables (same id and policy). Result: the sandbox. Errors: SNAPSHOT_NOT_FOUND, \
        SANDBOX_NOT_FOUND, INVALID_REQUEST (a snapshot of another workdir).",
        restore_schema,
    ),
    (
        "delete_snapshot",
        "Delete a snapshot. Errors: SNAPSHOT_IN_USE (sandboxes forked from it, kept \
        branches of them, or snapshots taken of them still use it: delete those first), \
        SNAPSHOT_NOT_FOUND.",
        snapshot_only_schema,
    ),
];

/// The `tools/list` entries.
pub fn definitions() -> Vec<Value> {
    TOOLS
        .iter()
        .map(|(name, description, schema)| {
            json!({ "name": name, "description": squeeze(description), "inputSchema": schema() })
        })
        .collect()
}

/// The descriptions are written across source lines; one space between words on the wire.
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The input schema of a tool: the JSON schema of the type its arguments are parsed into,
/// derived with utoipa like the OpenAPI document's (so the two cannot drift), every `$ref`
/// replaced by what it names (an MCP client takes a self-contained schema), plus the
/// arguments taken out before that parse (`ids`, then `extra`).
fn input<T: ToSchema>(ids: &[(&str, Value)], extra: &[(&str, Value)]) -> Value {
    let mut components = crate::openapi::document()["components"]["schemas"].clone();
    // Types only the tools use are not in the document: their own dependencies.
    let mut own = Vec::new();
    T::schemas(&mut own);
    for (name, schema) in own {
        if components.get(&name).is_none() {
            components[name] = serde_json::to_value(schema).unwrap_or_default();
        }
    }
    let mut schema = inline(
        serde_json::to_value(T::schema()).unwrap_or_else(|_| json!({})),
        &components,
        0,
    );
    if let Some(map) = schema.as_object_mut() {
        // The tool's own description says what it is for.
        map.remove("description");
    }
    if schema.get("properties").is_none() {
        schema["properties"] = json!({});
    }
    let mut required: Vec<Value> = ids.iter().map(|(name, _)| json!(name)).collect();
    required.extend(schema["required"].as_array().into_iter().flatten().cloned());
    for (name, property) in ids.iter().chain(extra) {
        schema["properties"][*name] = property.clone();
    }
    schema["type"] = json!("object");
    schema["required"] = Value::Array(required);
    schema["additionalProperties"] = json!(false);
    schema
}

/// `schema` with each `{"$ref": "#/components/schemas/N"}` replaced by component `N`, and
/// descriptions (doc comments, wrapped across lines) on one line.
fn inline(schema: Value, components: &Value, depth: usize) -> Value {
    const PREFIX: &str = "#/components/schemas/";
    match schema {
        Value::Object(map) => {
            let target = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix(PREFIX))
                .and_then(|name| components.get(name));
            // The wire types are not recursive; the bound only keeps a mistake finite.
            if let Some(target) = target.filter(|_| depth < 16) {
                return inline(target.clone(), components, depth + 1);
            }
            Value::Object(
                map.into_iter()
                    .map(|(k, v)| match (k.as_str(), v) {
                        ("description", Value::String(text)) => (k, json!(squeeze(&text))),
                        (_, v) => (k, inline(v, components, depth)),
                    })
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| inline(v, components, depth))
                .collect(),
        ),
        other => other,
    }
}

/// Sets the description of property `name` (where the tool's meaning differs from the
/// `/v1` route's, e.g. another default).
fn describe(mut schema: Value, name: &str, description: String) -> Value {
    schema["properties"][name]["description"] = json!(description);
    schema
}

fn sandbox_id() -> (&'static str, Value) {
    (
        "sandbox_id",
        json!({ "type": "string", "description": "The sandbox's id (from create_sandbox or list_sandboxes)." }),
    )
}

fn snapshot_id() -> (&'static str, Value) {
    (
        "snapshot_id",
        json!({ "type": "string", "description": "The snapshot's id (from snapshot or list_snapshots)." }),
    )
}

fn max_output_bytes(what: &str) -> (&'static str, Value) {
    (
        "max_output_bytes",
        json!({ "type": "integer", "minimum": 0, "maximum": MAX_OUTPUT,
                "description": format!("Bytes of stdout, and of stderr, shown{what} (default {DEFAULT_MAX_OUTPUT}); the rest is cut and the result says so.") }),
    )
}

fn create_schema() -> Value {
    input::<CreateSandbox>(&[], &[])
}

fn list_sandboxes_schema() -> Value {
    input::<wire::ListSandboxes>(&[], &[])
}

fn id_only_schema() -> Value {
    input::<NoArgs>(&[sandbox_id()], &[])
}

fn exec_schema() -> Value {
    describe(
        input::<wire::Exec>(&[sandbox_id()], &[max_output_bytes("")]),
        "timeout_ms",
        format!("Kill the command (TERM, grace, KILL of its tree) after this long (default {DEFAULT_EXEC_TIMEOUT_MS}); exit code 124."),
    )
}

fn run_code_schema() -> Value {
    input::<RunCodeArgs>(&[sandbox_id()], &[max_output_bytes(" in the text")])
}

fn no_args_schema() -> Value {
    input::<NoArgs>(&[], &[])
}

fn snapshot_schema() -> Value {
    input::<wire::SnapshotRequest>(&[sandbox_id()], &[])
}

fn fork_schema() -> Value {
    input::<wire::ForkRequest>(&[snapshot_id()], &[])
}

fn restore_schema() -> Value {
    input::<NoArgs>(&[sandbox_id(), snapshot_id()], &[])
}

fn snapshot_only_schema() -> Value {
    input::<NoArgs>(&[snapshot_id()], &[])
}

fn read_schema() -> Value {
    input::<ReadArgs>(&[sandbox_id()], &[])
}

fn write_schema() -> Value {
    input::<WriteArgs>(&[sandbox_id()], &[])
}

fn list_files_schema() -> Value {
    input::<ListArgs>(&[sandbox_id()], &[])
}

fn diff_schema() -> Value {
    input::<DiffQuery>(&[sandbox_id()], &[])
}

fn commit_schema() -> Value {
    input::<wire::Commit>(&[sandbox_id()], &[])
}

/// `read_file`'s arguments.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    /// Absolute inside the sandbox, or relative to its working directory.
    path: String,
    /// First byte (default 0).
    #[serde(default)]
    offset: u64,
    /// Bytes at most (default 262144).
    #[schema(minimum = 1, maximum = 4_194_304)]
    length: Option<u64>,
}

/// `write_file`'s arguments.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    /// Absolute inside the sandbox, or relative to its working directory.
    path: String,
    /// The file's new content, as text.
    content: Option<String>,
    /// The file's new content, base64 (instead of content).
    #[schema(format = Byte)]
    content_b64: Option<String>,
    /// Permission bits as octal text, e.g. "644" (default) or "755".
    mode: Option<String>,
}

/// `list_files`' arguments.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    /// The directory (default: the working directory).
    #[serde(default = "dot")]
    path: String,
    /// Descend into subdirectories.
    #[serde(default)]
    recursive: bool,
    /// Include names starting with a dot.
    #[serde(default)]
    hidden: bool,
    /// Entries at most (default 1000).
    #[schema(minimum = 1, maximum = 100_000)]
    limit: Option<usize>,
}

fn dot() -> String {
    ".".into()
}

impl ToolCall {
    /// Checks the arguments of tool `name` and builds the call; errors are
    /// `INVALID_REQUEST` naming the field (`details.field`).
    pub fn parse(name: &str, args: Value) -> Result<ToolCall, ApiError> {
        let mut args = match args {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            _ => return Err(ApiError::invalid("", "arguments must be a JSON object")),
        };
        Ok(match name {
            "create_sandbox" => {
                ToolCall::CreateSandbox(Box::new(from_args::<CreateSandbox>(args)?.into_spec()?))
            }
            "list_sandboxes" => ToolCall::ListSandboxes {
                state: from_args::<wire::ListSandboxes>(args)?
                    .state
                    .map(Into::into),
            },
            "delete_sandbox" => ToolCall::DeleteSandbox { id: only_id(args)? },
            "changes" => ToolCall::Changes { id: only_id(args)? },
            "abort" => ToolCall::Abort { id: only_id(args)? },
            "exec" => exec(args)?,
            "run_code" => run_code(args)?,
            "read_file" => {
                let id = take_id(&mut args)?;
                let a: ReadArgs = from_args(args)?;
                let length = a.length.unwrap_or(DEFAULT_READ);
                if length == 0 || length > MAX_READ {
                    return Err(ApiError::invalid(
                        "length",
                        format!("length: must be from 1 to {MAX_READ}"),
                    ));
                }
                ToolCall::ReadFile {
                    id,
                    path: a.path,
                    offset: a.offset,
                    length,
                }
            }
            "write_file" => write(args)?,
            "list_files" => {
                let id = take_id(&mut args)?;
                let a: ListArgs = from_args(args)?;
                let limit = a.limit.unwrap_or(DEFAULT_LIST);
                if limit == 0 || limit > MAX_LIST {
                    return Err(ApiError::invalid(
                        "limit",
                        format!("limit: must be from 1 to {MAX_LIST}"),
                    ));
                }
                ToolCall::ListFiles {
                    id,
                    path: a.path,
                    recursive: a.recursive,
                    hidden: a.hidden,
                    limit,
                }
            }
            "diff" => {
                let id = take_id(&mut args)?;
                let q: DiffQuery = from_args(args)?;
                ToolCall::Diff {
                    id,
                    path: q.path()?,
                }
            }
            "snapshot" => {
                let id = take_id(&mut args)?;
                let r: wire::SnapshotRequest = from_args(args)?;
                ToolCall::Snapshot {
                    id,
                    options: lockbox_runtime::SnapshotOptions {
                        name: r.name,
                        include_tmp: r.include_tmp,
                    },
                }
            }
            "list_snapshots" => {
                from_args::<NoArgs>(args)?;
                ToolCall::ListSnapshots
            }
            "fork" => {
                let snapshot = take_snapshot_id(&mut args)?;
                let r: wire::ForkRequest = from_args(args)?;
                if r.count == 0 {
                    return Err(ApiError::invalid("count", "count: at least 1"));
                }
                ToolCall::Fork {
                    snapshot,
                    count: r.count,
                }
            }
            "restore" => {
                let id = take_id(&mut args)?;
                let snapshot = take_snapshot_id(&mut args)?;
                from_args::<NoArgs>(args)?;
                ToolCall::Restore { id, snapshot }
            }
            "delete_snapshot" => {
                let snapshot = take_snapshot_id(&mut args)?;
                from_args::<NoArgs>(args)?;
                ToolCall::DeleteSnapshot { snapshot }
            }
            "commit" => {
                let id = take_id(&mut args)?;
                ToolCall::Commit {
                    id,
                    selection: from_args::<wire::Commit>(args)?.into_selection(),
                }
            }
            other => {
                return Err(ApiError::new(
                    lockbox_policy::ErrorCode::NotFound,
                    format!("unknown tool {other}"),
                ))
            }
        })
    }
}

fn exec(mut args: Map<String, Value>) -> Result<ToolCall, ApiError> {
    let id = take_id(&mut args)?;
    let max_output = max_output(&mut args)?;
    if !args.contains_key("timeout_ms") {
        args.insert("timeout_ms".into(), json!(DEFAULT_EXEC_TIMEOUT_MS));
    }
    let request = from_args::<wire::Exec>(args)?.into_request()?;
    Ok(ToolCall::Exec {
        id,
        request,
        max_output,
    })
}

/// `run_code`'s arguments (but `sandbox_id` and `max_output_bytes`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RunCodeArgs {
    /// Python statements (the last expression's value is returned), or bash text.
    code: String,
    /// The context (interpreter) to run in, created on first use; the sandbox's default
    /// Python context when absent.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    context: Option<String>,
    /// The language of a context this call creates: python (default), bash or node.
    #[serde(default)]
    #[schema(value_type = Option<RunCodeLanguage>)]
    language: Option<String>,
    /// Interrupt the code after this long (default 120000).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2_592_000_000_u64)]
    timeout_ms: Option<u64>,
}

/// The languages of a code context.
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
enum RunCodeLanguage {
    Python,
    Bash,
    Node,
}

fn run_code(mut args: Map<String, Value>) -> Result<ToolCall, ApiError> {
    let id = take_id(&mut args)?;
    let max_output = max_output(&mut args)?;
    let a: RunCodeArgs = from_args(args)?;
    let context = a
        .context
        .unwrap_or_else(|| lockbox_runtime::DEFAULT_CONTEXT.to_owned());
    let request = wire::RunCode {
        code: a.code,
        timeout_ms: Some(a.timeout_ms.unwrap_or(DEFAULT_EXEC_TIMEOUT_MS)),
        env: Default::default(),
    }
    .into_request(context)?;
    let language = a.language.unwrap_or_else(|| "python".into());
    if lockbox_runtime::Language::from_name(&language).is_some() {
        Ok(ToolCall::RunCode {
            id,
            request,
            language,
            max_output,
        })
    } else {
        Err(ApiError::invalid(
            "language",
            format!("language: {language:?} is not python, bash or node"),
        ))
    }
}

/// Removes and checks `max_output_bytes`.
fn max_output(args: &mut Map<String, Value>) -> Result<usize, ApiError> {
    match args.remove("max_output_bytes") {
        None => Ok(DEFAULT_MAX_OUTPUT),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n <= MAX_OUTPUT)
            .ok_or_else(|| {
                ApiError::invalid(
                    "max_output_bytes",
                    format!("max_output_bytes: must be an integer from 0 to {MAX_OUTPUT}"),
                )
            }),
    }
}

fn write(mut args: Map<String, Value>) -> Result<ToolCall, ApiError> {
    let id = take_id(&mut args)?;
    let a: WriteArgs = from_args(args)?;
    let data = match (a.content, a.content_b64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => wire::decode_b64("content_b64", &b64)?,
        _ => {
            return Err(ApiError::invalid(
                "content",
                "give exactly one of content (text) and content_b64",
            ))
        }
    };
    let mode = wire::PutQuery {
        path: a.path.clone(),
        mode: a.mode,
    }
    .mode()?;
    Ok(ToolCall::WriteFile {
        id,
        path: a.path,
        data,
        mode,
    })
}

/// `sandbox_id` as the only argument.
fn only_id(mut args: Map<String, Value>) -> Result<String, ApiError> {
    let id = take_id(&mut args)?;
    match args.keys().next() {
        Some(extra) => Err(ApiError::invalid(
            extra,
            format!("invalid arguments: unknown field `{extra}`, expected only `sandbox_id`"),
        )),
        None => Ok(id),
    }
}

/// Removes and checks `sandbox_id`.
fn take_id(args: &mut Map<String, Value>) -> Result<String, ApiError> {
    match args.remove("sandbox_id") {
        Some(Value::String(id)) if !id.is_empty() => Ok(id),
        Some(_) => Err(ApiError::invalid(
            "sandbox_id",
            "sandbox_id: must be a non-empty string",
        )),
        None => Err(ApiError::invalid(
            "sandbox_id",
            "sandbox_id: missing (the id create_sandbox returned)",
        )),
    }
}

/// Removes and checks `snapshot_id`.
fn take_snapshot_id(args: &mut Map<String, Value>) -> Result<String, ApiError> {
    match args.remove("snapshot_id") {
        Some(Value::String(id)) if !id.is_empty() => Ok(id),
        Some(_) => Err(ApiError::invalid(
            "snapshot_id",
            "snapshot_id: must be a non-empty string",
        )),
        None => Err(ApiError::invalid(
            "snapshot_id",
            "snapshot_id: missing (the id snapshot or list_snapshots returned)",
        )),
    }
}

/// A tool without (further) arguments: any is an unknown field.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// Deserialises the (remaining) arguments, naming the offending field.
fn from_args<T: DeserializeOwned>(args: Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(args)).map_err(|e| {
        let field = crate::extract::field_of(&e.path().to_string(), &e.inner().to_string());
        let inner = e.into_inner();
        let message = if field.is_empty() {
            format!("invalid arguments: {inner}")
        } else {
            format!("invalid arguments: {field}: {inner}")
        };
        ApiError::invalid(&field, message)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn field_of_error(name: &str, args: Value) -> (String, String) {
        let e = ToolCall::parse(name, args).unwrap_err();
        assert_eq!(
            e.code,
            lockbox_policy::ErrorCode::InvalidRequest,
            "{}",
            e.message
        );
        (e.details["field"].as_str().unwrap().to_owned(), e.message)
    }

    #[test]
    fn every_schema_property_is_accepted_and_nothing_else() {
        // A property the schema offers must never be refused as unknown, an unknown one
        // must be, and every field the parser accepts must be in the schema.
        for (name, _, schema) in TOOLS {
            let schema = schema();
            let required = || {
                let mut args = json!({});
                for field in schema["required"].as_array().unwrap() {
                    let field = field.as_str().unwrap();
                    args[field] = json!(if field == "command" { "true" } else { "sb" });
                }
                args
            };
            for prop in schema["properties"].as_object().unwrap().keys() {
                let mut args = required();
                args[prop] = json!(null);
                if let Err(e) = ToolCall::parse(name, args) {
                    assert!(
                        !e.message.contains("unknown field"),
                        "{name}: schema property {prop} refused: {}",
                        e.message
                    );
                }
            }
            let mut args = required();
            args["no_such_argument"] = json!(1);
            let (field, message) = field_of_error(name, args);
            assert_eq!(field, "no_such_argument", "{name}");
            assert_eq!(schema["additionalProperties"], json!(false), "{name}");
            // And the other way: every field the parser names as accepted is offered.
            let accepted = message.split("expected").nth(1).unwrap_or("");
            for field in accepted.split('`').skip(1).step_by(2) {
                assert!(
                    schema["properties"].get(field).is_some(),
                    "{name}: accepts {field}, which its schema does not offer"
                );
            }
            assert!(!schema.to_string().contains("$ref"), "{name}: {schema}");
        }
    }

    #[test]
    fn bad_arguments_name_their_field() {
        assert_eq!(
            field_of_error("fork", json!({ "count": 2 })).0,
            "snapshot_id"
        );
        assert_eq!(
            field_of_error("fork", json!({ "snapshot_id": "s", "count": 0 })).0,
            "count"
        );
        assert_eq!(
            field_of_error("restore", json!({ "sandbox_id": "a" })).0,
            "snapshot_id"
        );
        assert_eq!(
            field_of_error("list_snapshots", json!({ "sandbox_id": "a" })).0,
            "sandbox_id"
        );
        assert_eq!(
            field_of_error("exec", json!({ "command": "ls" })).0,
            "sandbox_id"
        );
        assert_eq!(
            field_of_error("exec", json!({ "sandbox_id": "a" })).0,
            "command"
        );
        assert_eq!(
            field_of_error(
                "exec",
                json!({ "sandbox_id": "a", "command": "x", "timeout_ms": 0 })
            )
            .0,
            "timeout_ms"
        );
        assert_eq!(
            field_of_error(
                "exec",
                json!({ "sandbox_id": "a", "command": "x", "max_output_bytes": -1 })
            )
            .0,
            "max_output_bytes"
        );
        assert_eq!(
            field_of_error("create_sandbox", json!({ "workdir": "relative/dir" })).0,
            "workdir"
        );
        assert_eq!(
            field_of_error("create_sandbox", json!({ "max_memory": "lots" })).0,
            "max_memory"
        );
        assert_eq!(
            field_of_error("write_file", json!({ "sandbox_id": "a", "path": "f" })).0,
            "content"
        );
        assert_eq!(
            field_of_error(
                "write_file",
                json!({ "sandbox_id": "a", "path": "f", "content": "", "mode": "999" })
            )
            .0,
            "mode"
        );
        assert_eq!(
            field_of_error(
                "read_file",
                json!({ "sandbox_id": "a", "path": "f", "length": MAX_READ + 1 })
            )
            .0,
            "length"
        );
        assert_eq!(
            field_of_error("list_files", json!({ "sandbox_id": "a", "limit": 0 })).0,
            "limit"
        );
        assert_eq!(
            field_of_error("commit", json!({ "sandbox_id": "a", "only": "not-a-list" })).0,
            "only"
        );
        assert_eq!(
            field_of_error("diff", json!({ "sandbox_id": "a" })).0,
            "path"
        );
        assert_eq!(field_of_error("abort", json!([1])).0, "");
    }

    #[test]
    fn exec_defaults_to_a_two_minute_timeout_and_64k_of_output() {
        let call =
            ToolCall::parse("exec", json!({ "sandbox_id": "a", "command": "make" })).unwrap();
        let ToolCall::Exec {
            request,
            max_output,
            ..
        } = call
        else {
            panic!("not an exec: {call:?}");
        };
        assert_eq!(
            request.timeout,
            Some(std::time::Duration::from_millis(DEFAULT_EXEC_TIMEOUT_MS))
        );
        assert_eq!(max_output, DEFAULT_MAX_OUTPUT);
    }

    /// Issue 32: MCP's commit takes the review it follows, as a token or as the paths shown
    /// with their digests (what `changes` / `diff` give), into the runtime's selection.
    #[test]
    fn commit_takes_the_review_it_follows() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let selection = |review: Value| match ToolCall::parse(
            "commit",
            json!({ "sandbox_id": "a", "review": review }),
        ) {
            Ok(ToolCall::Commit { selection, .. }) => selection.review,
            other => panic!("{other:?}"),
        };
        assert!(matches!(
            selection(json!(digest)),
            Some(lockbox_runtime::Reviewed::Token(t)) if t.to_string() == digest
        ));
        let Some(lockbox_runtime::Reviewed::Paths(review)) =
            selection(json!([{ "path": "f", "digest": digest }]))
        else {
            panic!("not paths")
        };
        assert_eq!(
            review
                .digest(std::path::Path::new("f"))
                .map(|d| d.to_string()),
            Some(digest)
        );
        let (_, message) =
            field_of_error("commit", json!({ "sandbox_id": "a", "review": "sha256:0" }));
        assert!(message.contains("review digest"), "{message}");
    }

    #[test]
    fn tool_descriptions_name_their_errors() {
        for def in definitions() {
            let text = def["description"].as_str().unwrap();
            let name = def["name"].as_str().unwrap();
            if name != "list_sandboxes" {
                assert!(text.contains("Errors:"), "{name} does not list its errors");
            }
        }
    }
}
