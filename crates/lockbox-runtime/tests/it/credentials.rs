//! Interception rules (`SandboxSpec::http`) across forks and runtimes, through the runtime:
//! a live sandbox's fork keeps its rules and the values it was given; a fork of its
//! snapshot by a later runtime over the same state directory finds the credentials by name
//! in that runtime's registry, and is refused when the registry lacks one; no value is
//! ever written to the state directory. Whether a sandbox is intercepted shows inside:
//! lockbox points `SSL_CERT_FILE` at the bundle holding its CA only then. (The requests
//! themselves, through a real server: lockbox-cli's tests/net_credentials.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_runtime::{
    CredentialSpec, Credentials, HttpRules, OnExit, Runtime, RuntimeError, SandboxSpec,
    SnapshotOptions,
};
use std::path::Path;

const SECRET: &str = "sk-runtime-test-never-on-disk";

fn credentials() -> Credentials {
    let specs: Vec<CredentialSpec> = vec!["API=env:LBX_UNUSED".parse().unwrap()];
    Credentials::read_all(&specs, |_| Some(SECRET.into())).unwrap()
}

/// What the sandbox's `SSL_CERT_FILE` is: set only when lockbox intercepts.
async fn trust_file(rt: &Runtime, id: &str) -> String {
    let r = run(&rt.sandbox(id).unwrap(), "printenv SSL_CERT_FILE || true").await;
    out(&r).trim().to_owned()
}

/// Every file under `dir` holding `needle`.
fn holding(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(path) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if meta.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_keep_interception_rules_and_a_later_runtime_resolves_them_by_name_or_refuses() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "forks_keep_interception_rules_and_a_later_runtime_resolves_them_by_name_or_refuses"
    ));
    let state = scratch();
    let work = scratch();
    std::fs::write(work.path().join("file"), "x").unwrap();
    let mut spec = SandboxSpec {
        workdir: Some(work.path().to_owned()),
        on_exit: OnExit::Abort,
        http: HttpRules::new(
            vec!["api.test bearer API".parse().unwrap()],
            vec!["GET api.test/v1/models".parse().unwrap()],
        )
        .unwrap(),
        // An in-process caller's own credential: in no registry.
        credentials: credentials(),
        ..SandboxSpec::default()
    };
    spec.policy.net = lockbox_policy::Net::Allow(vec!["api.test:443".parse().unwrap()]);
    let bundle = "/etc/ssl/certs/ca-certificates.crt";

    let rt = runtime(state.path()).await;
    let id = rt.create_sandbox(spec).await.unwrap().id;
    assert_eq!(trust_file(&rt, &id).await, bundle);
    // The live sandbox's fork gets its rules, and the value it was given.
    let (snapshot, forks) = rt
        .fork_sandbox(&id, 1, SnapshotOptions::default())
        .await
        .unwrap();
    assert_eq!(trust_file(&rt, &forks[0].id).await, bundle, "the fork");
    // A fork of the snapshot alone has only the registry, which lacks API.
    let snap = snapshot.id.to_string();
    let refused = rt.fork_snapshot(&snap, 1).await.unwrap_err();
    let RuntimeError::InvalidRequest { field, message } = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(field, "http_auth");
    assert!(
        message.contains("credential API") && message.contains(&snap),
        "{message}"
    );
    rt.shutdown().await;
    drop(rt);

    // A later runtime over the same state directory, once it holds API by name.
    let rt = runtime(state.path()).await;
    assert!(rt.fork_snapshot(&snap, 1).await.is_err());
    rt.define_credentials(credentials(), None);
    let forks = rt.fork_snapshot(&snap, 2).await.unwrap();
    for fork in &forks {
        assert_eq!(trust_file(&rt, &fork.id).await, bundle, "a later fork");
    }
    rt.shutdown().await;
    drop(rt);
    assert_eq!(
        holding(state.path(), SECRET),
        Vec::<String>::new(),
        "the state directory holds the value"
    );
}
