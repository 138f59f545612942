//! Code contexts: persistent interpreters (a Python or a bash runner) that the agent starts
//! like any command, and the typed frames the runtime exchanges with them.
//!
//! The runners are small programs embedded in this crate (`runners/python.py`,
//! `runners/bash.sh`, `runners/node.js`), run as `python3 -c SOURCE` / `bash -c SOURCE` /
//! `node -e SOURCE` by [`Op::ContextStart`]
//! under a subreaper shim, as the sandbox's user, inside every wall of the sandbox. Their
//! descriptors ([`Io::Runner`]): 0 `/dev/null`, 1 and 2 the user code's stdout and stderr
//! (pipes read by the runtime as they fill, so output streams), 3 events (runner → runtime),
//! 4 requests (runtime → runner). A request is `<length>\n<code>`, after an environment
//! frame when the run sets variables of its own (see [`encode_request`]); an event is
//! `<length>\n<json>` of a [`RunnerEvent`]; lengths are decimal byte counts, so that a bash
//! script can read them. Each run ends with [`RunnerEvent::Done`], written after the code's
//! output was flushed to fds 1 and 2.
//!
//! [`Op::ContextStart`]: crate::Op::ContextStart
//! [`Io::Runner`]: crate::Io::Runner

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The Python runner.
pub const PYTHON_RUNNER: &str = include_str!("runners/python.py");
/// The bash runner.
pub const BASH_RUNNER: &str = include_str!("runners/bash.sh");
/// The Node.js runner.
pub const NODE_RUNNER: &str = include_str!("runners/node.js");

/// The interpreters a context can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    /// `python3` (found on the context's `PATH`).
    Python,
    /// `bash`.
    Bash,
    /// `node` (Node.js, when the sandbox has it).
    Node,
}

impl Language {
    /// Every language, in the order they are documented.
    pub const ALL: &'static [Language] = &[Language::Python, Language::Bash, Language::Node];

    /// Its name on the wire (`python`, `bash`).
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
            Language::Node => "node",
        }
    }

    /// The language named `name` (`python`, `python3`, `bash`, `sh`, `node`, `javascript`,
    /// `js`), if there is one.
    pub fn from_name(name: &str) -> Option<Language> {
        match name {
            "python" | "python3" => Some(Language::Python),
            "bash" | "sh" => Some(Language::Bash),
            "node" | "javascript" | "js" => Some(Language::Node),
            _ => None,
        }
    }

    /// The command that runs this language's runner.
    pub fn argv(self) -> Vec<String> {
        match self {
            Language::Python => vec!["python3".into(), "-c".into(), PYTHON_RUNNER.into()],
            Language::Bash => vec![
                "bash".into(),
                "--noprofile".into(),
                "--norc".into(),
                "-c".into(),
                BASH_RUNNER.into(),
            ],
            // --expose-internals: for the REPL's rewrite of top-level await (see node.js).
            Language::Node => vec![
                "node".into(),
                "--expose-internals".into(),
                "-e".into(),
                NODE_RUNNER.into(),
            ],
        }
    }
}

/// How to start a context's runner ([`crate::Op::ContextStart`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContextSpec {
    /// The interpreter.
    pub language: Language,
    /// Working directory (default: the agent's).
    pub cwd: Option<String>,
    /// Variables set on top of the sandbox's environment.
    pub env: Vec<(String, String)>,
}

/// One rich result of a run: a MIME bundle, as IPython's `display_data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DisplayData {
    /// MIME type → value: text for `text/*` and `image/svg+xml`, base64 for binary types
    /// (`image/png`, `image/jpeg`, `application/pdf`), JSON for `application/json`.
    pub data: BTreeMap<String, serde_json::Value>,
    /// True for the value of the code's last expression (as opposed to `display()` calls
    /// and figures).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub is_main_result: bool,
}

/// An exception the code raised (Python), or why a run failed (`KeyboardInterrupt`,
/// `Timeout`, `InterpreterDied`, bash's `ExitCode`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecError {
    /// The exception's class name.
    pub name: String,
    /// Its message.
    pub value: String,
    /// The formatted traceback (empty when there is none).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub traceback: String,
}

/// A frame a runner sends on its events descriptor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunnerEvent {
    /// A rich result.
    Result(DisplayData),
    /// The code raised.
    Error(ExecError),
    /// The run is over (its output is in the pipes).
    Done {
        /// The exit status of the last command (bash); `None` for Python.
        #[serde(default)]
        exit_code: Option<i32>,
        /// The run was interrupted by SIGINT (bash).
        #[serde(default)]
        interrupted: bool,
    },
}

/// A request for a runner: `<length>\n<code>`, after `env <count>\n` and `count` frames
/// `<length>\nNAME=VALUE` when `env` is not empty. The runner sets those variables for
/// this run only, and gives each its earlier value (or none) back when the run ends.
pub fn encode_request(code: &str, env: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    if !env.is_empty() {
        out.extend_from_slice(format!("env {}\n", env.len()).as_bytes());
        for (name, value) in env {
            out.extend_from_slice(format!("{}\n", name.len() + 1 + value.len()).as_bytes());
            out.extend_from_slice(name.as_bytes());
            out.push(b'=');
            out.extend_from_slice(value.as_bytes());
        }
    }
    out.extend_from_slice(format!("{}\n", code.len()).as_bytes());
    out.extend_from_slice(code.as_bytes());
    out
}

/// What [`decode_event`] found at the start of a buffer.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A whole frame: its event and how many bytes it took.
    Event(Box<RunnerEvent>, usize),
    /// Not a whole frame yet.
    Incomplete,
    /// Not a frame (the runner is broken, or something else wrote to its descriptor).
    Invalid(String),
}

/// Longest event frame accepted (a large PNG is a few MiB of base64).
pub const MAX_EVENT: usize = 64 * 1024 * 1024;

/// Decodes the first event frame of `buf`.
pub fn decode_event(buf: &[u8]) -> Frame {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        return if buf.len() > 20 {
            Frame::Invalid("no length line".into())
        } else {
            Frame::Incomplete
        };
    };
    let len = match std::str::from_utf8(&buf[..nl])
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
    {
        Some(n) if n <= MAX_EVENT => n,
        Some(n) => return Frame::Invalid(format!("an event of {n} bytes")),
        None => return Frame::Invalid("a bad length line".into()),
    };
    let end = nl + 1 + len;
    if buf.len() < end {
        return Frame::Incomplete;
    }
    match serde_json::from_slice::<RunnerEvent>(&buf[nl + 1..end]) {
        Ok(ev) => Frame::Event(Box::new(ev), end),
        Err(e) => Frame::Invalid(format!("an unreadable event: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_event_frame_is_decoded_once_whole() {
        let json = br#"{"done":{"exit_code":3}}"#;
        let mut buf = format!("{}\n", json.len()).into_bytes();
        buf.extend_from_slice(json);
        assert_eq!(decode_event(&buf[..buf.len() - 1]), Frame::Incomplete);
        buf.extend_from_slice(b"7\n");
        match decode_event(&buf) {
            Frame::Event(ev, used) => {
                assert_eq!(
                    *ev,
                    RunnerEvent::Done {
                        exit_code: Some(3),
                        interrupted: false
                    }
                );
                assert_eq!(used, buf.len() - 2);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(decode_event(b"x\n{}"), Frame::Invalid(_)));
    }

    #[test]
    fn language_names_are_the_documented_ones() {
        for l in Language::ALL {
            assert_eq!(Language::from_name(l.as_str()), Some(*l));
        }
        assert_eq!(Language::from_name("cobol"), None);
    }
}
