//! Test helpers: hand-made tar layers (names written raw, so hostile ones can be made), OCI
//! layouts written by hand (tar + gzip + sha256 + JSON), a real `docker-registry` on a free
//! loopback port, and a token front of our own (token_proxy.py). No mocks.

#![allow(dead_code)]

use sha2::{Digest as _, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// One tar entry, its name written byte for byte.
pub enum E<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str, u32),
    Symlink(&'a str, &'a str),
    Link(&'a str, &'a str),
    Char(&'a str),
    Fifo(&'a str),
}

/// A tar stream of `entries`, in order.
pub fn tar_of(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (name, kind, data, mode, link): (&str, tar::EntryType, &[u8], u32, &str) = match e {
            E::File(n, d, m) => (n, tar::EntryType::Regular, d, *m, ""),
            E::Dir(n, m) => (n, tar::EntryType::Directory, b"", *m, ""),
            E::Symlink(n, t) => (n, tar::EntryType::Symlink, b"", 0o777, t),
            E::Link(n, t) => (n, tar::EntryType::Link, b"", 0o644, t),
            E::Char(n) => (n, tar::EntryType::Char, b"", 0o644, ""),
            E::Fifo(n) => (n, tar::EntryType::Fifo, b"", 0o644, ""),
        };
        let mut h = tar::Header::new_ustar();
        {
            let raw = h.as_old_mut();
            raw.name = [0; 100];
            raw.name[..name.len()].copy_from_slice(name.as_bytes());
            raw.linkname = [0; 100];
            raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 3).unwrap()
}

pub fn sha(data: &[u8]) -> String {
    let h = Sha256::digest(data);
    format!(
        "sha256:{}",
        h.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// A layer: its tar stream and how it is compressed in the blob.
pub struct Layer {
    pub tar: Vec<u8>,
    pub blob: Vec<u8>,
    pub media_type: &'static str,
}

impl Layer {
    pub fn gz(tar: Vec<u8>) -> Layer {
        Layer {
            blob: gzip(&tar),
            tar,
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
        }
    }
    pub fn zst(tar: Vec<u8>) -> Layer {
        Layer {
            blob: zstd(&tar),
            tar,
            media_type: "application/vnd.oci.image.layer.v1.tar+zstd",
        }
    }
    pub fn plain(tar: Vec<u8>) -> Layer {
        Layer {
            blob: tar.clone(),
            tar,
            media_type: "application/vnd.oci.image.layer.v1.tar",
        }
    }
}

/// An image config for `layers` (base first).
pub fn config_of(layers: &[Layer], cmd: &[&str]) -> Vec<u8> {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha(&l.tar)).collect();
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
        "config": { "Env": ["PATH=/bin", "GREETING=hi"], "Cmd": cmd, "WorkingDir": "/opt", "User": "1000:1000",
                    "Labels": {"org.example": "yes"} },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))
    .unwrap()
}

fn put_blob(dir: &Path, data: &[u8]) -> String {
    let d = sha(data);
    std::fs::write(dir.join("blobs/sha256").join(&d[7..]), data).unwrap();
    d
}

/// Writes an OCI image layout at `dir` holding one image tagged `tag`; returns the
/// manifest's digest and the config's (the image id).
pub fn write_layout(dir: &Path, tag: &str, layers: &[Layer], config: &[u8]) -> (String, String) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let cfg = put_blob(dir, config);
    let layer_descs: Vec<serde_json::Value> = layers
        .iter()
        .map(|l| serde_json::json!({"mediaType": l.media_type, "digest": put_blob(dir, &l.blob), "size": l.blob.len()}))
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg, "size": config.len()},
        "layers": layer_descs,
    }))
    .unwrap();
    let m = put_blob(dir, &manifest);
    // Merge into an existing index (several tags in one layout).
    let index_path = dir.join("index.json");
    let mut index: serde_json::Value = std::fs::read(&index_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({"schemaVersion": 2, "manifests": []}));
    index["manifests"].as_array_mut().unwrap().push(serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m, "size": manifest.len(),
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }));
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    (m, cfg)
}

/// The busybox test image: layer 1 busybox (from busybox-static) with its applet symlinks,
/// /etc/motd and /opt/data/{a,b}; layer 2 deletes /etc/motd (a whiteout), makes /opt/data
/// opaque with a new file c, and adds a hard link. Two layers: gzip and zstd.
pub fn busybox_layers() -> Vec<Layer> {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let l1 = tar_of(&[
        E::Dir("bin/", 0o755),
        E::File("bin/busybox", &busybox, 0o755),
        E::Symlink("bin/sh", "busybox"),
        E::Symlink("bin/ls", "busybox"),
        E::Symlink("bin/cat", "/bin/busybox"),
        E::Dir("etc/", 0o755),
        E::File("etc/motd", b"welcome\n", 0o644),
        E::File("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644),
        E::Dir("opt/", 0o755),
        E::Dir("opt/data/", 0o755),
        E::File("opt/data/a", b"a\n", 0o644),
        E::File("opt/data/b", b"b\n", 0o644),
    ]);
    let l2 = tar_of(&[
        E::Dir("etc/", 0o755),
        E::File("etc/.wh.motd", b"", 0o644),
        E::Dir("opt/data/", 0o755),
        E::File("opt/data/.wh..wh..opq", b"", 0o644),
        E::File("opt/data/c", b"c\n", 0o644),
        E::Link("opt/data/c2", "opt/data/c"),
    ]);
    vec![Layer::gz(l1), Layer::zst(l2)]
}

/// True when `tools` are all installed; else a loud skip, or a failure under
/// `LOCKBOX_TEST_REQUIRE=all`.
pub fn require(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .unwrap()
                .success()
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var("LOCKBOX_TEST_REQUIRE").as_deref() == Ok("all") {
        panic!("missing {missing:?} (LOCKBOX_TEST_REQUIRE=all)");
    }
    eprintln!("SKIP: missing {missing:?} (scripts/test.sh installs them)");
    false
}

/// True if an overlay can be mounted in a user namespace here (loud skip otherwise).
pub fn require_overlay() -> bool {
    let d = tempfile::tempdir().unwrap();
    for s in ["l", "k", "m"] {
        std::fs::create_dir(d.path().join(s)).unwrap();
    }
    let ok = Command::new("unshare")
        .args(["-Urm", "mount", "-t", "overlay", "overlay", "-o"])
        .arg(format!(
            "userxattr,lowerdir={0}/l:{0}/k",
            d.path().display()
        ))
        .arg(d.path().join("m"))
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("LOCKBOX_TEST_REQUIRE").as_deref() == Ok("all") {
            panic!("overlayfs in a user namespace is required (LOCKBOX_TEST_REQUIRE=all)");
        }
        eprintln!("SKIP: cannot mount overlayfs in an unprivileged user namespace here");
    }
    ok
}

/// Runs `script` in a user+mount namespace where `layers` (top first) are mounted read-only
/// as one overlay at $ROOT; returns its stdout.
pub fn in_overlay(layers: &[PathBuf], script: &str) -> String {
    let m = tempfile::tempdir().unwrap();
    let lower = layers
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let full = format!(
        "mount -t overlay overlay -o userxattr,lowerdir={lower} {m} || exit 99\nROOT={m}\n{script}",
        m = m.path().display()
    );
    let out = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &full])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(port: u16, child: &mut Child) {
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("server on port {port} ended: {st}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("nothing listens on port {port}");
}

/// A `docker-registry` on 127.0.0.1 with filesystem storage in a temp dir; with `user`, an
/// htpasswd-protected one (Basic auth).
pub struct Registry {
    pub port: u16,
    child: Child,
    pub dir: tempfile::TempDir,
}

impl Registry {
    pub fn start(user: Option<(&str, &str)>) -> Registry {
        Registry::start_with(user, None)
    }

    /// An https one, serving `cert` (PEM, with its chain) and `key`.
    pub fn start_tls(cert: &Path, key: &Path) -> Registry {
        Registry::start_with(None, Some((cert, key)))
    }

    fn start_with(user: Option<(&str, &str)>, tls: Option<(&Path, &Path)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut auth = String::new();
        if let Some((u, p)) = user {
            let file = dir.path().join("htpasswd");
            let st = Command::new("htpasswd")
                .args(["-Bbc"])
                .arg(&file)
                .args([u, p])
                .stderr(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success());
            auth = format!(
                "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                file.display()
            );
        }
        let tls = tls.map_or(String::new(), |(cert, key)| {
            format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            )
        });
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}/data\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{tls}{auth}",
            dir.path().display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_port(port, &mut child);
        Registry { port, child, dir }
    }

    /// Pushes every platform of the OCI layout `layout:tag` as `repo:tag` with skopeo.
    pub fn push_all(&self, layout: &Path, tag: &str, repo: &str) {
        self.push_with(layout, tag, repo, None, true)
    }

    /// Pushes the OCI layout `layout:tag` as `repo:tag` with skopeo.
    pub fn push(&self, layout: &Path, tag: &str, repo: &str, creds: Option<&str>) {
        self.push_with(layout, tag, repo, creds, false)
    }

    fn push_with(&self, layout: &Path, tag: &str, repo: &str, creds: Option<&str>, all: bool) {
        let policy = self.dir.path().join("policy.json");
        std::fs::write(
            &policy,
            br#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )
        .unwrap();
        let mut cmd = Command::new("skopeo");
        cmd.args(["--policy"])
            .arg(&policy)
            .args(["copy", "-q", "--dest-tls-verify=false"]);
        if let Some(c) = creds {
            cmd.args(["--dest-creds", c]);
        }
        if all {
            cmd.arg("--all");
        }
        let out = cmd
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://127.0.0.1:{}/{repo}:{tag}", self.port))
            .env("HOME", self.dir.path())
            .env("TMPDIR", self.dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo copy: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// token_proxy.py in front of a registry: Bearer challenges, a token endpoint (that wants
/// `user` as Basic credentials, if given), and misbehaving repositories.
pub struct TokenProxy {
    pub port: u16,
    child: Child,
}

impl TokenProxy {
    pub fn start(upstream: u16, user: Option<&str>) -> TokenProxy {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/token_proxy.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).arg(upstream.to_string());
        if let Some(u) = user {
            cmd.arg(u);
        }
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port: u16 = line.trim().parse().unwrap();
        wait_port(port, &mut child);
        TokenProxy { port, child }
    }
}

impl Drop for TokenProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temp dir for a test, reachable by whoever runs it.
pub fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("lockbox-image-test")
        .tempdir_in("/tmp")
        .unwrap()
}

/// An auth file (containers-auth.json format) with `user:password` for `host`.
pub fn auth_file(dir: &Path, host: &str, user_pass: &str) -> PathBuf {
    use base64::Engine as _;
    let p = dir.join("auth.json");
    let auth = base64::engine::general_purpose::STANDARD.encode(user_pass);
    std::fs::write(
        &p,
        format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
    p
}

/// An OCI layout at `dir` whose tag `multi` is an index of two images: linux/amd64 and
/// linux/arm64/v8 (each with one file, `arch`). Returns their ids (amd64, arm64).
pub fn multi_platform_layout(lay: &Path) -> (String, String) {
    // Two single-image layouts' manifests, then an index of both as the tagged entry.
    let a = vec![Layer::gz(tar_of(&[E::File("arch", b"amd64", 0o644)]))];
    let b = vec![Layer::gz(tar_of(&[E::File("arch", b"arm64", 0o644)]))];
    let mut cb: serde_json::Value = serde_json::from_slice(&config_of(&b, &[])).unwrap();
    cb["architecture"] = "arm64".into();
    let (ma, ida) = write_layout(lay, "a", &a, &config_of(&a, &[]));
    let (mb, idb) = write_layout(lay, "b", &b, &serde_json::to_vec(&cb).unwrap());
    let size = |m: &str| {
        std::fs::metadata(lay.join("blobs/sha256").join(&m[7..]))
            .unwrap()
            .len()
    };
    let index = serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": ma, "size": size(&ma), "platform": {"os": "linux", "architecture": "amd64"}},
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mb, "size": size(&mb), "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
    ]})).unwrap();
    let di = sha(&index);
    std::fs::write(lay.join("blobs/sha256").join(&di[7..]), &index).unwrap();
    let top = serde_json::json!({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": di, "size": index.len(), "annotations": {"org.opencontainers.image.ref.name": "multi"}}]});
    std::fs::write(lay.join("index.json"), serde_json::to_vec(&top).unwrap()).unwrap();
    (ida, idb)
}

/// A test CA and a server certificate it signs for IP 127.0.0.1, made with openssl in
/// `dir`: (the CA's certificate, the server's certificate, the server's key), all PEM.
pub fn test_pki(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let p = |f: &str| dir.join(format!("{name}-{f}"));
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let s = |p: &PathBuf| p.to_str().unwrap().to_owned();
    let (ca, ca_key, crt, key, csr, ext) = (
        p("ca.crt"),
        p("ca.key"),
        p("server.crt"),
        p("server.key"),
        p("server.csr"),
        p("server.ext"),
    );
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let subject = format!("/CN=lockbox test CA {name}");
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
    args.extend(ec);
    let (ca_s, ca_key_s) = (s(&ca), s(&ca_key));
    args.extend(["-keyout", &ca_key_s, "-out", &ca_s]);
    openssl(&args);
    let (csr_s, key_s, crt_s, ext_s) = (s(&csr), s(&key), s(&crt), s(&ext));
    let mut args = vec!["req", "-subj", "/CN=127.0.0.1"];
    args.extend(ec);
    args.extend(["-keyout", &key_s, "-out", &csr_s]);
    openssl(&args);
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-days",
        "2",
        "-set_serial",
        "1",
        "-in",
        &csr_s,
        "-CA",
        &ca_s,
        "-CAkey",
        &ca_key_s,
        "-extfile",
        &ext_s,
        "-out",
        &crt_s,
    ]);
    (ca, crt, key)
}
