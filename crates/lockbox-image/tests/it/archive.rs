//! `save` and `load`: an image leaves one store as an OCI or `docker save` archive and comes
//! into another with the same id (and, for OCI archives, the same manifest digest); skopeo
//! reads what lockbox writes; a built layer's blob is written again from its directory and
//! checked against its diff id.

use crate::common::*;
use lockbox_image::{ArchiveFormat, ImageConfig, ImageError, PullOptions, Store};
use std::path::Path;
use std::process::Command;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The busybox test image pulled from an OCI layout into `store`, also named `name`.
fn pulled(t: &Path, store: &Store) -> lockbox_image::Image {
    let lay = t.join("lay");
    let layers = busybox_layers();
    write_layout(&lay, "test", &layers, &config_of(&layers, &["sh"]));
    let src = format!("oci:{}:test", lay.display());
    rt().block_on(store.pull(&src, &PullOptions::default()))
        .unwrap()
}

/// An image the store made itself (as a build does): one layer from a directory.
fn built(t: &Path, store: &Store, name: &str) -> lockbox_image::Image {
    let dir = store.build_dir().unwrap();
    let layer = dir.path().join("l");
    std::fs::create_dir_all(layer.join("app")).unwrap();
    std::fs::write(layer.join("app/hello"), "hello from a built layer\n").unwrap();
    let _ = t;
    let diff_id = store.add_layer_dir(&layer).unwrap();
    let config = ImageConfig {
        cmd: Some(vec!["cat".into(), "/app/hello".into()]),
        ..ImageConfig::default()
    };
    store
        .add_image(&config, &[diff_id], &[name.to_owned()], "test")
        .unwrap()
}

#[test]
fn a_saved_oci_archive_loads_into_another_store_with_the_same_id_and_manifest() {
    let t = tmp();
    let a = Store::open(&t.path().join("a")).unwrap();
    let image = pulled(t.path(), &a);
    let file = t.path().join("bb.tar");
    let saved = a.save(&image.id, ArchiveFormat::OciArchive, &file).unwrap();
    assert_eq!(saved.id, image.id);
    assert_eq!(
        saved.manifest, image.manifest,
        "the manifest leaves as pulled"
    );
    assert_eq!(saved.layers_regenerated, 0);
    assert_eq!(
        lockbox_image::archive_format(&file).unwrap(),
        ArchiveFormat::OciArchive
    );

    let b = Store::open(&t.path().join("b")).unwrap();
    let loaded = rt()
        .block_on(b.load_archive(&file, &PullOptions::default()))
        .unwrap();
    assert_eq!(loaded.id, image.id);
    assert_eq!(loaded.manifest, image.manifest);
    assert_eq!(loaded.config, image.config);
    // No registry name: named by the archive's path.
    assert_eq!(
        loaded.references,
        [format!("oci-archive:{}", file.display())]
    );
    assert!(loaded.layers[1].join("bin/busybox").exists());
    // Saved again from the second store: byte for byte the same archive.
    let again = t.path().join("again.tar");
    b.save(&loaded.id, ArchiveFormat::OciArchive, &again)
        .unwrap();
    assert_eq!(
        std::fs::read(&file).unwrap(),
        std::fs::read(&again).unwrap()
    );
}

#[test]
fn a_docker_archive_keeps_the_id_and_its_names() {
    let t = tmp();
    let a = Store::open(&t.path().join("a")).unwrap();
    let image = built(t.path(), &a, "app:1");
    let file = t.path().join("app.tar");
    let saved = a
        .save("app:1", ArchiveFormat::DockerArchive, &file)
        .unwrap();
    assert_eq!(saved.names, ["docker.io/library/app:1"]);
    assert_eq!(saved.manifest, None);
    assert_eq!(
        lockbox_image::archive_format(&file).unwrap(),
        ArchiveFormat::DockerArchive
    );
    let b = Store::open(&t.path().join("b")).unwrap();
    let loaded = rt()
        .block_on(b.load_archive(&file, &PullOptions::default()))
        .unwrap();
    assert_eq!(loaded.id, image.id);
    assert_eq!(loaded.references, ["docker.io/library/app:1"]);
    assert_eq!(
        std::fs::read_to_string(loaded.layers[0].join("app/hello")).unwrap(),
        "hello from a built layer\n"
    );
}

#[test]
fn a_built_layer_is_written_again_from_its_directory_and_verified() {
    let t = tmp();
    let a = Store::open(&t.path().join("a")).unwrap();
    let image = built(t.path(), &a, "app");
    let file = t.path().join("app.tar");
    let saved = a.save("app", ArchiveFormat::OciArchive, &file).unwrap();
    assert_eq!(saved.layers_regenerated, 1);
    assert_eq!(saved.names, ["docker.io/library/app:latest"]);
    let again = t.path().join("again.tar");
    let saved2 = a.save("app", ArchiveFormat::OciArchive, &again).unwrap();
    assert_eq!(saved.manifest, saved2.manifest, "a made manifest is stable");

    let b = Store::open(&t.path().join("b")).unwrap();
    let loaded = rt()
        .block_on(b.load_archive(&file, &PullOptions::default()))
        .unwrap();
    assert_eq!(loaded.id, image.id);
    assert_eq!(loaded.manifest, saved.manifest);
    assert_eq!(loaded.references, ["docker.io/library/app:latest"]);
}

#[test]
fn a_layer_that_cannot_be_written_again_exactly_is_an_error_and_no_file() {
    let t = tmp();
    let a = Store::open(&t.path().join("a")).unwrap();
    let image = pulled(t.path(), &a);
    // The store loses the busybox layer's blob: its tar (another tool's) is not what
    // lockbox's writer makes of the unpacked directory.
    let blob = &image.layer_info[1].blob;
    std::fs::remove_file(a.path().join("blobs/sha256").join(&blob[7..])).unwrap();
    let file = t.path().join("bb.tar");
    let e = a
        .save(&image.id, ArchiveFormat::OciArchive, &file)
        .unwrap_err();
    assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");
    assert!(e.to_string().contains("written again"), "{e}");
    assert!(!file.exists());
    let leftovers: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_file_that_is_no_image_archive_is_refused_clearly() {
    let t = tmp();
    let file = t.path().join("x.tar");
    let st = Command::new("tar")
        .args(["-cf"])
        .arg(&file)
        .args(["-C", "/", "etc/hostname"])
        .status()
        .unwrap();
    assert!(st.success());
    let b = Store::open(&t.path().join("b")).unwrap();
    let e = rt()
        .block_on(b.load_archive(&file, &PullOptions::default()))
        .unwrap_err();
    assert!(e.to_string().contains("neither an OCI archive"), "{e}");
    let e = b
        .save(
            "nothing",
            ArchiveFormat::OciArchive,
            &t.path().join("y.tar"),
        )
        .unwrap_err();
    assert!(matches!(e, ImageError::NotFound(_)), "{e}");
}

#[test]
fn skopeo_reads_the_oci_archive_lockbox_writes() {
    if !require(&["skopeo"]) {
        return;
    }
    let t = tmp();
    let a = Store::open(&t.path().join("a")).unwrap();
    for (name, image) in [
        ("pulled", pulled(t.path(), &a)),
        ("built", built(t.path(), &a, "app")),
    ] {
        let file = t.path().join(format!("{name}.tar"));
        let saved = a.save(&image.id, ArchiveFormat::OciArchive, &file).unwrap();
        let out = Command::new("skopeo")
            .args(["inspect", "--raw"])
            .arg(format!("oci-archive:{}", file.display()))
            .env("HOME", t.path())
            .env("TMPDIR", t.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let manifest = &out.stdout;
        assert_eq!(
            Some(sha(manifest)),
            saved.manifest,
            "{name}: skopeo sees the manifest lockbox wrote"
        );
        let out = Command::new("skopeo")
            .args(["inspect", "--config", "--raw"])
            .arg(format!("oci-archive:{}", file.display()))
            .env("HOME", t.path())
            .env("TMPDIR", t.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}");
        assert_eq!(sha(&out.stdout), image.id, "{name}");
    }
}

/// What a fleet's router does between two nodes: `export_for_transfer` on one store, the
/// bytes through `receive` (checked against the digest), `import_transfer` on the other,
/// which names the image as asked with the same id, and leaves nothing behind of the
/// export. A body that is not the digest's is refused.
#[test]
fn an_image_moves_between_stores_by_its_digest_and_keeps_its_id() {
    let t = tmp();
    let a = Store::open(&t.path().join("a")).unwrap();
    let b = Store::open(&t.path().join("b")).unwrap();
    let image = built(t.path(), &a, "app:1");
    let scratch = t.path().join("scratch");
    let mut out = a.export_for_transfer("app:1", &scratch).unwrap();
    assert_eq!(
        std::fs::read_dir(&scratch).unwrap().count(),
        0,
        "the export is unlinked once open"
    );
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut out.file, &mut bytes).unwrap();
    assert_eq!(bytes.len() as u64, out.size);
    let want = lockbox_image::sha256_hex(&out.digest).unwrap().to_owned();
    let rt = rt();
    let file = t.path().join("in.tar");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(4096).map(|c| Ok(c.to_vec())).collect();
    rt.block_on(lockbox_image::receive(
        futures_util::stream::iter(chunks),
        &file,
        &want,
        1 << 30,
    ))
    .unwrap();
    let moved = rt.block_on(b.import_transfer(&file, "moved:2")).unwrap();
    assert_eq!(moved.id, image.id);
    assert!(b.get("moved:2").unwrap().is_some());

    let mut tampered = bytes.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let refused = rt.block_on(lockbox_image::receive(
        futures_util::stream::iter(vec![Ok::<_, std::io::Error>(tampered)]),
        &t.path().join("bad.tar"),
        &want,
        1 << 30,
    ));
    assert!(
        matches!(refused, Err(lockbox_image::ReceiveError::Mismatch { .. })),
        "{refused:?}"
    );
    let too_big = rt.block_on(lockbox_image::receive(
        futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes)]),
        &t.path().join("big.tar"),
        &want,
        100,
    ));
    assert!(
        matches!(too_big, Err(lockbox_image::ReceiveError::TooLarge(100))),
        "{too_big:?}"
    );
    assert!(matches!(
        a.export_for_transfer("nothing:1", &scratch),
        Err(ImageError::NotFound(_))
    ));
}
