//! Images moving between hosts, end to end with the `lockbox` binary: `image save` / `image
//! load` (OCI and `docker save` archives) into another state directory, then `run --image`
//! there; as the current user and (as root) as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::common::{give, lockbox, scratch, text, users};
use lockbox_testkit::oci;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// An OCI layout at `dir`, tag `v1`: one uncompressed busybox layer (from busybox-static).
fn layout(dir: &Path) {
    let root = dir.join("rootfs");
    oci::busybox_root(&root, &["sh"]);
    oci::layout(
        dir,
        &root,
        serde_json::json!({"Env": ["PATH=/bin"], "Cmd": ["sh"]}),
        "v1",
    );
}

fn json_of(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", text(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

fn has(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A built image (one RUN layer on the busybox layout) in state dir `st`, named `app`.
fn build_app(user: common::User, w: &Path, st: &str) -> String {
    let ctx = w.join("ctx");
    let base = format!("oci:{}:v1", w.join("lay").display());
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM {base}\nRUN echo built > /built.txt\nCMD [\"busybox\", \"cat\", \"/built.txt\"]\n"),
    )
    .unwrap();
    let built = json_of(&lockbox(
        user,
        w,
        &[
            "image",
            "build",
            "-t",
            "app",
            "--json",
            "--state-dir",
            st,
            ctx.to_str().unwrap(),
        ],
    ));
    built["id"].as_str().unwrap().to_owned()
}

#[test]
fn a_saved_image_loads_in_another_state_dir_with_its_id_and_runs_there() {
    for user in users() {
        let work = scratch();
        layout(&work.path().join("lay"));
        std::fs::create_dir_all(work.path().join("ctx")).unwrap();
        give(work.path(), user);
        let w = work.path();
        let a = w.join("a");
        let st = a.to_str().unwrap();
        let id = build_app(user, w, st);

        // OCI archive: the built layer is written again from its directory and verified.
        let file = w.join("app.tar");
        let saved = json_of(&lockbox(
            user,
            w,
            &[
                "image",
                "save",
                "app",
                "-o",
                file.to_str().unwrap(),
                "--json",
                "--state-dir",
                st,
            ],
        ));
        assert_eq!(saved["id"], id.as_str(), "{user:?}");
        assert_eq!(saved["format"], "oci-archive");
        assert_eq!(saved["layers_regenerated"], 1);
        assert_eq!(saved["names"][0], "docker.io/library/app:latest");

        // Loaded into an empty store: the same id and manifest, its name, and it runs.
        let b = w.join("b");
        let loaded = json_of(&lockbox(
            user,
            w,
            &[
                "image",
                "load",
                file.to_str().unwrap(),
                "--json",
                "--state-dir",
                b.to_str().unwrap(),
            ],
        ));
        assert_eq!(loaded["id"], id.as_str());
        assert_eq!(loaded["manifest"], saved["manifest"]);
        assert_eq!(loaded["references"][0], "docker.io/library/app:latest");
        let out = lockbox(
            user,
            w,
            &[
                "run",
                "--image",
                "app",
                "--pull",
                "never",
                "--state-dir",
                b.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "built\n");

        // The human form names the id and the file.
        let docker = w.join("app-docker.tar");
        let out = lockbox(
            user,
            w,
            &[
                "image",
                "save",
                &id,
                "-o",
                docker.to_str().unwrap(),
                "--format",
                "docker-archive",
                "--state-dir",
                st,
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        assert!(text(&out).contains("docker-archive"), "{}", text(&out));
        let c = w.join("c");
        let loaded = json_of(&lockbox(
            user,
            w,
            &[
                "image",
                "load",
                docker.to_str().unwrap(),
                "--json",
                "--state-dir",
                c.to_str().unwrap(),
            ],
        ));
        assert_eq!(loaded["id"], id.as_str());

        // Debian's skopeo reads the OCI archive.
        if has("skopeo") {
            let out = Command::new("skopeo")
                .args(["inspect", "--config", "--raw"])
                .arg(format!("oci-archive:{}", file.display()))
                .env("TMPDIR", w)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", text(&out));
            assert_eq!(oci::digest(&out.stdout), id);
        }

        // Bad input: an unknown format is a usage error; a missing image exits 2; a file
        // that is no image archive exits 1 and names what it lacks.
        let out = lockbox(
            user,
            w,
            &[
                "image",
                "save",
                "app",
                "-o",
                "x.tar",
                "--format",
                "zip",
                "--state-dir",
                st,
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let out = lockbox(
            user,
            w,
            &["image", "save", "nope", "-o", "x.tar", "--state-dir", st],
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(!w.join("x.tar").exists());
        let out = lockbox(
            user,
            w,
            &[
                "image",
                "load",
                w.join("lay/layer.tar").to_str().unwrap(),
                "--state-dir",
                st,
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            text(&out).contains("neither an OCI archive"),
            "{}",
            text(&out)
        );
    }
}

/// A `docker-registry` on a free loopback port, storage in `dir`; killed on drop.
struct Registry {
    port: u16,
    child: std::process::Child,
}

impl Registry {
    fn start(dir: &Path) -> Registry {
        Registry::start_with(dir, "")
    }

    /// An https one whose certificate (for IP 127.0.0.1) a CA made here signs; the CA's
    /// certificate is `dir/pki/ca.crt`.
    fn start_tls(dir: &Path) -> Registry {
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).unwrap();
        let script = r#"set -e
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 -days 2 -subj "/CN=lockbox test CA" $ec -keyout ca.key -out ca.crt
openssl req -subj /CN=127.0.0.1 $ec -keyout server.key -out server.csr
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -days 2 -set_serial 1 -in server.csr -CA ca.crt -CAkey ca.key -extfile server.ext -out server.crt
chmod a+r ca.crt
"#;
        let out = Command::new("sh")
            .args(["-c", script])
            .current_dir(&pki)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let tls = format!(
            "  tls:\n    certificate: {0}/server.crt\n    key: {0}/server.key\n",
            pki.display()
        );
        Registry::start_with(dir, &tls)
    }

    fn start_with(dir: &Path, tls: &str) -> Registry {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}/data\nhttp:\n  addr: 127.0.0.1:{port}\n{tls}",
            dir.display()
        );
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.yml"), config).unwrap();
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..600 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Registry { port, child };
            }
            assert!(child.try_wait().unwrap().is_none(), "docker-registry ended");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("docker-registry does not listen");
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `lockbox` with HOME set to `dir`: the registry credentials looked up are the test's (none),
/// not those of the user the tests run as (uid 65534 cannot read /root/.docker).
fn lockbox_at_home(user: common::User, dir: &Path, args: &[&str]) -> std::process::Output {
    common::command_as(user)
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir.join(".config"))
        .output()
        .unwrap()
}

#[test]
fn an_https_registry_is_trusted_by_ca_cert_or_certs_d_and_untrusted_is_named() {
    if !has("docker-registry") || !has("openssl") {
        assert_ne!(
            std::env::var("LOCKBOX_TEST_REQUIRE").as_deref(),
            Ok("all"),
            "docker-registry and openssl are required"
        );
        eprintln!("SKIP: docker-registry or openssl is not installed");
        return;
    }
    let reg = scratch();
    let registry = Registry::start_tls(&reg.path().join("registry"));
    let host = format!("127.0.0.1:{}", registry.port);
    for (n, user) in users().into_iter().enumerate() {
        let work = scratch();
        let w = work.path();
        layout(&w.join("lay"));
        std::fs::create_dir_all(w.join("ctx")).unwrap();
        std::fs::create_dir_all(w.join("ctx2")).unwrap();
        std::fs::copy(reg.path().join("registry/pki/ca.crt"), w.join("ca.crt")).unwrap();
        std::fs::write(w.join("junk.crt"), "not a certificate\n").unwrap();
        let dest = format!("{host}/team/app:{n}");
        std::fs::write(
            w.join("ctx2/Dockerfile"),
            format!("FROM {dest}\nRUN echo more > /more.txt\n"),
        )
        .unwrap();
        give(w, user);
        let st = w.join("a");
        let st = st.to_str().unwrap();
        let id = build_app(user, w, st);

        // --ca-cert: push over https, and build on the pushed image in another store.
        let out = lockbox_at_home(
            user,
            w,
            &[
                "image",
                "push",
                "--ca-cert",
                "ca.crt",
                "app",
                &dest,
                "--state-dir",
                st,
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        let out = lockbox_at_home(
            user,
            w,
            &[
                "image",
                "build",
                "-t",
                "more",
                "--ca-cert",
                "ca.crt",
                "--state-dir",
                "c",
                "ctx2",
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));

        // Nothing says to trust it: an error naming the registry and how to trust it.
        let out = lockbox_at_home(user, w, &["image", "pull", &dest, "--state-dir", "b"]);
        assert_eq!(out.status.code(), Some(1), "{user:?} {}", text(&out));
        assert!(
            text(&out).contains(&format!("registry {host}")) && text(&out).contains("--ca-cert"),
            "{}",
            text(&out)
        );
        // `run --image` and a transaction's stages pull with the same --ca-cert.
        let out = lockbox_at_home(
            user,
            w,
            &[
                "run",
                "--image",
                &dest,
                "--ca-cert",
                "ca.crt",
                "--state-dir",
                "d",
                "--",
                "sh",
                "-c",
                "exit 0",
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        std::fs::create_dir_all(w.join("proj")).unwrap();
        give(w, user);
        let out = lockbox_at_home(
            user,
            w,
            &[
                "pipeline",
                "--workdir",
                "proj",
                "--image",
                &dest,
                "--ca-cert",
                "ca.crt",
                "--state-dir",
                "e",
                "--stage",
                "echo on-image > out",
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        assert_eq!(
            std::fs::read_to_string(w.join("proj/out")).unwrap(),
            "on-image\n"
        );
        // A CA file that holds no certificate: exit 2 naming it.
        let out = lockbox_at_home(
            user,
            w,
            &[
                "image",
                "pull",
                "--ca-cert",
                "junk.crt",
                &dest,
                "--state-dir",
                "b",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{user:?} {}", text(&out));
        assert!(text(&out).contains("junk.crt"), "{}", text(&out));

        // certs.d/HOST:PORT/ca.crt (the user's): pulled and run.
        let certs = w.join(".config/containers/certs.d").join(&host);
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::copy(w.join("ca.crt"), certs.join("ca.crt")).unwrap();
        give(w, user);
        let pulled = json_of(&lockbox_at_home(
            user,
            w,
            &["image", "pull", &dest, "--json", "--state-dir", "b"],
        ));
        assert_eq!(pulled["id"], id.as_str());
        let out = lockbox_at_home(
            user,
            w,
            &[
                "run",
                "--image",
                &dest,
                "--pull",
                "never",
                "--state-dir",
                "b",
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "built\n",
            "{user:?} {}",
            text(&out)
        );
    }
}

#[test]
fn a_pushed_image_pulls_into_an_empty_store_and_runs() {
    if !has("docker-registry") {
        assert_ne!(
            std::env::var("LOCKBOX_TEST_REQUIRE").as_deref(),
            Ok("all"),
            "docker-registry is required"
        );
        eprintln!("SKIP: docker-registry is not installed (scripts/test.sh installs it)");
        return;
    }
    let reg = scratch();
    let registry = Registry::start(&reg.path().join("registry"));
    for (n, user) in users().into_iter().enumerate() {
        let work = scratch();
        layout(&work.path().join("lay"));
        std::fs::create_dir_all(work.path().join("ctx")).unwrap();
        give(work.path(), user);
        let w = work.path();
        let a = w.join("a");
        let st = a.to_str().unwrap();
        let id = build_app(user, w, st);
        let dest = format!("127.0.0.1:{}/team/app:{n}", registry.port);
        let pushed = json_of(&lockbox_at_home(
            user,
            w,
            &[
                "image",
                "push",
                "app",
                &dest,
                "--chunk-size",
                "64K",
                "--json",
                "--state-dir",
                st,
            ],
        ));
        assert_eq!(pushed["id"], id.as_str(), "{user:?}");
        assert_eq!(pushed["reference"], dest.as_str());
        assert_eq!(pushed["layers_regenerated"], 1);
        let manifest = pushed["manifest"].as_str().unwrap().to_owned();

        // Again: nothing to send but the manifest; the human form says so.
        let out = lockbox_at_home(user, w, &["image", "push", "app", &dest, "--state-dir", st]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("0 blobs sent, 3 already there"),
            "{}",
            text(&out)
        );

        // An empty store pulls it (by tag and by the manifest's digest) and runs it.
        let b = w.join("b");
        let bs = b.to_str().unwrap();
        let pulled = json_of(&lockbox_at_home(
            user,
            w,
            &["image", "pull", &dest, "--json", "--state-dir", bs],
        ));
        assert_eq!(pulled["id"], id.as_str());
        assert_eq!(pulled["manifest"], manifest.as_str());
        let out = lockbox_at_home(
            user,
            w,
            &[
                "run",
                "--image",
                &dest,
                "--pull",
                "never",
                "--state-dir",
                bs,
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "built\n");

        // A local destination is a usage error naming what a push needs.
        let out = lockbox_at_home(
            user,
            w,
            &["image", "push", "app", "oci:/tmp/x", "--state-dir", st],
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("registry reference"), "{}", text(&out));
    }
}

#[test]
fn copy_from_an_image_reference_copies_out_of_that_image() {
    for user in users() {
        let work = scratch();
        layout(&work.path().join("lay"));
        std::fs::create_dir_all(work.path().join("ctx")).unwrap();
        give(work.path(), user);
        let w = work.path();
        let st = w.join("s");
        let st = st.to_str().unwrap();
        let base = format!("oci:{}:v1", w.join("lay").display());
        // Not pulled first: COPY --from pulls it, as FROM does.
        std::fs::write(
            w.join("ctx/Dockerfile"),
            format!("FROM scratch\nCOPY --from={base} /bin/busybox /bin/busybox\nCMD [\"/bin/busybox\", \"echo\", \"copied\"]\n"),
        )
        .unwrap();
        let ctx = w.join("ctx");
        let out = lockbox(
            user,
            w,
            &[
                "image",
                "build",
                "-t",
                "tiny",
                "--state-dir",
                st,
                ctx.to_str().unwrap(),
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        let out = lockbox(
            user,
            w,
            &[
                "run",
                "--image",
                "tiny",
                "--pull",
                "never",
                "--state-dir",
                st,
            ],
        );
        assert!(out.status.success(), "{user:?} {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "copied\n");

        // A --from that is neither a stage nor a reference names its line.
        std::fs::write(
            w.join("ctx/Dockerfile"),
            "FROM scratch\nCOPY --from=Not:A:Ref /x /x\n",
        )
        .unwrap();
        let out = lockbox(
            user,
            w,
            &[
                "image",
                "build",
                "-t",
                "bad",
                "--state-dir",
                st,
                ctx.to_str().unwrap(),
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("line 2"), "{}", text(&out));
    }
}
