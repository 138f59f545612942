//! `lockbox mcp` as a process: it answers one JSON-RPC line per request on stdout, commits a
//! workdir change through its tools, and exits 0 once stdin closes, its sandbox deleted.
//! As the current user and (when root) as uid 65534. The tools themselves are tested with
//! the official MCP SDK in python/tests/test_mcp.py.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{command_as, give, lockbox, scratch, text, users};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

struct Client {
    stdin: Option<std::process::ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Client {
    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.next += 1;
        let msg = json!({ "jsonrpc": "2.0", "id": self.next, "method": "tools/call",
                          "params": { "name": tool, "arguments": arguments } });
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let reply: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(reply["id"], self.next, "{reply}");
        reply["result"].clone()
    }
}

#[test]
fn mcp_commits_a_workdir_change_and_exits_when_stdin_closes() {
    for user in users() {
        let tmp = scratch();
        let repo = tmp.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        give(tmp.path(), user);
        let state = tmp.path().join("state");
        let mut child = command_as(user)
            .args(["mcp", "--state-dir", state.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut client = Client {
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            next: 0,
        };
        let created = client.call("create_sandbox", json!({ "workdir": repo }));
        assert_eq!(created["isError"], false, "{user:?}: {created}");
        let id = created["structuredContent"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let ran = client.call(
            "exec",
            json!({ "sandbox_id": id, "command": "echo hi > f && id -u", "cwd": repo }),
        );
        assert_eq!(ran["structuredContent"]["exit_code"], 0, "{user:?}: {ran}");
        assert!(!repo.join("f").exists(), "written before the commit");
        let committed = client.call("commit", json!({ "sandbox_id": id }));
        assert_eq!(committed["isError"], false, "{user:?}: {committed}");
        assert_eq!(std::fs::read_to_string(repo.join("f")).unwrap(), "hi\n");

        drop(client.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "{user:?}: still running after stdin closed"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{user:?}: {status}");
    }
}

#[test]
fn mcp_refuses_a_zero_limit_as_a_usage_error() {
    let tmp = scratch();
    let out = lockbox(
        common::User::Current,
        tmp.path(),
        &["mcp", "--max-sandboxes", "0"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--max-sandboxes"), "{}", text(&out));
}
