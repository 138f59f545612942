//! Request bodies and query strings of the API, and their one conversion each into the
//! runtime's types. Unknown fields are refused everywhere; `*_ms` fields are milliseconds
//! (the only place units are bare numbers). Also the replies whose wire form differs from
//! the runtime's type ([`FileInfo`]: permission bits as octal text, as they are given;
//! [`SandboxInfo`] and the other records with a time: the time as RFC 3339 text).

mod approvals;
mod branches;
mod contexts;
mod files;
mod journal;
mod ports;
mod sandboxes;
mod sessions;
mod snapshots;
mod tokens;
mod transactions;

pub use approvals::*;
pub use branches::*;
pub use contexts::*;
pub use files::*;
pub use journal::*;
pub use ports::*;
pub use sandboxes::*;
pub use sessions::*;
pub use snapshots::*;
pub use tokens::*;
pub use transactions::*;

use crate::error::ApiError;
use base64::Engine;
use lockbox_policy::PolicyError;
use serde::Serialize;
use std::time::{Duration, SystemTime};
use utoipa::ToSchema;

/// Refuses a duration beyond `max` milliseconds (a deadline that far is a client bug, and
/// would overflow clock arithmetic further down).
pub fn check_ms(field: &str, value: Option<u64>, max: u64) -> Result<(), ApiError> {
    match value {
        Some(ms) if ms > max => Err(ApiError::invalid(
            field,
            format!("{field}: {ms} is more than the maximum {max}"),
        )),
        _ => Ok(()),
    }
}

/// A refused policy as `INVALID_REQUEST`, naming the field as the client spelled it.
fn policy_error(e: PolicyError) -> ApiError {
    let message = e.to_string();
    let (field, message) = match &e {
        PolicyError::RelativePath { field, .. }
        | PolicyError::ReservedPath { field, .. }
        | PolicyError::Invalid { field, .. } => {
            let wire = wire_field(field);
            // The policy names its own field (`fs.write: ...`); say it as the client did.
            let rest = message.strip_prefix(field).unwrap_or(&message);
            (wire, format!("{wire}{rest}"))
        }
        PolicyError::BadEnv { .. } => ("env", message),
        _ => ("", message),
    };
    ApiError::invalid(field, message)
}

/// A policy field as `/v1` and MCP name it (`fs.read` is `fs_readable`).
pub(crate) fn wire_field(policy_field: &'static str) -> &'static str {
    match policy_field {
        "fs.read" => "fs_readable",
        "fs.write" => "fs_writable",
        "timeout" => "timeout_ms",
        "kill_grace" => "kill_grace_ms",
        "cwd" => "cwd",
        "hostname" => "hostname",
        "limits.memory" => "max_memory",
        "limits.processes" => "max_processes",
        "limits.open_files" => "max_open_files",
        "limits.file_size" => "max_file_size",
        "limits.inodes" => "max_inodes",
        other => other,
    }
}

/// Decodes standard base64, naming the field on error.
pub fn decode_b64(field: &str, text: &str) -> Result<Vec<u8>, ApiError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| ApiError::invalid(field, format!("{field}: invalid base64: {e}")))
}

/// A time on the wire: RFC 3339 UTC with milliseconds (`2026-11-18T11:06:40.000Z`).
fn time(t: SystemTime) -> String {
    lockbox_policy::time::format(t)
}

/// Each of `items` in its wire form.
pub fn each<T, W: From<T>>(items: Vec<T>) -> Vec<W> {
    items.into_iter().map(W::from).collect()
}

/// A duration on the wire: whole milliseconds (saturating).
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `GET /healthz`. In the order of their names, as before.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Differs for every start of the server process: a fleet's router tells a node whose
    /// server restarted (same address, same token) by it.
    pub instance: &'static str,
    /// `ok`.
    pub status: &'static str,
    /// The server's version.
    pub version: &'static str,
}

/// `#[serde(serialize_with = "sorted_keys")]`: each item as a JSON object with its fields in
/// the order of their names, as the `json!` values these lists were once built as wrote
/// them (a client may compare bytes).
fn sorted_keys<T: Serialize, S: serde::Serializer>(items: &[T], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::{Error, SerializeSeq};
    let mut seq = s.serialize_seq(Some(items.len()))?;
    for item in items {
        seq.serialize_element(&serde_json::to_value(item).map_err(S::Error::custom)?)?;
    }
    seq.end()
}

/// `#[serde(default = "yes")]`: a flag that is on unless given.
fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use lockbox_runtime::SandboxState;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    /// The JSON the runtime's serde derives wrote before the wire forms moved here: the
    /// Python SDK and clients read it field for field.
    #[test]
    fn a_sandbox_record_keeps_its_wire_form_byte_for_byte() {
        let info = lockbox_runtime::SandboxInfo {
            id: "sb-1".into(),
            state: SandboxState::Stopped,
            created_at: lockbox_policy::time::from_unix(1_795_000_000, 5_000_000),
            workdir: Some(PathBuf::from("/w")),
            branch: Some(lockbox_runtime::BranchId::parse("b1").unwrap()),
            branch_action: Some(lockbox_runtime::BranchAction::Kept),
            labels: BTreeMap::from([("a".to_owned(), "b".to_owned())]),
            sessions: 1,
            processes: 2,
            policy: Some(lockbox_runtime::PolicySummary {
                net: lockbox_runtime::NetKind::None,
                net_destinations: Vec::new(),
                default_reads: true,
                fs_readable: vec![PathBuf::from("/r")],
                fs_writable: Vec::new(),
                max_memory_bytes: Some(1024),
                max_processes: None,
                max_cpu_time: Some(Duration::from_millis(1500)),
                max_file_size_bytes: None,
                idle_timeout: None,
                image: None,
            }),
            usage: Some(lockbox_runtime::ResourceUse {
                processes: 2,
                threads: 3,
                rss_bytes: 4096,
                cpu: Duration::from_millis(12),
            }),
        };
        assert_eq!(
            serde_json::to_string(&SandboxInfo::from(info)).unwrap(),
            concat!(
                r#"{"id":"sb-1","state":"stopped","created_at":"2026-11-18T11:06:40.005Z","#,
                r#""workdir":"/w","branch":"b1","branch_action":"kept","labels":{"a":"b"},"#,
                r#""sessions":1,"processes":2,"policy":{"net":"none","net_destinations":[],"#,
                r#""default_reads":true,"fs_readable":["/r"],"fs_writable":[],"#,
                r#""max_memory_bytes":1024,"max_processes":null,"max_cpu_time_ms":1500,"#,
                r#""max_file_size_bytes":null,"idle_timeout_ms":null,"image":null},"#,
                r#""usage":{"processes":2,"threads":3,"rss_bytes":4096,"cpu_ms":12}}"#
            )
        );
    }

    /// The typed replies that replaced `json!` values write the same bytes: fields in the
    /// order of their names, optional ones left out.
    #[test]
    fn changes_diffs_and_log_chunks_keep_their_wire_form_byte_for_byte() {
        use std::os::unix::ffi::OsStrExt;
        let digest: lockbox_runtime::ContentDigest =
            format!("sha256:{}", "ab".repeat(32)).parse().unwrap();
        let change = lockbox_runtime::Change {
            path: PathBuf::from("d/f"),
            kind: lockbox_cow::ChangeKind::Modified,
            file_type: lockbox_cow::FileType::File,
            size: 3,
            mode: 0o100644,
        };
        let odd = PathBuf::from(std::ffi::OsStr::from_bytes(b"\xff"));
        let plain = ReviewReply::from(vec![lockbox_runtime::Change {
            path: odd.clone(),
            ..change.clone()
        }]);
        assert_eq!(
            serde_json::to_string(&plain).unwrap(),
            r#"{"changes":[{"file_type":"file","kind":"modified","mode":"0644","path":{"bytes":"/w=="},"size":3}]}"#
        );
        let review = ReviewReply::from(vec![lockbox_runtime::ReviewedChange {
            change: change.clone(),
            digest,
        }]);
        let json = serde_json::to_string(&review).unwrap();
        let d = digest.to_string();
        assert!(
            json.starts_with(&format!(
                r#"{{"changes":[{{"digest":"{d}","file_type":"file","kind":"modified","mode":"0644","path":"d/f","size":3}}],"review_token":"sha256:"#
            )),
            "{json}"
        );

        let hunk = lockbox_runtime::Hunk {
            index: 0,
            old_start: 1,
            old_lines: 1,
            new_start: 1,
            new_lines: 2,
            lines: vec![
                lockbox_runtime::HunkLine {
                    op: lockbox_runtime::LineOp::Context,
                    text: "a".into(),
                },
                lockbox_runtime::HunkLine {
                    op: lockbox_runtime::LineOp::Insert,
                    text: "b".into(),
                },
            ],
            no_newline_old: false,
            no_newline_new: true,
        };
        let text = FileDiffReply::new(
            PathBuf::from("f"),
            (
                lockbox_runtime::FileHunks::Text { hunks: vec![hunk] },
                digest,
            ),
        );
        assert_eq!(
            serde_json::to_string(&text).unwrap(),
            format!(
                concat!(
                    r#"{{"digest":"{}","hunks":[{{"header":"@@ -1 +1,2 @@","index":0,"#,
                    r#""lines":[{{"op":" ","text":"a"}},{{"op":"+","text":"b"}}],"new_lines":2,"#,
                    r#""new_start":1,"no_newline_new":true,"no_newline_old":false,"old_lines":1,"#,
                    r#""old_start":1}}],"kind":"text","path":"f"}}"#
                ),
                d
            )
        );
        let summary = FileDiffReply::new(
            odd,
            (
                lockbox_runtime::FileHunks::Summary {
                    old: lockbox_runtime::Side::File { size: 4 },
                    new: lockbox_runtime::Side::Symlink {
                        target: PathBuf::from("t"),
                    },
                },
                digest,
            ),
        );
        assert_eq!(
            serde_json::to_string(&summary).unwrap(),
            format!(
                concat!(
                    r#"{{"digest":"{}","kind":"summary","new":{{"target":"t","type":"symlink"}},"#,
                    r#""old":{{"size":4,"type":"file"}},"path":{{"bytes":"/w=="}}}}"#
                ),
                d
            )
        );

        let chunk = lockbox_runtime::LogChunk {
            segments: vec![
                lockbox_runtime::LogSegment {
                    stream: lockbox_runtime::OutputStream::Stdout,
                    offset: 0,
                    data: bytes::Bytes::from_static(b"hi\n"),
                },
                lockbox_runtime::LogSegment {
                    stream: lockbox_runtime::OutputStream::Stderr,
                    offset: 3,
                    data: bytes::Bytes::from_static(b"\xff"),
                },
            ],
            next: 4,
            truncated: false,
            eof: true,
        };
        assert_eq!(
            serde_json::to_string(&LogChunk::from(&chunk)).unwrap(),
            concat!(
                r#"{"eof":true,"next":4,"segments":[{"data":"hi\n","offset":0,"stream":"stdout"},"#,
                r#"{"data_b64":"/w==","offset":3,"stream":"stderr"}],"truncated":false}"#
            )
        );
    }

    /// A context's language is checked at the edge; the runtime gets a `Language`.
    #[test]
    fn an_unknown_context_language_is_invalid_request_naming_language() {
        let body: CreateContext = serde_json::from_str(r#"{"language": "cobol"}"#).unwrap();
        let err = body.into_options().unwrap_err();
        assert_eq!(err.code, lockbox_policy::ErrorCode::InvalidRequest);
        assert_eq!(err.details["field"], "language");
        assert!(
            err.message.contains("python, bash, node"),
            "{}",
            err.message
        );
        let body: CreateContext = serde_json::from_str(r#"{"language": "js"}"#).unwrap();
        assert_eq!(
            body.into_options().unwrap().language,
            lockbox_runtime::Language::Node
        );
    }

    #[test]
    fn an_execution_and_a_commit_summary_keep_their_wire_form() {
        let mut exec = lockbox_runtime::Execution::in_context("c1".into());
        exec.logs.stdout.push("a".into());
        exec.error = Some(lockbox_runtime::ExecError {
            name: "E".into(),
            value: "v".into(),
            traceback: "t".into(),
        });
        exec.duration_ms = 7;
        assert_eq!(
            serde_json::to_string(&Execution::from(exec)).unwrap(),
            concat!(
                r#"{"context":"c1","results":[],"logs":{"stdout":["a"],"stderr":[]},"#,
                r#""error":{"name":"E","value":"v","traceback":"t"},"exit_code":null,"#,
                r#""timed_out":false,"state_lost":false,"truncated":false,"duration_ms":7}"#
            )
        );
        let summary = lockbox_runtime::CommitSummary {
            report: lockbox_runtime::CommitReport::default(),
            remaining: 2,
        };
        let json = serde_json::to_value(CommitSummary::from(summary)).unwrap();
        assert_eq!(json["remaining"], 2);
        assert_eq!(json["report"]["added"], 0);
    }
}
