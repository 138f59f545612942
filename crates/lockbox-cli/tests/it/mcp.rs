//! `lockbox mcp` as a process: it answers one JSON-RPC line per request on stdout, commits a
//! workdir change through its tools, and exits 0 once stdin closes, its sandbox deleted.
//! As the current user and (when root) as uid 65534. The tools themselves are tested with
//! the official MCP SDK in python/tests/test_mcp.py.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{command_as, give, lockbox, scratch, text, users};
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

struct Client {
    stdin: Option<std::process::ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
    next: u64,
}

/// `lockbox mcp` as `user` on state directory `state`, with `extra` flags.
fn spawn(user: common::User, state: &Path, extra: &[&OsStr]) -> (std::process::Child, Client) {
    let mut child = command_as(user)
        .arg("mcp")
        .arg("--state-dir")
        .arg(state)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let client = Client {
        stdin: child.stdin.take(),
        stdout: BufReader::new(child.stdout.take().unwrap()),
        next: 0,
    };
    (child, client)
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
        // The operator lets its agent work on this repository (issue 32: nothing by default).
        let (mut child, mut client) = spawn(
            user,
            &state,
            &["--allow-workdir".as_ref(), repo.as_os_str()],
        );
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

/// What a BEYOND_CEILING tool error says: (field, message).
fn refusal(result: &Value) -> (String, String) {
    assert_eq!(result["isError"], true, "{result}");
    let error = &result["structuredContent"];
    assert_eq!(error["code"], "BEYOND_CEILING", "{result}");
    (
        error["details"]["field"].as_str().unwrap().to_owned(),
        error["message"].as_str().unwrap().to_owned(),
    )
}

/// Issue 32: one `create_sandbox` asking for root's files, a writable host directory and the
/// host's network, then `exec "head -2 /etc/shadow; echo PWNED > .../f; curl ..."`, read the
/// shadow file, wrote the host and reached host loopback. Now each grant beyond the default
/// ceiling is refused naming its field and the ceiling, and an operator who widens the
/// ceiling gets exactly what it allows (resolved: a link out of an allowed root is out).
#[test]
fn issue_32_mcp_cannot_grant_itself_host_paths_writes_or_the_host_network() {
    for user in users() {
        let tmp = scratch();
        let allowed = tmp.path().join("x");
        let hostwrite = allowed.join("hostwrite");
        std::fs::create_dir_all(&hostwrite).unwrap();
        std::os::unix::fs::symlink("/etc", allowed.join("etc-link")).unwrap();
        give(tmp.path(), user);
        let (mut child, mut client) = spawn(user, &tmp.path().join("state"), &[]);
        let repro = json!({
            "default_reads": false,
            "fs_readable": ["/etc", "/usr", "/lib", "/lib64", "/bin", "/root"],
            "fs_writable": [hostwrite],
            "net": "host",
        });
        let (field, message) = refusal(&client.call("create_sandbox", repro));
        assert_eq!(field, "fs_readable", "{user:?}");
        assert!(
            message.contains("/etc") && message.contains("readable roots: none"),
            "{message}"
        );
        let (field, message) = refusal(&client.call(
            "create_sandbox",
            json!({ "fs_readable": ["/usr", "/etc/ssl"] }),
        ));
        assert_eq!(
            field, "fs_readable",
            "{user:?}: /etc/ssl holds private keys: {message}"
        );
        let (field, message) =
            refusal(&client.call("create_sandbox", json!({ "fs_writable": [hostwrite] })));
        assert_eq!(field, "fs_writable", "{user:?}");
        assert!(message.contains("writable roots: none"), "{message}");
        let (field, message) = refusal(&client.call("create_sandbox", json!({ "net": "host" })));
        assert_eq!(field, "net", "{user:?}");
        assert!(message.contains("network forms allowed: none"), "{message}");
        let (field, _) = refusal(&client.call("create_sandbox", json!({ "workdir": allowed })));
        assert_eq!(field, "workdir", "{user:?}");
        // Nothing was made, and nothing reached the host.
        let listed = client.call("list_sandboxes", json!({}));
        assert_eq!(
            listed["structuredContent"]["sandboxes"],
            json!([]),
            "{listed}"
        );
        assert_eq!(std::fs::read_dir(&hostwrite).unwrap().count(), 0);
        drop(client.stdin.take());
        assert!(child.wait().unwrap().success());

        // The operator widens the ceiling: writes below x/, the host's network; one sandbox.
        let profile = tmp.path().join("ceiling.toml");
        std::fs::write(&profile, "sandboxes = 1\n").unwrap();
        let (mut child, mut client) = spawn(
            user,
            &tmp.path().join("state"),
            &[
                "--ceiling".as_ref(),
                profile.as_os_str(),
                "--allow-write".as_ref(),
                allowed.as_os_str(),
                "--allow-net".as_ref(),
                "host".as_ref(),
            ],
        );
        let (field, message) = refusal(&client.call(
            "create_sandbox",
            json!({ "fs_readable": [allowed.join("etc-link")] }),
        ));
        assert_eq!(field, "fs_readable", "{user:?}");
        assert!(message.contains("resolved: /etc"), "{message}");
        let created = client.call(
            "create_sandbox",
            json!({ "fs_writable": [hostwrite], "net": "host" }),
        );
        assert_eq!(created["isError"], false, "{user:?}: {created}");
        let id = created["structuredContent"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let ran = client.call(
            "exec",
            json!({ "sandbox_id": id, "command": "head -2 /etc/shadow" }),
        );
        assert_ne!(
            ran["structuredContent"]["exit_code"], 0,
            "{user:?}: shadow read: {ran}"
        );
        let ran = client.call(
            "exec",
            json!({ "sandbox_id": id, "command": format!("echo ok > {}/f", hostwrite.display()) }),
        );
        assert_eq!(ran["structuredContent"]["exit_code"], 0, "{user:?}: {ran}");
        assert_eq!(
            std::fs::read_to_string(hostwrite.join("f")).unwrap(),
            "ok\n"
        );
        let (field, message) = refusal(&client.call("create_sandbox", json!({})));
        assert_eq!(field, "sandboxes", "{user:?}: {message}");
        drop(client.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

#[test]
fn mcp_names_a_bad_ceiling_profile_as_a_usage_error() {
    let tmp = scratch();
    let profile = tmp.path().join("ceiling.toml");
    std::fs::write(&profile, "reads = [\"/srv\"]\n").unwrap();
    let out = lockbox(
        common::User::Current,
        tmp.path(),
        &["mcp", "--ceiling", profile.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--ceiling") && text(&out).contains("reads"),
        "{}",
        text(&out)
    );
}
