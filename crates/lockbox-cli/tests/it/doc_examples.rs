//! Every shell example of README.md and docs/*.md runs as written, and every relative link
//! there leads somewhere.
//!
//! The convention (also in docs/architecture.md, "Examples in these docs"):
//! - a fenced block whose info string is `sh` or `bash` is a shell example, `python` a Python
//!   example (run by python/tests/test_docs_examples.py); other blocks are not run;
//! - an example runs in a fresh copy of `tests/docs-scratch/` (plus `runs.db`, a journal
//!   with the run `agent-1`; `home/` as `$HOME`; `state/` as `$LOCKBOX_STATE_DIR`), shell
//!   ones with `bash -e -o pipefail` and the freshly built `lockbox` first on `PATH`, and
//!   must exit 0;
//! - the line just before the fence may say otherwise:
//!   `<!-- example: exit N -->` (the block must exit with N),
//!   `<!-- example: session NAME -->` (the blocks of one document with this marker run as
//!   one script, in order, in one scratch directory, and must exit 0: docs/server.md's
//!   examples after its setup block),
//!   `<!-- example: no-run (REASON) -->` (not run: it needs a server, the internet, root, a
//!   long build, ...; the reason is required), or `<!-- example -->` (docs/transactions.md:
//!   run by tests/docs.rs, which also compares the output).
//!
//! Shell examples run as the current user and, when the tests run as root, as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{binary, give, scratch, users, User};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// What the line before a block's fence asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// Run; it must exit with this code.
    Exit(i32),
    /// Not run, for this reason.
    NoRun(String),
    /// Run by tests/docs.rs.
    Compared,
    /// Run with the other blocks of this session of the document, as one script.
    Session(String),
}

/// One fenced block of a document.
#[derive(Debug)]
struct Block {
    /// `file:line` of the opening fence.
    at: String,
    mode: Mode,
    body: String,
}

/// The fenced blocks of `doc` (named `name` in messages) whose info string is one of
/// `langs`; a malformed marker is an error naming where it is.
fn blocks(name: &str, doc: &str, langs: &[&str]) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = doc.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let lang = info.trim().to_owned();
        let mut body = String::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            body.push_str(lines[i]);
            body.push('\n');
            i += 1;
        }
        i += 1;
        if !langs.contains(&lang.as_str()) {
            continue;
        }
        let at = format!("{name}:{}", start + 1);
        let before = if start > 0 {
            lines[start - 1].trim()
        } else {
            ""
        };
        let mode = if before == "<!-- example -->" {
            Mode::Compared
        } else if let Some(marker) = before
            .strip_prefix("<!-- example:")
            .and_then(|m| m.strip_suffix("-->"))
        {
            let marker = marker.trim();
            if let Some(reason) = marker.strip_prefix("no-run") {
                let reason = reason.trim();
                match reason.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
                    Some(r) if !r.trim().is_empty() => Mode::NoRun(r.trim().to_owned()),
                    _ => return Err(format!("{at}: `no-run` needs a reason in parentheses")),
                }
            } else if let Some(session) = marker.strip_prefix("session ") {
                Mode::Session(session.trim().to_owned())
            } else if let Some(code) = marker.strip_prefix("exit ") {
                Mode::Exit(
                    code.trim()
                        .parse()
                        .map_err(|_| format!("{at}: bad exit code {code:?}"))?,
                )
            } else {
                return Err(format!("{at}: unknown example marker {before:?}"));
            }
        } else if before.starts_with("<!-- example") {
            return Err(format!("{at}: unknown example marker {before:?}"));
        } else {
            Mode::Exit(0)
        };
        out.push(Block { at, mode, body });
    }
    Ok(out)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and docs/*.md: (name relative to the repository, text).
fn documents() -> Vec<(String, String)> {
    let root = repo_root();
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root.join(&n)).unwrap();
            (n, text)
        })
        .collect()
}

/// The journal of the examples: run `agent-1` with the steps `llm`, `llm#2`, `llm#3`, `tool`.
fn journal(path: &Path) {
    use lockbox_journal::{Journal, RunId, SqliteStorage, StartOptions};
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let journal = Journal::open(Arc::new(SqliteStorage::open(path).unwrap()));
        let run = journal
            .start(&RunId::parse("agent-1").unwrap(), StartOptions::default())
            .await
            .unwrap();
        for n in 1..=3u32 {
            let _: u32 = run
                .record("llm", || async move { Ok::<_, String>(n) })
                .await
                .unwrap();
        }
        let _: String = run
            .record("tool", || async { Ok::<_, String>("done".into()) })
            .await
            .unwrap();
    });
}

/// Copies `from` into `to` (directories, files with their modes).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A fresh scratch directory for one example, owned by `user`.
fn prepare(dir: &Path, user: User) {
    copy_tree(&repo_root().join("tests/docs-scratch"), dir);
    journal(&dir.join("runs.db"));
    std::fs::create_dir_all(dir.join("home/.cache/pip")).unwrap();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    give(dir, user);
    // A transaction's base check counts a change within the clock tick it began in as a
    // change (docs/transactions.md): let the tick pass after writing the files.
    std::thread::sleep(std::time::Duration::from_millis(50));
}

/// The blocks of one document with each session's blocks joined into one, which must exit
/// 0 and is named after the session's first block.
fn sessions(blocks: Vec<Block>) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::new();
    let mut joined: Vec<(String, usize)> = Vec::new();
    for b in blocks {
        let Mode::Session(name) = &b.mode else {
            out.push(b);
            continue;
        };
        let part = format!("# --- {}\n{}", b.at, b.body);
        match joined.iter().find(|(n, _)| n == name) {
            Some(&(_, i)) => out[i].body.push_str(&part),
            None => {
                joined.push((name.clone(), out.len()));
                out.push(Block {
                    at: format!("{} (session {name})", b.at),
                    mode: Mode::Exit(0),
                    body: part,
                });
            }
        }
    }
    out
}

/// Runs one shell block in `dir` as `user`: `None` if it exits as its marker says, else
/// what went wrong.
fn run_shell(block: &Block, dir: &Path, user: User) -> Option<String> {
    let Mode::Exit(expected) = block.mode else {
        return None;
    };
    let path = format!(
        "{}:{}",
        binary().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("timeout");
    // A guard against a hanging example, not a timing assert.
    cmd.args(["120", "bash", "-e", "-o", "pipefail", "-c", &block.body])
        .current_dir(dir)
        .env("PATH", path)
        .env("HOME", dir.join("home"))
        .env("LOCKBOX_STATE_DIR", dir.join("state"))
        .env_remove("LOCKBOX_JOURNAL");
    if let User::Nobody = user {
        cmd.uid(65534).gid(65534);
    }
    // Output to files and a process group of its own: something an example leaves running
    // in the background cannot hold the test up, and is killed when the block ends.
    let (stdout, stderr) = (dir.with_extension("stdout"), dir.with_extension("stderr"));
    cmd.stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .process_group(0);
    let mut child = cmd.spawn().unwrap();
    let status = child.wait().unwrap();
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(std::process::Stdio::null())
        .status();
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let (out, err) = (read(&stdout), read(&stderr));
    let _ = (std::fs::remove_file(&stdout), std::fs::remove_file(&stderr));
    if status.code() == Some(expected) {
        return None;
    }
    Some(format!(
        "{} ({:?}): exited {:?}, the doc says {expected}\n{}\n--- stdout:\n{out}--- stderr:\n{err}",
        block.at,
        user,
        status.code(),
        block.body,
    ))
}

#[test]
fn every_runnable_shell_example_in_the_docs_exits_as_documented() {
    let mut runnable = Vec::new();
    for (name, text) in documents() {
        runnable.extend(sessions(blocks(&name, &text, &["sh", "bash"]).unwrap()));
    }
    runnable.retain(|b| matches!(b.mode, Mode::Exit(_)));
    assert!(
        runnable.len() >= 5,
        "found only {} runnable shell examples",
        runnable.len()
    );
    let tmp = scratch();
    let mut failures = Vec::new();
    for user in users() {
        for (i, block) in runnable.iter().enumerate() {
            let dir = tmp.path().join(format!("{user:?}-{i}"));
            prepare(&dir, user);
            failures.extend(run_shell(block, &dir, user));
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn an_example_that_exits_otherwise_than_documented_is_reported_where_it_is() {
    let doc = "# t\n\n```sh\ntrue\nfalse\necho unreached\n```\n\n<!-- example: exit 3 -->\n\
               ```sh\nexit 3\n```\n\n<!-- example: exit 3 -->\n```bash\ntrue\n```\n\n\
               <!-- example: no-run (needs a server) -->\n```sh\nexit 9\n```\n";
    let blocks = blocks("t.md", doc, &["sh", "bash"]).unwrap();
    assert_eq!(blocks.len(), 4);
    assert_eq!(blocks[3].mode, Mode::NoRun("needs a server".into()));
    let tmp = scratch();
    let results: Vec<Option<String>> = blocks
        .iter()
        .map(|b| run_shell(b, tmp.path(), User::Current))
        .collect();
    let first = results[0].as_deref().unwrap();
    assert!(
        first.starts_with("t.md:3 ") && first.contains("exited Some(1), the doc says 0"),
        "{first}"
    );
    assert_eq!(results[1], None);
    assert!(results[2].as_deref().unwrap().starts_with("t.md:15 "));
    assert_eq!(results[3], None);
}

#[test]
fn the_blocks_of_a_session_run_as_one_script_in_order() {
    let doc = "<!-- example: session s -->\n```sh\nx=1\n```\n\n```sh\nexit 0\n```\n\
               <!-- example: session s -->\n```sh\ntest \"$x\" = 1\n```\n\
               <!-- example: session t -->\n```sh\ntest \"$x\" = 1\n```\n";
    let run = sessions(blocks("s.md", doc, &["sh"]).unwrap());
    let at: Vec<&str> = run.iter().map(|b| b.at.as_str()).collect();
    assert_eq!(at, ["s.md:2 (session s)", "s.md:6", "s.md:14 (session t)"]);
    let tmp = scratch();
    assert_eq!(run_shell(&run[0], tmp.path(), User::Current), None);
    let other = run_shell(&run[2], tmp.path(), User::Current).unwrap();
    assert!(other.starts_with("s.md:14 (session t) "), "{other}");
}

#[test]
fn a_malformed_example_marker_is_an_error_naming_where_it_is() {
    for (marker, says) in [
        ("<!-- example: no-run -->", "needs a reason"),
        ("<!-- example: exit one -->", "bad exit code"),
        ("<!-- example: skip -->", "unknown example marker"),
    ] {
        let doc = format!("text\n{marker}\n```sh\ntrue\n```\n");
        let err = blocks("d.md", &doc, &["sh"]).unwrap_err();
        assert!(err.starts_with("d.md:3: ") && err.contains(says), "{err}");
    }
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of the headings of a Markdown text (outside fenced blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The relative links of the document `name` (relative to `root`) that lead nowhere, as
/// `name:line: target`.
fn broken_links(root: &Path, name: &str, text: &str) -> Vec<String> {
    let dir = root.join(name).parent().unwrap().to_owned();
    let mut broken = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || line.trim_start().starts_with("```") {
            continue;
        }
        // Code spans (`...`) are not links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            rest = &rest[end..];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let ok = if file.is_empty() {
                anchors(text).iter().any(|a| a == frag)
            } else {
                let path = dir.join(file);
                path.exists()
                    && (frag.is_empty()
                        || std::fs::read_to_string(&path)
                            .is_ok_and(|t| anchors(&t).iter().any(|a| a == frag)))
            };
            if !ok {
                broken.push(format!("{name}:{}: {target}", n + 1));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_leads_to_a_file_or_heading_of_the_repository() {
    let root = repo_root();
    let broken: Vec<String> = documents()
        .iter()
        .flat_map(|(name, text)| broken_links(&root, name, text))
        .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_link_to_a_missing_file_or_heading_is_reported_where_it_is() {
    let root = repo_root();
    let doc = "# Top: a `b`\n\nSee [top](#top-a-b), [security](security.md#threat-model),\n\
               [gone](gone.md) and [nowhere](security.md#no-such-heading); `[x](code.md)`.\n";
    assert_eq!(
        broken_links(&root, "docs/t.md", doc),
        [
            "docs/t.md:4: gone.md",
            "docs/t.md:4: security.md#no-such-heading"
        ]
    );
}
