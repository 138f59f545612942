//! What the `lockbox serve` tests share: a served binary, SSE parsing, output fields.
#![allow(dead_code)]

pub mod shape;

use crate::common::{command_as, give, scratch, User};
use base64::Engine;
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Output bytes the server sent once: as text (`name`) or base64 (`name_b64`), never both.
pub fn output_bytes(value: &Value, name: &str) -> Vec<u8> {
    let text = value.get(name);
    let b64 = value.get(format!("{name}_b64"));
    assert!(
        text.is_some() != b64.is_some(),
        "exactly one of {name} and {name}_b64 in {value}"
    );
    match (text, b64) {
        (Some(t), _) => t.as_str().unwrap().as_bytes().to_vec(),
        (_, Some(b)) => B64.decode(b.as_str().unwrap()).unwrap(),
        _ => Vec::new(),
    }
}

/// A running `lockbox serve`; SIGTERMed and reaped on drop.
pub struct Served {
    pub child: Child,
    pub base: String,
    pub token: String,
    pub client: reqwest::Client,
    /// `host:port` of the ports listener, if it has one.
    pub ports_listen: Option<String>,
}

impl Served {
    pub fn start(user: User, state: &Path, extra: &[&str]) -> Served {
        Served::spawn(command_as(user), "127.0.0.1:0", state, extra)
    }

    /// As [`Served::start`], with environment variables set.
    pub fn start_with_env(user: User, state: &Path, env: &[(&str, &Path)]) -> Served {
        let mut command = command_as(user);
        for (name, value) in env {
            command.env(name, value);
        }
        Served::spawn(command, "127.0.0.1:0", state, &[])
    }

    /// As [`Served::start`], with environment variables set and `extra` arguments.
    pub fn start_with_env_args(
        user: User,
        state: &Path,
        env: &[(&str, &std::ffi::OsStr)],
        extra: &[&str],
    ) -> Served {
        let mut command = command_as(user);
        for (name, value) in env {
            command.env(name, value);
        }
        Served::spawn(command, "127.0.0.1:0", state, extra)
    }

    /// As [`Served::start`], on `--listen listen`.
    pub fn start_listening(user: User, listen: &str, state: &Path) -> Served {
        Served::spawn(command_as(user), listen, state, &[])
    }

    /// As [`Served::start`], with soft and hard limits of `nofile` open files.
    pub fn start_with_fd_limit(user: User, state: &Path, nofile: u64, extra: &[&str]) -> Served {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
            .arg(crate::common::binary());
        if let User::Nobody = user {
            command.uid(65534).gid(65534);
        }
        Served::spawn(command, "127.0.0.1:0", state, extra)
    }

    /// As [`Served::start`], with the server's stderr piped to the caller.
    pub fn start_with_stderr(user: User, state: &Path) -> (Served, std::process::ChildStderr) {
        let mut command = command_as(user);
        command.stderr(Stdio::piped()).env_remove("LOCKBOX_LOG");
        let mut served = Served::spawn(command, "127.0.0.1:0", state, &[]);
        let stderr = served.child.stderr.take().unwrap();
        (served, stderr)
    }

    /// As [`Served::start_with_stderr`], in a user and mount namespace of its own whose
    /// `state` is a fresh tmpfs mounted `noexec`.
    pub fn start_on_noexec_state(user: User, state: &Path) -> (Served, std::process::ChildStderr) {
        let mut command = Command::new("unshare");
        command
            .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
            .arg(r#"mount -t tmpfs -o noexec,mode=0700 noexec-state "$NOEXEC_STATE" && exec "$0" "$@""#)
            .arg(crate::common::binary())
            .env("NOEXEC_STATE", state)
            .stderr(Stdio::piped())
            .env_remove("LOCKBOX_LOG");
        if let User::Nobody = user {
            command.uid(65534).gid(65534);
        }
        let mut served = Served::spawn(command, "127.0.0.1:0", state, &[]);
        let stderr = served.child.stderr.take().unwrap();
        (served, stderr)
    }

    /// As [`Served::start`], run by `command` (which runs the binary with the arguments it
    /// is given, as `prlimit ... BINARY` does).
    pub fn start_from(command: Command, state: &Path, extra: &[&str]) -> Served {
        Served::spawn(command, "127.0.0.1:0", state, extra)
    }

    /// Every live descendant of the server (its sandboxes' processes).
    pub fn descendants(&self) -> Vec<u32> {
        lockbox_testkit::descendants(self.child.id())
    }

    fn spawn(mut command: Command, listen: &str, state: &Path, extra: &[&str]) -> Served {
        let command = command
            .args(["serve", "--listen", listen, "--print-token", "--state-dir"])
            .arg(state)
            .args(extra)
            .stdout(Stdio::piped());
        // stderr: inherited unless the caller piped it.
        let mut child = command.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let info: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("first stdout line {line:?}: {e}"));
        Served {
            child,
            base: format!("http://{}", info["listen"].as_str().unwrap()),
            token: info["token"].as_str().unwrap().to_owned(),
            client: reqwest::Client::new(),
            ports_listen: info["ports_listen"].as_str().map(str::to_owned),
        }
    }

    /// `host:port` of the server.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// A field of `/proc/<server>/status` in KiB (`VmHWM`, `VmRSS`).
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    /// Descriptors the server holds.
    pub fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
    }

    /// Sends `body` as JSON; the status and the JSON reply, which must be what the OpenAPI
    /// document says this route answers ([`shape::check`]).
    pub async fn json(&self, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self
            .request(method.clone(), path)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
        };
        shape::check(&method, path, status, &value);
        (status, value)
    }

    /// `GET files?path=PATH` of sandbox `id`, with a `Range` header when given.
    pub async fn get_file(&self, id: &str, path: &str, range: Option<&str>) -> reqwest::Response {
        let mut request = self.request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path={path}"),
        );
        if let Some(range) = range {
            request = request.header("Range", range);
        }
        request.send().await.unwrap()
    }

    /// Asserts that `GET files` of `path` with `range` answers 206 with `content_range` and
    /// `part`, or 416 (with `Content-Range: bytes */SIZE`) when `part` is `None`.
    pub async fn assert_file_range(
        &self,
        id: &str,
        path: &str,
        range: &str,
        content_range: &str,
        part: Option<&[u8]>,
    ) {
        let response = self.get_file(id, path, Some(range)).await;
        let expected = match part {
            Some(_) => StatusCode::PARTIAL_CONTENT,
            None => StatusCode::RANGE_NOT_SATISFIABLE,
        };
        assert_eq!(response.status(), expected, "{path} {range}");
        assert_eq!(
            response.headers()["content-range"],
            content_range,
            "{path} {range}"
        );
        if let Some(part) = part {
            assert_eq!(response.bytes().await.unwrap(), part, "{path} {range}");
        }
    }

    /// Creates a sandbox; its id.
    pub async fn sandbox(&self, body: Value) -> String {
        let (status, info) = self.json(Method::POST, "/v1/sandboxes", body).await;
        assert_eq!(status, StatusCode::CREATED, "{info}");
        assert_eq!(info["state"], "running");
        info["id"].as_str().unwrap().to_owned()
    }

    pub async fn exec(&self, id: &str, body: Value) -> Value {
        let (status, result) = self
            .json(Method::POST, &format!("/v1/sandboxes/{id}/exec"), body)
            .await;
        assert_eq!(status, StatusCode::OK, "{result}");
        result
    }

    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args(["-s", signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the server to exit; its exit code.
    pub fn wait(&mut self) -> Option<i32> {
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("lockbox serve did not exit within 30 s");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = std::process::Command::new("kill")
                .arg(self.child.id().to_string())
                .status();
            let _ = self.child.wait();
        }
    }
}

/// A state directory `user` owns.
pub fn state_dir(user: User) -> crate::common::Scratch {
    let dir = scratch();
    give(dir.path(), user);
    dir
}

/// One parsed SSE item: a comment (`: text`) or an event.
#[derive(Debug, Clone, Default)]
pub struct Sse {
    pub comment: Option<String>,
    pub event: String,
    pub data: String,
    pub id: Option<String>,
}

/// Reads SSE items from a response until `stop` says so (or the stream ends).
pub async fn read_sse(response: reqwest::Response, mut stop: impl FnMut(&Sse) -> bool) -> Vec<Sse> {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut items = Vec::new();
    while let Some(chunk) = body.next().await {
        buffer.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let mut item = Sse::default();
            for line in block.lines() {
                if let Some(c) = line.strip_prefix(':') {
                    item.comment = Some(c.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("event:") {
                    item.event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    item.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                } else if let Some(v) = line.strip_prefix("id:") {
                    item.id = Some(v.trim().to_owned());
                }
            }
            let done = stop(&item);
            items.push(item);
            if done {
                return items;
            }
        }
    }
    items
}

pub fn tokio() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}
