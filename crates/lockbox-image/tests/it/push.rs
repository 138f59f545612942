//! `push` to a real `docker-registry` on loopback (anonymous, htpasswd Basic, and the Bearer
//! flow of token_proxy.py): pulled back into an empty store it is the same image; blobs the
//! registry has are not sent again; skopeo reads what was pushed.

use crate::common::*;
use lockbox_image::{ImageConfig, ImageError, PullOptions, PushOptions, Store, Tls};
use std::path::Path;
use std::process::Command;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn pulled(t: &Path, store: &Store) -> lockbox_image::Image {
    let lay = t.join("lay");
    let layers = busybox_layers();
    write_layout(&lay, "test", &layers, &config_of(&layers, &["sh"]));
    let src = format!("oci:{}:test", lay.display());
    rt().block_on(store.pull(&src, &PullOptions::default()))
        .unwrap()
}

#[test]
fn a_pushed_image_pulls_back_the_same_and_a_second_push_sends_no_blob() {
    if !require(&["docker-registry", "skopeo"]) {
        return;
    }
    let t = tmp();
    let registry = Registry::start(None);
    let a = Store::open(&t.path().join("a")).unwrap();
    let image = pulled(t.path(), &a);
    let dest = format!("127.0.0.1:{}/team/bb:1", registry.port);
    // Small chunks: the busybox layer goes up in PATCH chunks, the rest in one PUT.
    let opts = PushOptions {
        chunk_bytes: 256 << 10,
        ..PushOptions::default()
    };
    let pushed = rt()
        .block_on(a.push(&image.id, Some(&dest), &opts))
        .unwrap();
    assert_eq!(pushed.id, image.id);
    assert_eq!(Some(pushed.manifest.clone()), image.manifest);
    assert_eq!(pushed.blobs_uploaded, 3, "two layers and the config");
    assert_eq!(pushed.blobs_skipped, 0);

    let again = rt()
        .block_on(a.push(&image.id, Some(&dest), &opts))
        .unwrap();
    assert_eq!((again.blobs_uploaded, again.blobs_skipped), (0, 3));

    let b = Store::open(&t.path().join("b")).unwrap();
    let back = rt()
        .block_on(b.pull(&dest, &PullOptions::default()))
        .unwrap();
    assert_eq!(back.id, image.id);
    assert_eq!(back.manifest, image.manifest);
    assert!(back.layers[1].join("bin/busybox").exists());

    // skopeo copies it back out.
    let out = Command::new("skopeo")
        .args(["copy", "-q", "--src-tls-verify=false", "--policy"])
        .arg(policy(t.path()))
        .arg(format!("docker://{dest}"))
        .arg(format!("oci:{}:x", t.path().join("out").display()))
        .env("HOME", t.path())
        .env("TMPDIR", t.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = Store::open(&t.path().join("c")).unwrap();
    let src = format!("oci:{}:x", t.path().join("out").display());
    let copied = rt()
        .block_on(c.pull(&src, &PullOptions::default()))
        .unwrap();
    assert_eq!(copied.id, image.id);
}

fn policy(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("policy.json");
    std::fs::write(&p, br#"{"default":[{"type":"insecureAcceptAnything"}]}"#).unwrap();
    p
}

#[test]
fn a_built_image_is_pushed_with_its_layer_written_again() {
    if !require(&["docker-registry"]) {
        return;
    }
    let t = tmp();
    let registry = Registry::start(None);
    let a = Store::open(&t.path().join("a")).unwrap();
    let dir = a.build_dir().unwrap();
    let layer = dir.path().join("l");
    std::fs::create_dir_all(layer.join("app")).unwrap();
    std::fs::write(layer.join("app/hello"), "hi\n").unwrap();
    let diff_id = a.add_layer_dir(&layer).unwrap();
    let dest = format!("127.0.0.1:{}/app:latest", registry.port);
    let image = a
        .add_image(
            &ImageConfig::default(),
            &[diff_id],
            std::slice::from_ref(&dest),
            "test",
        )
        .unwrap();
    drop(dir);
    // No DEST: the image's own registry name.
    let pushed = rt()
        .block_on(a.push(&dest, None, &PushOptions::default()))
        .unwrap();
    assert_eq!(pushed.layers_regenerated, 1);
    assert_eq!(pushed.reference, dest);
    let b = Store::open(&t.path().join("b")).unwrap();
    let back = rt()
        .block_on(b.pull(&dest, &PullOptions::default()))
        .unwrap();
    assert_eq!(back.id, image.id);
    assert_eq!(back.manifest.as_deref(), Some(pushed.manifest.as_str()));
    assert_eq!(
        std::fs::read_to_string(back.layers[0].join("app/hello")).unwrap(),
        "hi\n"
    );
    // A local source is no push destination.
    let e = rt()
        .block_on(a.push(&dest, Some("oci:/tmp/x"), &PushOptions::default()))
        .unwrap_err();
    assert!(matches!(e, ImageError::BadReference { .. }), "{e}");
}

#[test]
fn a_push_uses_basic_and_bearer_credentials_and_fails_clearly_without() {
    if !require(&["docker-registry", "htpasswd", "python3"]) {
        return;
    }
    let t = tmp();
    let a = Store::open(&t.path().join("a")).unwrap();
    let image = pulled(t.path(), &a);

    let basic = Registry::start(Some(("alice", "s3cret")));
    let host = format!("127.0.0.1:{}", basic.port);
    let dest = format!("{host}/bb:1");
    let none = PushOptions {
        auth_file: Some(t.path().join("none.json")),
        ..PushOptions::default()
    };
    let e = rt()
        .block_on(a.push(&image.id, Some(&dest), &none))
        .unwrap_err();
    assert!(matches!(e, ImageError::Unauthorized { .. }), "{e}");
    let creds = PushOptions {
        auth_file: Some(auth_file(t.path(), &host, "alice:s3cret")),
        ..PushOptions::default()
    };
    rt().block_on(a.push(&image.id, Some(&dest), &creds))
        .unwrap();
    let b = Store::open(&t.path().join("b")).unwrap();
    let pull = PullOptions {
        auth_file: creds.auth_file.clone(),
        ..PullOptions::default()
    };
    assert_eq!(rt().block_on(b.pull(&dest, &pull)).unwrap().id, image.id);

    // The Bearer flow: a token for pull,push.
    let plain = Registry::start(None);
    let proxy = TokenProxy::start(plain.port, Some("bob:pw"));
    let host = format!("127.0.0.1:{}", proxy.port);
    let dest = format!("{host}/bb:2");
    let creds = PushOptions {
        auth_file: Some(auth_file(t.path(), &host, "bob:pw")),
        ..PushOptions::default()
    };
    rt().block_on(a.push(&image.id, Some(&dest), &creds))
        .unwrap();
    let c = Store::open(&t.path().join("c")).unwrap();
    let pull = PullOptions {
        auth_file: creds.auth_file.clone(),
        ..PullOptions::default()
    };
    assert_eq!(rt().block_on(c.pull(&dest, &pull)).unwrap().id, image.id);
}

#[test]
fn an_https_registry_is_pushed_to_and_pulled_from_with_its_ca_and_refused_untrusted_naming_it() {
    if !require(&["docker-registry", "openssl"]) {
        return;
    }
    let t = tmp();
    let (ca, crt, key) = test_pki(t.path(), "reg");
    let (other_ca, _, _) = test_pki(t.path(), "other");
    let registry = Registry::start_tls(&crt, &key);
    let host = format!("127.0.0.1:{}", registry.port);
    let a = Store::open(&t.path().join("a")).unwrap();
    let image = pulled(t.path(), &a);
    let dest = format!("{host}/tls/bb:1");
    let trusting = |ca_certs: Vec<std::path::PathBuf>, certs_dirs: Vec<std::path::PathBuf>| Tls {
        ca_certs,
        certs_dirs,
    };
    let push = |tls: Tls| {
        let opts = PushOptions {
            tls,
            ..PushOptions::default()
        };
        rt().block_on(a.push(&image.id, Some(&dest), &opts))
    };

    // Another CA only: https (a CA is given) and the certificate is refused, naming the
    // registry and how to trust it.
    let e = push(trusting(vec![other_ca.clone()], vec![])).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, ImageError::Registry { .. }), "{e:?}");
    assert_eq!(e.exit_code(), 1);
    assert!(
        text.contains(&format!("registry {host}"))
            && text.contains("not trusted")
            && text.contains("--ca-cert"),
        "{text}"
    );
    // A CA file that is no certificate: a usage error naming it.
    let junk = t.path().join("junk.crt");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let e = push(trusting(vec![junk.clone()], vec![])).unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
    assert!(e.to_string().contains("junk.crt"), "{e}");

    // --ca-cert: pushed over https.
    let pushed = push(trusting(vec![ca.clone()], vec![])).unwrap();
    assert!(pushed.blobs_uploaded > 0, "{pushed:?}");

    // certs.d/HOST:PORT/ca.crt: pulled back into an empty store, the same image.
    let certs_d = t.path().join("certs.d");
    std::fs::create_dir_all(certs_d.join(&host)).unwrap();
    std::fs::copy(&ca, certs_d.join(&host).join("ca.crt")).unwrap();
    let b = Store::open(&t.path().join("b")).unwrap();
    let opts = PullOptions {
        tls: trusting(vec![], vec![certs_d]),
        ..PullOptions::default()
    };
    let back = rt().block_on(b.pull(&dest, &opts)).unwrap();
    assert_eq!(back.id, image.id);
    assert_eq!(back.manifest.as_deref(), Some(pushed.manifest.as_str()));
    // Without any CA for it, a loopback registry is plain http, which this one refuses.
    let opts = PullOptions {
        tls: trusting(vec![], vec![]),
        ..PullOptions::default()
    };
    let e = rt()
        .block_on(b.pull(&format!("{host}/tls/bb:1"), &opts))
        .unwrap_err();
    assert!(
        e.to_string().contains(&format!("registry {host}")) && e.to_string().contains("--ca-cert"),
        "{e}"
    );
}
