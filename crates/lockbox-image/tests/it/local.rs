//! Pulls from local sources (OCI layout, OCI archive, `docker save` archive) and the store's
//! bookkeeping: names, ids, holds, rm, prune, concurrent pulls, recovery.

use crate::common::*;
use lockbox_image::{ImageError, Platform, PruneOptions, PullOptions, Store};
use std::path::Path;
use std::process::Command;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn busybox_layout(dir: &Path) -> String {
    let layers = busybox_layers();
    let (_, id) = write_layout(
        dir,
        "test",
        &layers,
        &config_of(&layers, &["sh", "-c", "echo hi"]),
    );
    id
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[test]
fn an_oci_layout_pull_keeps_the_config_and_lists_layers_top_first() {
    let t = tmp();
    let id = busybox_layout(&t.path().join("lay"));
    let store = Store::open(&t.path().join("store")).unwrap();
    let src = format!("oci:{}:test", t.path().join("lay").display());
    let image = rt()
        .block_on(store.pull(&src, &PullOptions::default()))
        .unwrap();
    assert_eq!(image.id, id);
    assert_eq!(image.references, std::slice::from_ref(&src));
    assert_eq!(image.config.env, ["PATH=/bin", "GREETING=hi"]);
    assert_eq!(
        image.config.cmd.as_deref(),
        Some(&["sh".to_owned(), "-c".into(), "echo hi".into()][..])
    );
    assert_eq!(image.config.working_dir.as_deref(), Some("/opt"));
    assert_eq!(image.config.user.as_deref(), Some("1000:1000"));
    assert_eq!(image.platform, "linux/amd64");
    // Top first: the zstd layer with the whiteout, then busybox.
    assert!(image.layers[0].join("opt/data/c").exists());
    assert!(image.layers[1].join("bin/busybox").exists());
    assert_eq!(
        image.layer_info[0].media_type,
        "application/vnd.oci.image.layer.v1.tar+zstd"
    );
    // Found again by name, by id, by id prefix; listed.
    assert_eq!(store.get(&src).unwrap().unwrap().id, id);
    assert_eq!(store.get(&id).unwrap().unwrap().id, id);
    assert_eq!(store.get(&id[7..19]).unwrap().unwrap().id, id);
    assert!(store.get("nothing-here").unwrap().is_none());
    let all = store.list().unwrap();
    assert_eq!((all.len(), all[0].layers), (1, 2));
    // A second pull finds every layer in the store: same directories.
    let again = rt()
        .block_on(store.pull(&src, &PullOptions::default()))
        .unwrap();
    assert_eq!(again.layers, image.layers);
    assert_eq!(count(&store.path().join("layers")), 2);
}

#[test]
fn oci_archive_and_docker_archive_sources_give_the_same_image_and_share_its_layers() {
    let t = tmp();
    let lay = t.path().join("lay");
    let id = busybox_layout(&lay);
    let store = Store::open(&t.path().join("store")).unwrap();
    let from_dir = rt()
        .block_on(store.pull(
            &format!("oci:{}:test", lay.display()),
            &PullOptions::default(),
        ))
        .unwrap();
    // oci-archive: the layout as a tar.
    let archive = t.path().join("img.tar");
    assert!(Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&lay)
        .arg(".")
        .status()
        .unwrap()
        .success());
    let from_archive = rt()
        .block_on(store.pull(
            &format!("oci-archive:{}", archive.display()),
            &PullOptions::default(),
        ))
        .unwrap();
    assert_eq!(
        (from_archive.id.as_str(), &from_archive.layers),
        (id.as_str(), &from_dir.layers)
    );
    // docker-archive: `docker save`'s manifest.json, config and uncompressed layer tars.
    let layers = busybox_layers();
    let config = config_of(&layers, &["sh", "-c", "echo hi"]);
    let d = t.path().join("docker");
    std::fs::create_dir_all(d.join("l1")).unwrap();
    std::fs::create_dir_all(d.join("l2")).unwrap();
    std::fs::write(d.join("l1/layer.tar"), &layers[0].tar).unwrap();
    std::fs::write(d.join("l2/layer.tar"), &layers[1].tar).unwrap();
    std::fs::write(d.join("cfg.json"), &config).unwrap();
    std::fs::write(
        d.join("manifest.json"),
        br#"[{"Config":"cfg.json","RepoTags":["example/busy:1"],"Layers":["l1/layer.tar","l2/layer.tar"]}]"#,
    )
    .unwrap();
    let darchive = t.path().join("docker.tar");
    assert!(Command::new("tar")
        .arg("-cf")
        .arg(&darchive)
        .arg("-C")
        .arg(&d)
        .arg(".")
        .status()
        .unwrap()
        .success());
    let from_docker = rt()
        .block_on(store.pull(
            &format!("docker-archive:{}", darchive.display()),
            &PullOptions::default(),
        ))
        .unwrap();
    assert_eq!(
        (from_docker.id.as_str(), &from_docker.layers),
        (id.as_str(), &from_dir.layers)
    );
    assert!(
        from_docker
            .references
            .contains(&"docker.io/example/busy:1".to_owned()),
        "{:?}",
        from_docker.references
    );
    assert_eq!(store.get("example/busy:1").unwrap().unwrap().id, id);
    assert_eq!(count(&store.path().join("layers")), 2);
    assert_eq!(count(&store.path().join("tmp")), 0);
}

#[test]
fn an_index_in_a_layout_picks_the_asked_platform() {
    let t = tmp();
    let lay = t.path().join("lay");
    let (ida, idb) = multi_platform_layout(&lay);
    let store = Store::open(&t.path().join("store")).unwrap();
    let src = format!("oci:{}:multi", lay.display());
    let amd = PullOptions {
        platform: Platform::parse("linux/amd64").unwrap(),
        ..PullOptions::default()
    };
    assert_eq!(rt().block_on(store.pull(&src, &amd)).unwrap().id, ida);
    let arm = PullOptions {
        platform: Platform::parse("linux/arm64/v8").unwrap(),
        ..PullOptions::default()
    };
    assert_eq!(rt().block_on(store.pull(&src, &arm)).unwrap().id, idb);
    let s390 = PullOptions {
        platform: Platform::parse("linux/s390x").unwrap(),
        ..PullOptions::default()
    };
    let e = rt().block_on(store.pull(&src, &s390)).unwrap_err();
    assert_eq!(
        e.to_string().split(" (it has: ").nth(1),
        Some("linux/amd64, linux/arm64/v8)"),
        "{e}"
    );
    assert!(matches!(
        Platform::parse("linux"),
        Err(ImageError::BadPlatform(_))
    ));
}

#[test]
fn an_explicit_platform_refuses_a_single_platform_image_of_another_and_names_nothing() {
    let t = tmp();
    let lay = t.path().join("lay");
    let layers = busybox_layers();
    write_layout(&lay, "one", &layers, &config_of(&layers, &[])); // linux/amd64
    let store = Store::open(&t.path().join("store")).unwrap();
    let src = format!("oci:{}:one", lay.display());
    let arm = PullOptions {
        platform: Platform::parse("linux/arm64").unwrap(),
        exact_platform: true,
        ..PullOptions::default()
    };
    let e = rt().block_on(store.pull(&src, &arm)).unwrap_err();
    assert!(matches!(e, ImageError::NoPlatform { .. }), "{e:?}");
    assert!(
        e.to_string()
            .ends_with("no image for platform linux/arm64 (it has: linux/amd64)"),
        "{e}"
    );
    assert!(store.get(&src).unwrap().is_none(), "nothing is named");
    // Without exact_platform (no --platform given) it is taken, as Docker does.
    let taken = PullOptions {
        exact_platform: false,
        ..arm
    };
    assert!(rt().block_on(store.pull(&src, &taken)).is_ok());
}

#[test]
fn rm_refuses_a_held_image_naming_its_holders_until_released() {
    let t = tmp();
    busybox_layout(&t.path().join("lay"));
    let store = Store::open(&t.path().join("store")).unwrap();
    let src = format!("oci:{}:test", t.path().join("lay").display());
    let image = rt()
        .block_on(store.pull(&src, &PullOptions::default()))
        .unwrap();
    store.hold(&src, "sandbox-1").unwrap();
    store.hold(&image.id, "snapshot-7").unwrap();
    let e = store.remove(&src).unwrap_err();
    assert_eq!(e.exit_code(), 5);
    assert_eq!(e.code().as_str(), "IMAGE_IN_USE");
    assert!(
        e.to_string().contains("in use by sandbox-1, snapshot-7"),
        "{e}"
    );
    // prune --all leaves it too.
    assert!(store
        .prune(&PruneOptions { all: true })
        .unwrap()
        .images_removed
        .is_empty());
    assert_eq!(
        store.list().unwrap()[0].holders,
        ["sandbox-1", "snapshot-7"]
    );
    assert!(matches!(
        store.hold(&src, "../x"),
        Err(ImageError::BadHolder(_))
    ));
    store.release(&image.id, "sandbox-1").unwrap();
    store.release(&image.id, "snapshot-7").unwrap();
    let removed = store.remove(&src).unwrap();
    assert!(removed.image_deleted && removed.freed_bytes > 0);
    for sub in ["layers", "images", "blobs/sha256"] {
        assert_eq!(count(&store.path().join(sub)), 0, "{sub}");
    }
    assert!(matches!(store.remove(&src), Err(ImageError::NotFound(_))));
}

#[test]
fn rm_of_one_of_two_names_only_untags_and_prune_removes_unnamed_images() {
    let t = tmp();
    let lay = t.path().join("lay");
    let layers = busybox_layers();
    let config = config_of(&layers, &["sh"]);
    write_layout(&lay, "one", &layers, &config);
    write_layout(&lay, "two", &layers, &config);
    let store = Store::open(&t.path().join("store")).unwrap();
    let one = format!("oci:{}:one", lay.display());
    let two = format!("oci:{}:two", lay.display());
    let image = rt()
        .block_on(store.pull(&one, &PullOptions::default()))
        .unwrap();
    rt().block_on(store.pull(&two, &PullOptions::default()))
        .unwrap();
    assert_eq!(store.get(&one).unwrap().unwrap().references.len(), 2);
    let r = store.remove(&one).unwrap();
    assert!(!r.image_deleted);
    assert_eq!(
        store.get(&image.id).unwrap().unwrap().references,
        std::slice::from_ref(&two)
    );
    // Nothing unnamed: prune removes nothing; --all removes it.
    assert!(store
        .prune(&PruneOptions::default())
        .unwrap()
        .images_removed
        .is_empty());
    let report = store.prune(&PruneOptions { all: true }).unwrap();
    assert_eq!((report.images_removed.len(), report.layers_removed), (1, 2));
}

#[test]
fn two_pulls_at_once_of_the_same_layers_unpack_each_once() {
    let t = tmp();
    busybox_layout(&t.path().join("lay"));
    let src = format!("oci:{}:test", t.path().join("lay").display());
    let store_dir = t.path().join("store");
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let (src, dir) = (src.clone(), store_dir.clone());
            std::thread::spawn(move || {
                let store = Store::open(&dir).unwrap();
                rt().block_on(store.pull(&src, &PullOptions::default()))
                    .unwrap()
            })
        })
        .collect();
    let images: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(images.iter().all(|i| i.layers == images[0].layers));
    assert_eq!(count(&store_dir.join("layers")), 2);
    assert_eq!(count(&store_dir.join("tmp")), 0);
}

#[test]
fn open_removes_a_killed_pulls_leftovers_but_not_a_live_ones() {
    let t = tmp();
    let dir = t.path().join("store");
    Store::open(&dir).unwrap();
    let tmpd = dir.join("tmp");
    for d in ["live", "dead", "orphan"] {
        std::fs::create_dir_all(tmpd.join(d).join("layer-x/root")).unwrap();
    }
    std::fs::write(tmpd.join("dead.lock"), b"").unwrap();
    // A live pull: its lock is held by a running process. `touch` runs without descriptor 9:
    // it may still be exiting when the test sees the file, and would hold the lock a moment
    // after the holder is killed.
    let ready = t.path().join("ready");
    let mut holder = Command::new("sh")
        .args([
            "-c",
            "exec 9>\"$0\" && flock 9 && touch \"$1\" 9>&- && exec sleep 600",
        ])
        .arg(tmpd.join("live.lock"))
        .arg(&ready)
        .spawn()
        .unwrap();
    while !ready.exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Store::open(&dir).unwrap();
    let mut left: Vec<String> = std::fs::read_dir(&tmpd)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["live", "live.lock"]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    Store::open(&dir).unwrap();
    assert_eq!(count(&tmpd), 0);
}

#[test]
fn a_store_bound_removes_the_least_recently_used_unheld_images() {
    let t = tmp();
    let lay = t.path().join("lay");
    let mk = |tag: &str, size: usize| {
        let layers = vec![Layer::gz(tar_of(&[E::File(tag, &vec![1u8; size], 0o644)]))];
        write_layout(&lay, tag, &layers, &config_of(&layers, &[])).1
    };
    let (old, held, new) = (mk("old", 100_000), mk("held", 100_000), mk("new", 100_000));
    let store = Store::open(&t.path().join("store")).unwrap();
    let pull = |tag: &str| {
        rt().block_on(store.pull(
            &format!("oci:{}:{tag}", lay.display()),
            &PullOptions::default(),
        ))
        .unwrap()
    };
    pull("old");
    pull("held");
    store.hold(&held, "sandbox-1").unwrap();
    pull("new");
    let before = store.usage().unwrap();
    // Room for about two images: the oldest unheld one goes, the held one stays.
    let report = store.shrink_to(before - 50_000, &[new.as_str()]).unwrap();
    assert_eq!(report.images_removed, std::slice::from_ref(&old));
    assert!(store.usage().unwrap() <= before - 50_000);
    // Nothing more can go: the rest is held or kept.
    let report = store.shrink_to(0, &[new.as_str()]).unwrap();
    assert!(report.images_removed.is_empty());
    assert!(store.get(&held).unwrap().is_some() && store.get(&new).unwrap().is_some());
}
