//! `lockbox journal` against a real SQLite journal written by the library.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{command_as, text, User};
use serde_json::json;

fn journal_cli(url: &str, args: &[&str]) -> std::process::Output {
    command_as(User::Current)
        .args(["journal", "--journal", url])
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn list_status_dump_and_fork_a_recorded_run() {
    let dir = tempfile::tempdir().unwrap();
    let steps = [
        ("llm", json!(1)),
        ("llm", json!(2)),
        ("tool", json!("done")),
    ];
    let url = common::journal::with_a_run(&dir.path().join("j.db"), "agent-1", &steps).await;

    let out = journal_cli(&url, &["list"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "agent-1",
        "{}",
        text(&out)
    );

    let out = journal_cli(&url, &["list", "--json"]);
    let ids: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids, ["agent-1"], "{}", text(&out));

    let out = journal_cli(&url, &["status", "agent-1"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["steps"], 3, "{status}");
    assert_eq!(status["state"], "running", "{status}");

    let out = journal_cli(&url, &["dump", "agent-1"]);
    let dump = String::from_utf8_lossy(&out.stdout);
    assert!(
        dump.contains("llm#2") && dump.contains("tool"),
        "{}",
        text(&out)
    );

    let out = journal_cli(&url, &["fork", "agent-1", "--from-step", "tool"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = journal_cli(&url, &["list"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        2,
        "{}",
        text(&out)
    );

    // Dump fails like status for a run that does not exist.
    let status = journal_cli(&url, &["status", "no-such-run"]);
    assert_eq!(status.status.code(), Some(1), "{}", text(&status));
    let dump = journal_cli(&url, &["dump", "no-such-run"]);
    assert_eq!(dump.status.code(), Some(1), "{}", text(&dump));
    assert_eq!(dump.stderr, status.stderr, "{}", text(&dump));
    assert!(String::from_utf8_lossy(&dump.stderr).contains("run no-such-run not found"));

    // The start entry's values are JSON, not Rust's `Some("…")`.
    assert!(
        !dump_text_has_debug(&url),
        "{}",
        text(&journal_cli(&url, &["dump", "agent-1"]))
    );
    let out = journal_cli("nosuchscheme:x", &["list"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

fn dump_text_has_debug(url: &str) -> bool {
    let out = journal_cli(url, &["dump", "agent-1"]);
    let dump = String::from_utf8_lossy(&out.stdout);
    dump.contains("Some(") || dump.contains("None")
}
