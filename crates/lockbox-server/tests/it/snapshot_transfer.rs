//! Snapshots moved between servers (a fleet's nodes, docs/fleet.md): `GET
//! /v1/snapshots/{id}/artifact` on one, `PUT .../artifact?digest=` on another. The
//! snapshots are captured with lockbox-cow straight into the first server's state
//! directory (what a sandbox's snapshot does with its branch's upper), so no sandbox runs
//! here; forks of a moved snapshot run in python/tests/test_fleet.py.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lockbox_cow::{NewSnapshot, SnapshotStore};
use lockbox_runtime::{Runtime, RuntimeConfig};
use lockbox_server::{ServerConfig, Token};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

const TOKEN: &str = "test-token-0123456789abcdef";

struct Server {
    base: String,
    client: reqwest::Client,
    state: PathBuf,
}

impl Server {
    async fn start(state: PathBuf) -> Server {
        Server::start_with(RuntimeConfig::new(&state)).await
    }

    async fn start_with(config: RuntimeConfig) -> Server {
        let state = config.state_dir.clone();
        let runtime = Runtime::open(config).unwrap();
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
        }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
    }

    /// The artifact of snapshot `id` and its digest.
    async fn export(&self, id: &str) -> (Vec<u8>, String) {
        let r = self
            .request(Method::GET, &format!("/v1/snapshots/{id}/artifact"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()["content-type"],
            "application/vnd.oci.image.layout.v1+tar"
        );
        let digest = r.headers()["docker-content-digest"]
            .to_str()
            .unwrap()
            .to_owned();
        (r.bytes().await.unwrap().to_vec(), digest)
    }

    async fn import(&self, id: &str, digest: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let r = self
            .request(
                Method::PUT,
                &format!("/v1/snapshots/{id}/artifact?digest={digest}"),
            )
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self.request(Method::GET, path).send().await.unwrap();
        (r.status(), r.json().await.unwrap())
    }

    /// Nothing half-made under the snapshot store's `.new/`.
    fn nothing_unfinished(&self) {
        let left: Vec<_> = std::fs::read_dir(self.state.join("snapshots/.new"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left in .new: {left:?}");
    }
}

/// An upper layer as a sandbox leaves it: files, a whiteout, an opaque directory.
fn upper(dir: &Path) -> PathBuf {
    let up = dir.join("upper");
    std::fs::create_dir_all(up.join("src/opq")).unwrap();
    std::fs::write(up.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(up.join("src/opq/only"), "only me").unwrap();
    std::fs::set_permissions(
        up.join("src/main.rs"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::symlink("main.rs", up.join("src/link")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        up.join("gone"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    rustix::fs::setxattr(
        up.join("src/opq"),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    up
}

/// A snapshot of `upper` over `workdir` in `state`'s store (with a kept `/tmp` if given).
fn capture(
    state: &Path,
    upper: &Path,
    workdir: &Path,
    parent: Option<&str>,
    tmp: Option<&Path>,
) -> String {
    let store = SnapshotStore::open(state).unwrap();
    let meta = store
        .capture(
            upper,
            NewSnapshot {
                name: Some("moved".into()),
                parent: parent.map(|p| p.parse().unwrap()),
                workdir: workdir.to_owned(),
                base_ctime: lockbox_cow::Timestamp { secs: 1, nanos: 2 },
                context: json!({"sandbox": "sb-origin", "sessions": []}),
                scratch: tmp
                    .map(|t| vec![("tmp".to_owned(), t.to_owned())])
                    .unwrap_or_default(),
                limits: Default::default(),
            },
        )
        .unwrap();
    meta.id.to_string()
}

async fn two_servers(tmp: &Path) -> (Server, Server) {
    (
        Server::start(tmp.join("a")).await,
        Server::start(tmp.join("b")).await,
    )
}

#[tokio::test]
async fn a_snapshot_moves_to_another_server_whole_and_only_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_servers(tmp.path()).await;
    let wd = tmp.path().join("wd");
    std::fs::create_dir(&wd).unwrap();
    let kept = tmp.path().join("kept-tmp");
    std::fs::create_dir(&kept).unwrap();
    std::fs::write(kept.join("scratch"), "from /tmp").unwrap();
    let id = capture(&a.state, &upper(tmp.path()), &wd, None, Some(&kept));

    let (artifact, digest) = a.export(&id).await;
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    // The same snapshot gives the same artifact: the digest names it.
    assert_eq!(a.export(&id).await, (artifact.clone(), digest.clone()));
    let (status, info) = b.import(&id, &digest, artifact.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{info}");
    let (_, original) = a.get(&format!("/v1/snapshots/{id}")).await;
    for field in ["id", "name", "parent", "sandbox", "workdir", "created_at"] {
        assert_eq!(
            info[field], original[field],
            "{field}: {info} vs {original}"
        );
    }
    assert!(info["entries"].as_u64().unwrap() >= 6, "{info}");

    // Its layer and kept /tmp, as they were: modes, a link, the whiteout, the opaque mark.
    let layer = b.state.join("snapshots").join(&id).join("layer");
    let main = layer.join("src/main.rs");
    assert_eq!(std::fs::read_to_string(&main).unwrap(), "fn main() {}\n");
    assert_eq!(std::fs::metadata(&main).unwrap().mode() & 0o7777, 0o640);
    assert_eq!(
        std::fs::read_link(layer.join("src/link")).unwrap(),
        Path::new("main.rs")
    );
    let gone = std::fs::symlink_metadata(layer.join("gone")).unwrap();
    assert!(gone.file_type().is_char_device() && gone.rdev() == 0);
    let mut mark = [0u8; 1];
    assert_eq!(
        rustix::fs::lgetxattr(layer.join("src/opq"), "user.overlay.opaque", &mut mark).unwrap(),
        1
    );
    assert_eq!(
        std::fs::read_to_string(
            b.state
                .join("snapshots")
                .join(&id)
                .join("scratch/tmp/scratch")
        )
        .unwrap(),
        "from /tmp"
    );
    let (status, _) = b.get(&format!("/v1/snapshots/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    // And it exports from there to the same artifact.
    assert_eq!(b.export(&id).await.1, digest);

    // Sent again: the node has it, and says so without taking it in twice.
    let (status, again) = b.import(&id, &digest, artifact).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["id"], id);
    b.nothing_unfinished();
    // No hold of the exports is left on the original: it can be deleted.
    let r = a
        .request(Method::DELETE, &format!("/v1/snapshots/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn a_stacked_snapshot_needs_its_parent_moved_first() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_servers(tmp.path()).await;
    let wd = tmp.path().join("wd");
    std::fs::create_dir(&wd).unwrap();
    let parent = capture(&a.state, &upper(tmp.path()), &wd, None, None);
    let up2 = tmp.path().join("upper2");
    std::fs::create_dir(&up2).unwrap();
    std::fs::write(up2.join("second"), "2").unwrap();
    let child = capture(&a.state, &up2, &wd, Some(&parent), None);

    let (artifact, digest) = a.export(&child).await;
    let (status, body) = b.import(&child, &digest, artifact.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["code"], "INVALID_REQUEST");
    assert_eq!(body["details"]["field"], "parent");
    assert!(
        body["message"].as_str().unwrap().contains(&parent),
        "{body}"
    );
    b.nothing_unfinished();

    let (p_artifact, p_digest) = a.export(&parent).await;
    assert_eq!(
        b.import(&parent, &p_digest, p_artifact).await.0,
        StatusCode::CREATED
    );
    let (status, info) = b.import(&child, &digest, artifact).await;
    assert_eq!(status, StatusCode::CREATED, "{info}");
    assert_eq!(info["parent"], parent.as_str());
}

#[tokio::test]
async fn a_tampered_or_cut_artifact_is_refused_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_servers(tmp.path()).await;
    let wd = tmp.path().join("wd");
    std::fs::create_dir(&wd).unwrap();
    let id = capture(&a.state, &upper(tmp.path()), &wd, None, None);
    let (artifact, digest) = a.export(&id).await;

    // One byte of a file's content changed in transit.
    let at = artifact
        .windows(12)
        .position(|w| w == b"fn main() {}")
        .unwrap();
    let mut tampered = artifact.clone();
    tampered[at + 3] = b'X';
    let (status, body) = b.import(&id, &digest, tampered).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["code"], "BAD_ARTIFACT", "{body}");
    assert_eq!(body["details"]["reason"], "digest_mismatch", "{body}");
    assert_eq!(body["details"]["id"], id.as_str(), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("tree layer") && message.contains("digest mismatch"),
        "{body}"
    );

    // Cut short: in the middle of the layer, and before its index.
    for cut in [at + 100, artifact.len() - 1536] {
        let (status, body) = b.import(&id, &digest, artifact[..cut].to_vec()).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "cut at {cut}: {body}"
        );
        assert_eq!(body["code"], "BAD_ARTIFACT", "{body}");
    }

    // Another digest than the artifact's: its manifest is refused before anything else.
    let other = format!("sha256:{}", "0".repeat(64));
    let (status, body) = b.import(&id, &other, artifact.clone()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["details"]["reason"], "digest_mismatch", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("manifest"),
        "{body}"
    );

    let (list_status, list) = b.get("/v1/snapshots").await;
    assert_eq!(list_status, StatusCode::OK);
    assert_eq!(list["snapshots"], json!([]));
    b.nothing_unfinished();
    // The untouched artifact still goes in.
    assert_eq!(
        b.import(&id, &digest, artifact).await.0,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn bad_artifact_requests_are_refused_with_distinct_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_servers(tmp.path()).await;
    let wd = tmp.path().join("wd");
    std::fs::create_dir(&wd).unwrap();
    let id = capture(&a.state, &upper(tmp.path()), &wd, None, None);
    let (artifact, digest) = a.export(&id).await;

    let (status, body) = a.get("/v1/snapshots/s-none/artifact").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("SNAPSHOT_NOT_FOUND"))
    );

    for (query, what) in [("", "missing"), ("?digest=md5:abc", "malformed")] {
        let r = b
            .request(Method::PUT, &format!("/v1/snapshots/{id}/artifact{query}"))
            .body(artifact.clone())
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
        assert_eq!(body["code"], "INVALID_REQUEST", "{what}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("digest"),
            "{what}: {body}"
        );
    }
    // The artifact of one snapshot sent as another's.
    let (status, body) = b.import("s-other", &digest, artifact.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["details"]["field"], "id", "{body}");
    // Not an artifact at all.
    let (status, body) = b.import(&id, &digest, b"not a tar".to_vec()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["details"]["reason"], "malformed", "{body}");

    // A workdir this node does not have: a snapshot moves without its workdir.
    std::fs::remove_dir(&wd).unwrap();
    let (status, body) = b.import(&id, &digest, artifact).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["details"]["field"], "workdir", "{body}");
    b.nothing_unfinished();
}

/// E2B's sandboxes all lie over `STATE/e2b-workdir` (empty, never written): a snapshot of
/// one lies over the receiving node's own.
#[tokio::test]
async fn a_snapshot_over_the_state_directorys_e2b_workdir_gets_the_receivers() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_servers(tmp.path()).await;
    let wd = a.state.join("e2b-workdir");
    std::fs::create_dir(&wd).unwrap();
    let id = capture(&a.state, &upper(tmp.path()), &wd, None, None);
    let (artifact, digest) = a.export(&id).await;
    let (status, info) = b.import(&id, &digest, artifact).await;
    assert_eq!(status, StatusCode::CREATED, "{info}");
    assert_eq!(
        info["workdir"],
        b.state.join("e2b-workdir").to_str().unwrap()
    );
    assert!(b.state.join("e2b-workdir").is_dir());
}

/// A server takes in no more than its snapshots have room for: an artifact beyond the room
/// stops there (before it fills the disk) with 429 `LIMIT_REACHED`, leaving nothing.
#[tokio::test]
async fn an_artifact_beyond_the_snapshot_room_is_refused_before_it_fills_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let a = Server::start(tmp.path().join("a")).await;
    let mut config = RuntimeConfig::new(tmp.path().join("b"));
    config.max_snapshot_bytes = Some(1024 * 1024);
    let b = Server::start_with(config).await;
    let wd = tmp.path().join("wd");
    std::fs::create_dir(&wd).unwrap();
    let big = tmp.path().join("big");
    std::fs::create_dir(&big).unwrap();
    std::fs::write(big.join("data"), vec![b'x'; 24 * 1024 * 1024]).unwrap();
    let id = capture(&a.state, &big, &wd, None, None);
    let (artifact, digest) = a.export(&id).await;
    let (status, body) = b.import(&id, &digest, artifact).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["code"], "LIMIT_REACHED", "{body}");
    assert!(
        body["details"]["what"]
            .as_str()
            .unwrap()
            .contains("max_snapshot_bytes"),
        "{body}"
    );
    b.nothing_unfinished();
    // A small one fits.
    let small = capture(&a.state, &upper(tmp.path()), &wd, None, None);
    let (artifact, digest) = a.export(&small).await;
    assert_eq!(
        b.import(&small, &digest, artifact).await.0,
        StatusCode::CREATED
    );
}

impl Server {
    /// The ids `/mcp`'s `list_snapshots` answers with the operator's token (the node's MCP
    /// scope).
    async fn mcp_snapshots(&self) -> Vec<String> {
        let r = self
            .request(Method::POST, "/mcp")
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "list_snapshots", "arguments": {}}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let reply: Value = r.json().await.unwrap();
        let listed = reply["result"]["structuredContent"]["snapshots"]
            .as_array()
            .unwrap_or_else(|| panic!("{reply}"));
        listed
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// `PUT .../artifact` with `Lockbox-Snapshot-Scope: scope` and `token`.
    async fn import_scoped(
        &self,
        id: &str,
        digest: &str,
        body: Vec<u8>,
        scope: &str,
        token: &str,
    ) -> (StatusCode, Value) {
        let r = self
            .client
            .put(format!(
                "{}/v1/snapshots/{id}/artifact?digest={digest}",
                self.base
            ))
            .bearer_auth(token)
            .header("Lockbox-Snapshot-Scope", scope)
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap())
    }
}

/// Issue 31: a copy the fleet router makes for an MCP `fork` or `restore` joins the
/// receiving node's MCP scope (`Lockbox-Snapshot-Scope: mcp`), operator only; a copy without
/// the header stays out of it, as any snapshot not taken through that node's `/mcp`.
#[tokio::test]
async fn issue_31_an_imported_copy_joins_the_mcp_scope_only_when_the_operator_asks() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_servers(tmp.path()).await;
    let wd = tmp.path().join("wd");
    std::fs::create_dir(&wd).unwrap();
    let plain = capture(&a.state, &upper(tmp.path()), &wd, None, None);
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let scoped = capture(&a.state, &upper(&other), &wd, None, None);

    // Without the header: received, not the agent's.
    let (artifact, digest) = a.export(&plain).await;
    let (status, body) = b.import(&plain, &digest, artifact.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(!b.mcp_snapshots().await.contains(&plain));

    // A scoped token may not move snapshots, with or without the scope: 403 whatever the
    // id (none of this is its own, and another's would be 404 elsewhere).
    let r = b
        .request(Method::POST, "/v1/tokens")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let minted: Value = r.json().await.unwrap();
    let agent = minted["token"].as_str().unwrap();
    let (scoped_artifact, scoped_digest) = a.export(&scoped).await;
    let (status, body) = b
        .import_scoped(
            &scoped,
            &scoped_digest,
            scoped_artifact.clone(),
            "mcp",
            agent,
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("FORBIDDEN")),
        "{body}"
    );
    let r = b
        .client
        .get(format!("{}/v1/snapshots/{plain}/artifact", b.base))
        .bearer_auth(agent)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // Any other value: 400 naming the header, nothing received.
    for bad in ["MCP", "token", ""] {
        let (status, body) = b
            .import_scoped(&scoped, &scoped_digest, scoped_artifact.clone(), bad, TOKEN)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {body}");
        assert_eq!(body["code"], "INVALID_REQUEST", "{bad:?}: {body}");
        assert_eq!(body["details"]["field"], "Lockbox-Snapshot-Scope", "{body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("Lockbox-Snapshot-Scope"),
            "{body}"
        );
    }
    let (status, _) = b.get(&format!("/v1/snapshots/{scoped}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // With it: received and in /mcp's scope.
    let (status, body) = b
        .import_scoped(&scoped, &scoped_digest, scoped_artifact, "mcp", TOKEN)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(b.mcp_snapshots().await, vec![scoped.clone()]);
    // A copy the node had already joins it too (nothing read again).
    let (status, body) = b
        .import_scoped(&plain, &digest, artifact, "mcp", TOKEN)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut seen = b.mcp_snapshots().await;
    seen.sort();
    let mut both = vec![plain, scoped];
    both.sort();
    assert_eq!(seen, both);
    // The sending node's scope is its own: nothing taken through its /mcp.
    assert!(a.mcp_snapshots().await.is_empty());
    b.nothing_unfinished();
}
