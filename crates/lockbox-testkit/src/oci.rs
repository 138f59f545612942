//! OCI image layouts for tests, made here from a directory: no registry, no network. The
//! userland is Debian's busybox-static (`/bin/busybox`), optionally with bash-static.

use std::path::Path;
use std::process::Command;

use sha2::Digest as _;

/// `sha256:HEX` of `data`: an OCI digest.
pub fn digest(data: &[u8]) -> String {
    let hex: String = sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// Writes `data` as a blob of the layout at `dir`; returns its digest.
pub fn blob(dir: &Path, data: &[u8]) -> String {
    let d = digest(data);
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("blobs/sha256").join(&d[7..]), data).unwrap();
    d
}

/// Fills `root` with `/bin/busybox` (the host's, from busybox-static) and `/bin/APPLET`
/// symlinks to it for each of `applets`.
pub fn busybox_root(root: &Path, applets: &[&str]) {
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in applets {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
}

/// Writes an OCI image layout at `dir` whose tag `tag` is one uncompressed layer, the tar of
/// `root` (sorted, owned by 0:0, mtime 0: the same bytes every time), with `config` as the
/// image config's `config` (Env, Cmd, WorkingDir...), for linux/amd64. Returns the image id
/// (the config's digest).
pub fn layout(dir: &Path, root: &Path, config: serde_json::Value, tag: &str) -> String {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    let tar = dir.join("layer.tar");
    let st = Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
        ])
        .arg("-C")
        .arg(root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar of {}: {st}", root.display());
    let layer = std::fs::read(&tar).unwrap();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blob(dir, &config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": blob(dir, &layer), "size": layer.len()}],
    }))
    .unwrap();
    let m = blob(dir, &manifest);
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": m, "size": manifest.len(), "annotations": {"org.opencontainers.image.ref.name": tag}}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    digest(&config)
}
