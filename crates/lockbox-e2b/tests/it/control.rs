//! E2B's control plane over HTTP as the SDK calls it: pause keeps files and ends
//! processes, connect resumes under the same id, fork copies a running sandbox, a snapshot
//! is a template.

use crate::common::{also_as_nobody, out, run, runtime, scratch};
use reqwest::Method;
use serde_json::{json, Value};

/// E2B's planes over a fresh runtime on a local port, called with the API key.
pub(crate) struct Plane {
    pub(crate) rt: lockbox_runtime::Runtime,
    base: String,
    client: reqwest::Client,
    /// The tokio runtime serving it when it has one of its own ([`Plane::start_own`]).
    own: Option<tokio::runtime::Runtime>,
}

impl Plane {
    pub(crate) async fn start(state: &std::path::Path) -> Plane {
        let rt = runtime(state).await;
        let e2b = lockbox_e2b::E2b::new(rt.clone(), "test-key");
        let app = lockbox_e2b::wrap(e2b, axum::Router::new(), None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Plane {
            rt,
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            own: None,
        }
    }

    /// E2B's planes over `rt` (what `lockbox serve` builds at start-up), served by a tokio
    /// runtime of their own, so that [`Plane::stop`] ends every task of the server (its
    /// timers hold the runtime) as the end of `lockbox serve`'s process would.
    pub(crate) fn start_own(rt: lockbox_runtime::Runtime) -> Plane {
        let own = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let e2b = lockbox_e2b::E2b::new(rt.clone(), "test-key");
        let app = lockbox_e2b::wrap(e2b, axum::Router::new(), None);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        own.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            axum::serve(listener, app).await
        });
        Plane {
            rt,
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            own: Some(own),
        }
    }

    /// Shuts the runtime down (deleting its sandboxes, as `lockbox serve` does as it stops)
    /// and ends the server's tasks.
    pub(crate) async fn stop(mut self) {
        let rt = self.rt.clone();
        match &self.own {
            Some(own) => own.spawn(async move { rt.shutdown().await }).await.unwrap(),
            None => rt.shutdown().await,
        }
        if let Some(own) = self.own.take() {
            own.shutdown_background();
        }
    }

    /// `method` on `path` (below the base) with a JSON body: the status and the JSON reply
    /// (`Null` if it is not JSON).
    pub(crate) async fn call(&self, method: Method, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("X-API-Key", "test-key")
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(Method::POST, path, body).await
    }

    /// `POST /sandboxes/{id}/{what}` (pause, resume, fork, snapshots): the status and reply.
    pub(crate) async fn on(&self, id: &str, what: &str, body: Value) -> (u16, Value) {
        self.post(&format!("/sandboxes/{id}/{what}"), body).await
    }

    /// `DELETE /sandboxes/{id}`: the status.
    pub(crate) async fn kill(&self, id: &str) -> u16 {
        self.call(Method::DELETE, &format!("/sandboxes/{id}"), json!({}))
            .await
            .0
    }

    /// `POST /sandboxes` with `body`, which must make one (201): the sandbox and its id.
    pub(crate) async fn create(&self, body: Value) -> (Value, String) {
        let (status, sb) = self.post("/sandboxes", body).await;
        assert_eq!(status, 201, "{sb}");
        let id = sb["sandboxID"].as_str().unwrap().to_owned();
        (sb, id)
    }

    /// envd's `GET /files` of `path` in sandbox `sb` (a create's reply): the status and the text.
    pub(crate) async fn read(&self, sb: &Value, path: &str) -> (u16, String) {
        let resp = self
            .client
            .get(format!("{}/files?path={path}", self.base))
            .header("E2b-Sandbox-Id", sb["sandboxID"].as_str().unwrap())
            .header("E2b-Sandbox-Port", "49983")
            .header("X-Access-Token", sb["envdAccessToken"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }
}

impl Drop for Plane {
    fn drop(&mut self) {
        // Dropped in an async test: a runtime may not block there.
        if let Some(own) = self.own.take() {
            own.shutdown_background();
        }
    }
}

/// E2B's user works in `/home/user`: on the host's userland (which has no such directory)
/// the sandbox's workdir is seen there, so it exists, is writable, is where commands start
/// and relative paths lead, and the server's state directory behind it is not visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_template_sandbox_works_in_home_user() {
    also_as_nobody("control::a_host_template_sandbox_works_in_home_user");
    let state = scratch();
    let e2b = Plane::start(state.path()).await;
    let (sb, id) = e2b.create(json!({})).await;
    let behind = state.path().join("e2b-workdir");
    let script = format!(
        "pwd; printf made > made.txt; cat /home/user/made.txt; echo; test -e {} && echo visible || echo hidden",
        behind.display()
    );
    let r = run(&e2b.rt.sandbox(&id).unwrap(), &script).await;
    assert_eq!(r.exit_code, 0, "{}", out(&r));
    assert_eq!(out(&r), "/home/user\nmade\nhidden\n");
    assert_eq!(e2b.read(&sb, "made.txt").await, (200, "made".to_owned()));
    assert_eq!(
        e2b.read(&sb, "/home/user/made.txt").await,
        (200, "made".to_owned())
    );
    // Nothing reached the directory behind it: the sandbox's branch holds it.
    assert_eq!(std::fs::read_dir(&behind).unwrap().count(), 0);
    e2b.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_keeps_its_files_and_resumes_under_its_id() {
    also_as_nobody("control::a_paused_sandbox_keeps_its_files_and_resumes_under_its_id");
    let state = scratch();
    let e2b = Plane::start(state.path()).await;
    let (sb, id) = e2b.create(json!({})).await;
    // A file in the home, written from inside.
    run(
        &e2b.rt.sandbox(&id).unwrap(),
        "printf kept > /home/user/kept.txt; printf kept > /tmp/kept.txt",
    )
    .await;

    assert_eq!(e2b.on(&id, "pause", json!({})).await.0, 204);
    assert_eq!(e2b.on(&id, "pause", json!({})).await.0, 409);
    let (status, info) = e2b
        .call(Method::GET, &format!("/sandboxes/{id}"), json!({}))
        .await;
    assert_eq!((status, info["state"].as_str()), (200, Some("paused")));
    // Its processes are gone with the lockbox sandbox, and envd answers it as not running.
    assert!(e2b.rt.sandbox(&id).is_err());
    assert_eq!(e2b.read(&sb, "kept.txt").await.0, 502);

    let connect = format!("/v2/sandboxes/{id}/connect");
    let (status, resumed) = e2b.post(&connect, json!({"timeout": 60})).await;
    assert_eq!(status, 201, "{resumed}");
    assert_eq!(resumed["sandboxID"], id.as_str());
    // Its home (the workdir, where relative paths lead) and its /tmp.
    assert_eq!(e2b.read(&sb, "kept.txt").await, (200, "kept".to_owned()));
    assert_eq!(
        e2b.read(&sb, "/tmp/kept.txt").await,
        (200, "kept".to_owned())
    );
    // Connecting to it now that it runs is a plain connect.
    assert_eq!(e2b.post(&connect, json!({"timeout": 60})).await.0, 200);
    assert_eq!(e2b.on(&id, "resume", json!({})).await.0, 409);

    let (status, refused) = e2b.on(&id, "pause", json!({"memory": true})).await;
    assert_eq!(status, 400);
    assert!(
        refused["message"].as_str().unwrap().starts_with("memory"),
        "{refused}"
    );
    // A second pause, resumed through E2B's (deprecated) resume: 201, its files still there.
    assert_eq!(e2b.on(&id, "pause", json!({})).await.0, 204);
    let (status, resumed) = e2b.on(&id, "resume", json!({"timeout": 60})).await;
    assert_eq!(status, 201, "{resumed}");
    assert_eq!(e2b.read(&sb, "kept.txt").await, (200, "kept".to_owned()));

    assert_eq!(e2b.kill(&id).await, 204);
    // Both pauses' snapshots went with it.
    assert!(e2b.rt.list_snapshots().unwrap().is_empty());
    e2b.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_and_snapshots_start_from_the_sandboxs_files() {
    also_as_nobody("control::forks_and_snapshots_start_from_the_sandboxs_files");
    let state = scratch();
    let e2b = Plane::start(state.path()).await;
    let (_, id) = e2b.create(json!({})).await;
    run(
        &e2b.rt.sandbox(&id).unwrap(),
        "printf source > /home/user/f.txt",
    )
    .await;

    let (status, forks) = e2b
        .on(&id, "fork", json!({"count": 2, "timeout": 60}))
        .await;
    assert_eq!(status, 201, "{forks}");
    let forks = forks.as_array().unwrap();
    assert_eq!(forks.len(), 2);
    for f in forks {
        assert_ne!(f["sandbox"]["sandboxID"], id.as_str());
        assert_eq!(
            e2b.read(&f["sandbox"], "f.txt").await,
            (200, "source".to_owned())
        );
    }
    let (status, refused) = e2b.on(&id, "fork", json!({"count": 0})).await;
    assert_eq!(status, 400);
    assert!(refused["message"].as_str().unwrap().starts_with("count"));

    let (status, snap) = e2b.on(&id, "snapshots", json!({"name": "mine"})).await;
    assert_eq!(status, 201, "{snap}");
    assert_eq!(snap["names"], json!(["mine"]));
    let (from, _) = e2b.create(json!({"templateID": "mine"})).await;
    assert_eq!(e2b.read(&from, "f.txt").await, (200, "source".to_owned()));
    e2b.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_made_for_pauses_and_forks_go_with_the_last_sandbox_on_them() {
    also_as_nobody("control::snapshots_made_for_pauses_and_forks_go_with_the_last_sandbox_on_them");
    let state = scratch();
    let e2b = Plane::start(state.path()).await;
    let (_, id) = e2b.create(json!({})).await;
    // Paused and resumed: it lies on its pause's snapshot; then forked twice.
    assert_eq!(e2b.on(&id, "pause", json!({})).await.0, 204);
    assert_eq!(e2b.on(&id, "resume", json!({})).await.0, 201);
    let (status, forks) = e2b.on(&id, "fork", json!({"count": 2})).await;
    assert_eq!(status, 201, "{forks}");
    assert_eq!(e2b.rt.list_snapshots().unwrap().len(), 2);
    // The source ends first: the forks still lie on both snapshots.
    assert_eq!(e2b.kill(&id).await, 204);
    assert_eq!(e2b.rt.list_snapshots().unwrap().len(), 2);
    for f in forks.as_array().unwrap() {
        let fork = f["sandbox"]["sandboxID"].as_str().unwrap();
        assert_eq!(e2b.kill(fork).await, 204);
    }
    assert!(e2b.rt.list_snapshots().unwrap().is_empty());
    e2b.rt.shutdown().await;
}

/// What a fleet's router asks each node about a signed file URL that names no sandbox
/// (made for `E2B_SANDBOX_URL`): which of its sandboxes' tokens signed it, for that
/// operation; only with the server's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_says_which_of_its_sandboxes_signed_a_file_url() {
    use base64::Engine;
    use sha2::Digest;
    also_as_nobody("control::a_node_says_which_of_its_sandboxes_signed_a_file_url");
    let state = scratch();
    let e2b = Plane::start(state.path()).await;
    let (sb, id) = e2b.create(json!({})).await;
    let token = sb["envdAccessToken"].as_str().unwrap();
    let digest = sha2::Sha256::digest(format!("a b.txt:read:user:{token}:4102444800"));
    let signature = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    );
    let url: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("path", "a b.txt")
        .append_pair("username", "user")
        .append_pair("signature", &signature)
        .append_pair("signature_expiration", "4102444800")
        .finish();
    let ask = |method: &str, url: &str| {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("method", method)
            .append_pair("url", url)
            .finish();
        format!("/lockbox/signed-url-sandbox?{query}")
    };
    let signed = format!("/files?{url}");
    let (status, found) = e2b
        .call(Method::GET, &ask("GET", &signed), json!(null))
        .await;
    assert_eq!((status, &found["sandboxID"]), (200, &json!(id)), "{found}");
    // Signed for reading, not for writing; not signed at all.
    let (status, _) = e2b
        .call(Method::GET, &ask("POST", &signed), json!(null))
        .await;
    assert_eq!(status, 404);
    let forged = signed.replace("signature=v1_", "signature=v1_x");
    assert_eq!(
        e2b.call(Method::GET, &ask("GET", &forged), json!(null))
            .await
            .0,
        404
    );
    let (status, bad) = e2b
        .call(Method::GET, &ask("G E T", &signed), json!(null))
        .await;
    assert_eq!(status, 400, "{bad}");
    // Not without the server's token.
    let anonymous = e2b
        .client
        .get(format!("{}{}", e2b.base, ask("GET", &signed)))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    e2b.rt.shutdown().await;
}
