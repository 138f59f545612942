//! Pulls from a real `docker-registry` on loopback: anonymous, Basic auth (htpasswd) and the
//! Bearer token flow (token_proxy.py), and registries that misbehave.

use crate::common::*;
use lockbox_image::{ImageError, Platform, PullOptions, Store};
use std::path::Path;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A registry holding the busybox test image as `busybox:test`; the image's id.
fn registry_with_busybox(t: &Path, user: Option<(&str, &str)>) -> (Registry, String) {
    let registry = Registry::start(user);
    let lay = t.join("lay");
    let layers = busybox_layers();
    let (_, id) = write_layout(&lay, "test", &layers, &config_of(&layers, &["sh"]));
    let creds = user.map(|(u, p)| format!("{u}:{p}"));
    registry.push(&lay, "test", "busybox", creds.as_deref());
    (registry, id)
}

#[test]
fn a_pull_from_a_loopback_registry_verifies_and_unpacks_every_layer() {
    if !require(&["docker-registry", "skopeo"]) {
        return;
    }
    let t = tmp();
    let (registry, id) = registry_with_busybox(t.path(), None);
    let store = Store::open(&t.path().join("store")).unwrap();
    let reference = format!("127.0.0.1:{}/busybox:test", registry.port);
    let image = rt()
        .block_on(store.pull(&reference, &PullOptions::default()))
        .unwrap();
    assert_eq!(image.id, id);
    assert_eq!(image.references, std::slice::from_ref(&reference));
    assert!(image.manifest.is_some());
    assert!(image.layers[1].join("bin/busybox").exists());
    assert_eq!(store.get(&reference).unwrap().unwrap().id, id);
    // Pinned by the manifest's digest, the same image.
    let pinned = format!(
        "127.0.0.1:{}/busybox@{}",
        registry.port,
        image.manifest.unwrap()
    );
    assert_eq!(
        rt().block_on(store.pull(&pinned, &PullOptions::default()))
            .unwrap()
            .id,
        id
    );
    if require_overlay() {
        assert_eq!(in_overlay(&image.layers, "ls $ROOT/opt/data"), "c\nc2\n");
    }
}

#[test]
fn basic_auth_uses_the_auth_file_and_fails_clearly_without_it() {
    if !require(&["docker-registry", "skopeo", "htpasswd"]) {
        return;
    }
    let t = tmp();
    let (registry, id) = registry_with_busybox(t.path(), Some(("alice", "s3cret")));
    let store = Store::open(&t.path().join("store")).unwrap();
    let host = format!("127.0.0.1:{}", registry.port);
    let reference = format!("{host}/busybox:test");
    let none = PullOptions {
        auth_file: Some(t.path().join("no-such-auth.json")),
        ..PullOptions::default()
    };
    let e = rt().block_on(store.pull(&reference, &none)).unwrap_err();
    assert!(matches!(e, ImageError::Unauthorized { .. }), "{e}");
    let wrong = PullOptions {
        auth_file: Some(auth_file(t.path(), &host, "alice:wrong")),
        ..PullOptions::default()
    };
    let e = rt().block_on(store.pull(&reference, &wrong)).unwrap_err();
    assert!(matches!(e, ImageError::Unauthorized { .. }), "{e}");
    let right = PullOptions {
        auth_file: Some(auth_file(t.path(), &host, "alice:s3cret")),
        ..PullOptions::default()
    };
    assert_eq!(
        rt().block_on(store.pull(&reference, &right)).unwrap().id,
        id
    );
}

#[test]
fn the_bearer_token_flow_gets_a_token_with_the_credentials() {
    if !require(&["docker-registry", "skopeo", "python3"]) {
        return;
    }
    let t = tmp();
    let (registry, id) = registry_with_busybox(t.path(), None);
    let proxy = TokenProxy::start(registry.port, Some("bob:pw"));
    let store = Store::open(&t.path().join("store")).unwrap();
    let host = format!("127.0.0.1:{}", proxy.port);
    let reference = format!("{host}/busybox:test");
    let anonymous = PullOptions {
        auth_file: Some(t.path().join("none.json")),
        ..PullOptions::default()
    };
    let e = rt()
        .block_on(store.pull(&reference, &anonymous))
        .unwrap_err();
    assert!(matches!(e, ImageError::Unauthorized { .. }), "{e}");
    let creds = PullOptions {
        auth_file: Some(auth_file(t.path(), &host, "bob:pw")),
        ..PullOptions::default()
    };
    assert_eq!(
        rt().block_on(store.pull(&reference, &creds)).unwrap().id,
        id
    );
}

#[test]
fn endless_redirects_endless_manifests_and_corrupt_blobs_are_refused_leaving_nothing() {
    if !require(&["docker-registry", "skopeo", "python3"]) {
        return;
    }
    let t = tmp();
    let (registry, _) = registry_with_busybox(t.path(), None);
    let proxy = TokenProxy::start(registry.port, None);
    let store = Store::open(&t.path().join("store")).unwrap();
    let opts = PullOptions {
        auth_file: Some(t.path().join("none.json")),
        ..PullOptions::default()
    };
    let pull = |repo: &str| {
        rt().block_on(store.pull(&format!("127.0.0.1:{}/{repo}:test", proxy.port), &opts))
            .unwrap_err()
    };
    let e = pull("loop");
    assert!(e.to_string().contains("more than 10 redirects"), "{e}");
    let e = pull("endless");
    assert!(
        matches!(e, ImageError::TooLarge { limit, .. } if limit == 4 << 20),
        "{e}"
    );
    let e = pull("corrupt");
    assert!(
        matches!(
            e,
            ImageError::DigestMismatch { .. } | ImageError::Registry { .. }
        ),
        "{e}"
    );
    for sub in ["layers", "images", "tmp", "blobs/sha256"] {
        assert_eq!(
            std::fs::read_dir(store.path().join(sub)).unwrap().count(),
            0,
            "{sub}"
        );
    }
}

#[test]
fn a_registry_that_is_not_there_is_a_clear_error() {
    let t = tmp();
    let store = Store::open(&t.path().join("store")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = rt()
        .block_on(store.pull(&format!("127.0.0.1:{port}/x:1"), &PullOptions::default()))
        .unwrap_err();
    assert_eq!(e.exit_code(), 1);
    assert!(
        e.to_string()
            .starts_with(&format!("registry 127.0.0.1:{port}: manifest x:1: ")),
        "{e}"
    );
}

#[test]
fn a_manifest_list_from_a_registry_gives_the_asked_platform() {
    if !require(&["docker-registry", "skopeo"]) {
        return;
    }
    let t = tmp();
    let registry = Registry::start(None);
    let lay = t.path().join("lay");
    let (ida, idb) = multi_platform_layout(&lay);
    registry.push_all(&lay, "multi", "multi");
    let store = Store::open(&t.path().join("store")).unwrap();
    let reference = format!("127.0.0.1:{}/multi:multi", registry.port);
    let amd = PullOptions {
        platform: Platform::parse("linux/amd64").unwrap(),
        ..PullOptions::default()
    };
    assert_eq!(rt().block_on(store.pull(&reference, &amd)).unwrap().id, ida);
    let arm = PullOptions {
        platform: Platform::parse("linux/arm64").unwrap(),
        ..PullOptions::default()
    };
    let image = rt().block_on(store.pull(&reference, &arm)).unwrap();
    assert_eq!(image.id, idb);
    assert_eq!(
        std::fs::read(image.layers[0].join("arch")).unwrap(),
        b"arm64"
    );
}
