//! The examples of docs/transactions.md (the RFC's four, done with the CLI) run as written:
//! every ```sh block after an `<!-- example -->` line runs with bash in one scratch
//! repository (in document order, with `lockbox` on PATH and `LOCKBOX_STATE_DIR` set), and
//! its stdout must equal the ```text block that follows it — so the docs cannot rot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{binary, scratch};
use std::path::Path;
use std::process::Command;

/// (script, expected stdout) of every example, in order.
fn examples(doc: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = doc;
    while let Some(at) = rest.find("<!-- example -->\n") {
        rest = &rest[at + "<!-- example -->\n".len()..];
        let block = |s: &str, lang: &str| -> (String, usize) {
            let open = format!("```{lang}\n");
            assert!(s.starts_with(&open), "expected a ```{lang} block: {s:.80}");
            let body = &s[open.len()..];
            let end = body.find("\n```").unwrap();
            (
                body[..end + 1].to_owned(),
                open.len() + end + "\n```\n".len(),
            )
        };
        let (script, used) = block(rest, "sh");
        rest = &rest[used..];
        let (expected, used) = block(rest, "text");
        rest = &rest[used..];
        out.push((script, expected));
    }
    out
}

#[test]
fn the_documented_transaction_examples_run_and_print_what_the_docs_say() {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/transactions.md"),
    )
    .unwrap();
    let examples = examples(&doc);
    assert!(
        examples.len() >= 5,
        "found only {} examples",
        examples.len()
    );
    let tmp = scratch();
    let (repo, state) = (tmp.path().join("repo"), tmp.path().join("state"));
    std::fs::create_dir(&repo).unwrap();
    let path = format!(
        "{}:{}",
        binary().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (i, (script, expected)) in examples.iter().enumerate() {
        let out = Command::new("bash")
            .args(["-e", "-o", "pipefail", "-c", script])
            .current_dir(&repo)
            .env("PATH", &path)
            .env("LOCKBOX_STATE_DIR", &state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "example {} failed ({}):\n{script}\nstderr: {}",
            i + 1,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            *expected,
            "example {} printed something else:\n{script}",
            i + 1
        );
    }
}
