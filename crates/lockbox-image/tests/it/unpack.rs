//! Layers unpacked into overlayfs format: whiteouts and opaque directories the kernel
//! honours in an unprivileged mount, and hostile layers refused with nothing left behind.

use crate::common::*;
use lockbox_image::{ImageError, PullOptions, Store};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Pulls a one-image layout of `layers` into a fresh store; returns the store dir too.
fn pull_layers(
    layers: Vec<Layer>,
    opts: &PullOptions,
) -> (
    tempfile::TempDir,
    Store,
    Result<lockbox_image::Image, ImageError>,
) {
    let t = tmp();
    let config = config_of(&layers, &["sh"]);
    write_layout(&t.path().join("layout"), "v1", &layers, &config);
    let store = Store::open(&t.path().join("store")).unwrap();
    let r = rt().block_on(store.pull(
        &format!("oci:{}:v1", t.path().join("layout").display()),
        opts,
    ));
    (t, store, r)
}

/// Nothing of a failed pull is left: no layer, no temp file.
fn assert_nothing_left(store: &Path) {
    for sub in ["layers", "tmp", "images"] {
        let left: Vec<_> = std::fs::read_dir(store.join(sub))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{sub}/ has {left:?}");
    }
}

#[test]
fn whiteouts_and_opaque_dirs_hide_lower_entries_in_a_userxattr_overlay() {
    let (_t, _store, image) = pull_layers(busybox_layers(), &PullOptions::default());
    let image = image.unwrap();
    assert_eq!(image.layers.len(), 2);
    // The top layer holds the whiteout (a 0:0 character device) and the opaque marker.
    let top = &image.layers[0];
    let wh = std::fs::symlink_metadata(top.join("etc/motd")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{wh:?}");
    let opaque = rustix::fs::getxattr(
        top.join("opt/data"),
        "user.overlay.opaque",
        &mut [0u8; 8][..],
    )
    .unwrap();
    assert_eq!(opaque, 1);
    assert!(!top.join("opt/data/.wh..wh..opq").exists());
    // Hard link within the layer.
    let (c, c2) = (
        std::fs::metadata(top.join("opt/data/c")).unwrap(),
        std::fs::metadata(top.join("opt/data/c2")).unwrap(),
    );
    assert_eq!(c.ino(), c2.ino());
    // Symlinks are stored as they are, even absolute ones.
    assert_eq!(
        std::fs::read_link(image.layers[1].join("bin/cat")).unwrap(),
        Path::new("/bin/busybox")
    );
    if !require_overlay() {
        return;
    }
    let out = in_overlay(
        &image.layers,
        "ls $ROOT/etc; echo --; ls $ROOT/opt/data; echo --; $ROOT/bin/busybox echo busybox runs",
    );
    assert_eq!(out, "passwd\n--\nc\nc2\n--\nbusybox runs\n");
}

#[test]
fn devices_and_fifos_are_skipped_setid_bits_stripped_and_both_reported() {
    let layer = tar_of(&[
        E::Dir("dev/", 0o755),
        E::Char("dev/null"),
        E::Fifo("run/fifo"),
        E::File("bin/su", b"#!/bin/sh\n", 0o4755),
        E::File("bin/wall", b"#!/bin/sh\n", 0o2755),
    ]);
    let (_t, _s, image) = pull_layers(vec![Layer::gz(layer)], &PullOptions::default());
    let image = image.unwrap();
    let info = &image.layer_info[0];
    assert_eq!(
        info.skipped,
        ["dev/null (character device)", "run/fifo (fifo)"]
    );
    assert_eq!(info.setid_stripped, ["bin/su", "bin/wall"]);
    let root = &image.layers[0];
    assert!(!root.join("dev/null").exists() && !root.join("run/fifo").exists());
    assert_eq!(
        std::fs::metadata(root.join("bin/su"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    assert_eq!(
        std::fs::metadata(root.join("bin/wall"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
}

#[test]
fn read_only_directories_are_filled_then_made_read_only_and_still_removable() {
    let layer = tar_of(&[
        E::Dir("ro/", 0o555),
        E::Dir("ro/sub/", 0o500),
        E::File("ro/sub/f", b"x", 0o400),
    ]);
    let (_t, store, image) = pull_layers(vec![Layer::plain(layer)], &PullOptions::default());
    let image = image.unwrap();
    let root = &image.layers[0];
    assert_eq!(
        std::fs::metadata(root.join("ro"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o555
    );
    assert_eq!(std::fs::read(root.join("ro/sub/f")).unwrap(), b"x");
    store.remove(&image.id).unwrap();
    assert_nothing_left(store.path());
    assert!(!root.exists());
}

/// Each hostile layer, the entry its error must name.
#[test]
fn hostile_entries_are_refused_naming_the_entry_and_leave_nothing_behind() {
    let outside = tmp();
    let out = outside.path().display().to_string();
    let cases: Vec<(Vec<u8>, &str, &str)> = vec![
        (
            tar_of(&[E::File("../evil", b"x", 0o644)]),
            "../evil",
            "`..`",
        ),
        (
            tar_of(&[E::File("a/../../evil", b"x", 0o644)]),
            "a/../../evil",
            "`..`",
        ),
        (
            tar_of(&[E::File("/etc/evil", b"x", 0o644)]),
            "/etc/evil",
            "absolute",
        ),
        (
            tar_of(&[E::Symlink("esc", &out), E::File("esc/pwned", b"x", 0o644)]),
            "esc/pwned",
            "symlink",
        ),
        (
            tar_of(&[E::Symlink("up", ".."), E::File("up/pwned", b"x", 0o644)]),
            "up/pwned",
            "symlink",
        ),
        (
            tar_of(&[E::Link("hl", "../../etc/passwd")]),
            "hl",
            "outside the layer",
        ),
        (
            tar_of(&[E::Link("hl", "/etc/passwd")]),
            "hl",
            "outside the layer",
        ),
        (
            tar_of(&[E::Link("hl", "later"), E::File("later", b"x", 0o644)]),
            "hl",
            "not an earlier entry",
        ),
        (
            tar_of(&[E::Symlink("s", "/etc"), E::Link("hl", "s/passwd")]),
            "hl",
            "not an earlier entry",
        ),
        (
            tar_of(&[E::File("d/.wh...", b"", 0o644)]),
            "d/.wh...",
            "whiteout",
        ),
    ];
    for (layer, entry, why) in cases {
        let (t, _s, r) = pull_layers(vec![Layer::gz(layer)], &PullOptions::default());
        match r {
            Err(ImageError::HostileEntry {
                entry: e, reason, ..
            }) => {
                assert_eq!(e, entry);
                assert!(reason.contains(why), "{entry}: {reason}");
            }
            other => panic!("{entry}: {other:?}"),
        }
        assert_nothing_left(&t.path().join("store"));
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "{entry} wrote outside"
        );
    }
}

#[test]
fn a_layer_whose_content_is_not_its_diff_id_is_refused() {
    let layers = vec![Layer::gz(tar_of(&[E::File("f", b"real", 0o644)]))];
    let t = tmp();
    let mut config: serde_json::Value = serde_json::from_slice(&config_of(&layers, &[])).unwrap();
    config["rootfs"]["diff_ids"][0] = serde_json::json!(sha(b"something else"));
    write_layout(
        &t.path().join("l"),
        "v1",
        &layers,
        &serde_json::to_vec(&config).unwrap(),
    );
    let store = Store::open(&t.path().join("store")).unwrap();
    let e = rt()
        .block_on(store.pull(
            &format!("oci:{}:v1", t.path().join("l").display()),
            &PullOptions::default(),
        ))
        .unwrap_err();
    assert!(
        matches!(e, ImageError::DigestMismatch { ref what, .. } if what.contains("diff id")),
        "{e}"
    );
    assert_nothing_left(store.path());
}

#[test]
fn a_truncated_layer_stream_is_refused() {
    let tar = tar_of(&[E::File("f", &vec![7u8; 200_000], 0o644)]);
    let gz = gzip(&tar);
    let cut = gz[..gz.len() / 2].to_vec();
    let (t, _s, r) = pull_layers(
        vec![Layer {
            tar,
            blob: cut,
            media_type: "application/vnd.oci.image.layer.v1.tar+gzip",
        }],
        &PullOptions::default(),
    );
    let e = r.unwrap_err();
    assert!(matches!(e, ImageError::BadLayer { .. }), "{e}");
    assert_nothing_left(&t.path().join("store"));
}

#[test]
fn a_decompression_bomb_stops_at_the_layer_bound() {
    let tar = tar_of(&[E::File("zeros", &vec![0u8; 4 << 20], 0o644)]);
    let layer = Layer::gz(tar);
    assert!(layer.blob.len() < 64 << 10);
    let opts = PullOptions {
        max_layer_bytes: 1 << 20,
        ..PullOptions::default()
    };
    let (t, _s, r) = pull_layers(vec![layer], &opts);
    let e = r.unwrap_err();
    assert!(
        matches!(e, ImageError::LayerTooLarge { limit, .. } if limit == 1 << 20),
        "{e}"
    );
    assert!(e.to_string().contains("--max-layer-size"), "{e}");
    assert_nothing_left(&t.path().join("store"));
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused() {
    let layers = vec![Layer::gz(tar_of(&[E::File("f", b"data", 0o644)]))];
    let t = tmp();
    let dir = t.path().join("l");
    write_layout(&dir, "v1", &layers, &config_of(&layers, &[]));
    let blob = dir.join("blobs/sha256").join(&sha(&layers[0].blob)[7..]);
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let store = Store::open(&t.path().join("store")).unwrap();
    let e = rt()
        .block_on(store.pull(
            &format!("oci:{}:v1", dir.display()),
            &PullOptions::default(),
        ))
        .unwrap_err();
    assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");
    assert_nothing_left(store.path());
    assert_eq!(
        std::fs::read_dir(store.path().join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );
}
