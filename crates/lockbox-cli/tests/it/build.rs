//! `lockbox image build` end to end on the real kernel, as the current user and (as root) as
//! uid 65534: a multi-stage Dockerfile on a busybox image made here (RUN writing and
//! deleting, COPY from the context with .dockerignore, COPY --from a stage, ENV, WORKDIR,
//! CMD); `lockbox run --image` of the result; a rebuild from the cache; a failing RUN; an
//! unknown instruction.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{give, lockbox, scratch, text, users};
use lockbox_testkit::oci;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Command;

/// An OCI layout at `dir`, tag `v1`: one layer with busybox and /bin/sh.
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

const DOCKERFILE: &str = r#"# syntax=docker/dockerfile:1
ARG BASE
FROM ${BASE} AS build
RUN busybox mkdir -p /out && echo compiled > /out/artifact

FROM $BASE
ARG GREETING=hello
# busybox's applets as commands; a file and a directory a later step deletes
RUN busybox --install -s /bin && \
    echo doomed > /doomed && mkdir -p /data/old && echo x > /data/old/f
ENV APP_HOME=/app MSG="$GREETING world"
WORKDIR $APP_HOME
COPY src/ ./src/
COPY --from=build /out/artifact /opt/artifact
RUN rm /doomed && rm -r /data/old && echo "$MSG" > greeting.txt && pwd > where.txt
CMD ["cat", "/app/greeting.txt"]
"#;

#[test]
fn a_multi_stage_dockerfile_builds_an_image_that_runs_and_rebuilds_from_the_cache() {
    for user in users() {
        let work = scratch();
        let w = work.path();
        layout(&w.join("lay"));
        let ctx = w.join("ctx");
        std::fs::create_dir_all(ctx.join("src/sub")).unwrap();
        std::fs::write(ctx.join("Dockerfile"), DOCKERFILE).unwrap();
        std::fs::write(ctx.join("src/main.txt"), "main\n").unwrap();
        std::fs::write(ctx.join("src/sub/more.txt"), "more\n").unwrap();
        std::fs::write(ctx.join("src/debug.log"), "ignored\n").unwrap();
        std::fs::write(ctx.join(".dockerignore"), "src/*.log\n").unwrap();
        give(w, user);
        let st = w.join("state");
        let st = st.to_str().unwrap();
        let base = format!("BASE=oci:{}:v1", w.join("lay").display());
        let build = |extra: &[&str]| {
            let mut args = vec![
                "image",
                "build",
                "-t",
                "app:1",
                "--build-arg",
                &base,
                "--state-dir",
                st,
            ];
            args.extend_from_slice(extra);
            args.push("ctx");
            let started = std::time::Instant::now();
            let out = lockbox(user, w, &args);
            (out, started.elapsed())
        };

        let (out, took) = build(&["--json"]);
        println!("{user:?}: first build took {took:?}\n{}", text(&out));
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let image: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let id = image["id"].as_str().unwrap().to_owned();
        assert!(image["references"].to_string().contains("app:1"), "{image}");
        // base + RUN + WORKDIR (made: /app is missing) + COPY + COPY --from + RUN
        assert_eq!(image["layers"].as_array().unwrap().len(), 6, "{image}");
        // The last RUN's layer holds the deletions as overlayfs whiteouts.
        let top = Path::new(image["layers"][0].as_str().unwrap());
        let wh = std::fs::symlink_metadata(top.join("doomed")).unwrap();
        assert!(wh.file_type().is_char_device(), "{wh:?}");
        // lockbox's own mount points are not part of any layer.
        for l in image["layers"].as_array().unwrap() {
            let l = Path::new(l.as_str().unwrap());
            assert!(!l.join("etc/hosts").exists(), "{}", l.display());
            assert!(!l.join("etc/resolv.conf").exists(), "{}", l.display());
            assert!(
                !l.join("proc").exists() && !l.join("dev").exists(),
                "{}",
                l.display()
            );
        }

        // The image runs: its ENV, WORKDIR, COPYs, the other stage's file, the deletions.
        let script = "cat greeting.txt where.txt /opt/artifact src/main.txt src/sub/more.txt; \
                      test -e src/debug.log || echo ignored-log-absent; \
                      test -e /doomed || echo doomed-gone; test -e /data/old || echo dir-gone; \
                      echo home=$APP_HOME";
        let out = lockbox(
            user,
            w,
            &[
                "run",
                "--image",
                "app:1",
                "--state-dir",
                st,
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello world\n/app\ncompiled\nmain\nmore\nignored-log-absent\ndoomed-gone\ndir-gone\nhome=/app\n",
            "{user:?} {}",
            text(&out)
        );
        // Its CMD.
        let out = lockbox(user, w, &["run", "--image", "app:1", "--state-dir", st]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello world\n",
            "{}",
            text(&out)
        );

        // Unchanged: every layer step comes from the cache and the image is the same.
        let (out, took) = build(&[]);
        println!("{user:?}: cached rebuild took {took:?}\n{}", text(&out));
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches("CACHED").count(), 6, "{err}");
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with(&id),
            "{}",
            text(&out)
        );

        // A changed context file: that COPY and the steps after it run again.
        std::fs::write(ctx.join("src/main.txt"), "changed\n").unwrap();
        let (out, _) = build(&[]);
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches("CACHED").count(), 3, "{err}");
    }
}

#[test]
fn a_failing_run_exits_1_naming_its_code_and_tags_nothing() {
    for user in users() {
        let work = scratch();
        let w = work.path();
        layout(&w.join("lay"));
        std::fs::create_dir_all(w.join("ctx")).unwrap();
        let df = format!(
            "FROM oci:{}:v1\nRUN echo partial > /x\nRUN exit 3\n",
            w.join("lay").display()
        );
        std::fs::write(w.join("ctx/Dockerfile"), df).unwrap();
        give(w, user);
        let st = w.join("state");
        let st = st.to_str().unwrap();
        let out = lockbox(
            user,
            w,
            &["image", "build", "-t", "broken", "--state-dir", st, "ctx"],
        );
        assert_eq!(out.status.code(), Some(1), "{user:?} {}", text(&out));
        assert!(text(&out).contains("line 3"), "{}", text(&out));
        assert!(text(&out).contains("code 3"), "{}", text(&out));
        let out = lockbox(user, w, &["image", "inspect", "broken", "--state-dir", st]);
        assert_eq!(out.status.code(), Some(2), "{user:?} {}", text(&out));
    }
}

#[test]
fn an_unknown_instruction_is_a_usage_error_naming_its_line() {
    let work = scratch();
    let w = work.path();
    std::fs::create_dir_all(w.join("ctx")).unwrap();
    std::fs::write(
        w.join("ctx/Dockerfile"),
        "FROM busybox\n\n# c\nFROBNICATE now\n",
    )
    .unwrap();
    let st = w.join("state");
    let out = lockbox(
        common::User::Current,
        w,
        &[
            "image",
            "build",
            "-t",
            "x",
            "--state-dir",
            st.to_str().unwrap(),
            "ctx",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("line 4"), "{}", text(&out));
    assert!(text(&out).contains("FROBNICATE"), "{}", text(&out));
}

#[test]
fn add_extracts_a_local_archive_and_refuses_a_url_naming_its_line() {
    for user in users() {
        let work = scratch();
        let w = work.path();
        layout(&w.join("lay"));
        let ctx = w.join("ctx");
        std::fs::create_dir_all(ctx.join("pkg/share")).unwrap();
        std::fs::write(ctx.join("pkg/share/data.txt"), "packed\n").unwrap();
        let st = Command::new("tar")
            .arg("-czf")
            .arg(ctx.join("pkg.tar.gz"))
            .arg("-C")
            .arg(ctx.join("pkg"))
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
        let base = format!("FROM oci:{}:v1\n", w.join("lay").display());
        std::fs::write(
            ctx.join("Dockerfile"),
            format!(
                "{base}ADD pkg.tar.gz /opt/pkg/\nCOPY --chmod=700 pkg/share/data.txt /opt/copied\n"
            ),
        )
        .unwrap();
        std::fs::write(
            ctx.join("Url.Dockerfile"),
            format!("{base}\nADD https://example.com/x.tgz /x\n"),
        )
        .unwrap();
        give(w, user);
        let state = w.join("state");
        let st = state.to_str().unwrap();
        let out = lockbox(
            user,
            w,
            &["image", "build", "-t", "pkg", "--state-dir", st, "ctx"],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let script = "busybox cat /opt/pkg/share/data.txt; busybox stat -c %a /opt/copied";
        let out = lockbox(
            user,
            w,
            &[
                "run",
                "--image",
                "pkg",
                "--state-dir",
                st,
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "packed\n700\n",
            "{user:?} {}",
            text(&out)
        );

        let out = lockbox(
            user,
            w,
            &[
                "image",
                "build",
                "-t",
                "url",
                "-f",
                "ctx/Url.Dockerfile",
                "--state-dir",
                st,
                "ctx",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{user:?} {}", text(&out));
        assert!(
            text(&out).contains("line 3") && text(&out).contains("URL"),
            "{}",
            text(&out)
        );
    }
}

/// A one-page HTTP server on the host's loopback that counts its connections.
fn http_server(body: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = hits.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, hits)
}

#[test]
fn run_steps_reach_only_what_net_allow_lists() {
    use std::sync::atomic::Ordering::SeqCst;
    let (port, hits) = http_server("fetched over the allowed network\n");
    let (other, other_hits) = http_server("not allowed\n");
    for user in users() {
        let work = scratch();
        let w = work.path();
        layout(&w.join("lay"));
        std::fs::create_dir_all(w.join("ctx")).unwrap();
        let df = format!(
            "FROM oci:{}:v1\nRUN busybox wget -q -O /fetched http://127.0.0.1:{port}/ && busybox wget -q -O /other http://127.0.0.1:{other}/ || test -s /fetched\n",
            w.join("lay").display()
        );
        std::fs::write(w.join("ctx/Dockerfile"), df).unwrap();
        give(w, user);
        let st = w.join("state");
        let st = st.to_str().unwrap();
        let build = |extra: &[&str]| {
            let mut args = vec!["image", "build", "-t", "fetch", "--state-dir", st];
            args.extend_from_slice(extra);
            args.push("ctx");
            lockbox(user, w, &args)
        };

        // No network by default: the RUN fails (its loopback is its own).
        let before = hits.load(SeqCst);
        let out = build(&[]);
        assert_eq!(out.status.code(), Some(1), "{user:?} {}", text(&out));
        assert!(text(&out).contains("line 2"), "{}", text(&out));
        // Another port listed: this one stays refused.
        let allow_other = format!("127.0.0.1:{other}");
        let out = build(&["--net-allow", &allow_other]);
        assert_eq!(out.status.code(), Some(1), "{user:?} {}", text(&out));
        assert_eq!(hits.load(SeqCst), before, "reached without being allowed");

        // Listed: the RUN fetches it, and only it (the other server is not reached).
        let other_before = other_hits.load(SeqCst);
        let allow = format!("tcp://127.0.0.1:{port}");
        let out = build(&["--net-allow", &allow]);
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        assert!(hits.load(SeqCst) > before);
        assert_eq!(other_hits.load(SeqCst), other_before);
        let out = lockbox(
            user,
            w,
            &[
                "run",
                "--image",
                "fetch",
                "--state-dir",
                st,
                "--",
                "sh",
                "-c",
                "busybox cat /fetched; busybox test -e /other || echo no-other",
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "fetched over the allowed network\nno-other\n",
            "{user:?} {}",
            text(&out)
        );

        // A malformed SPEC, or with --network: usage errors.
        let out = build(&["--net-allow", "no-port"]);
        assert_eq!(out.status.code(), Some(2), "{user:?} {}", text(&out));
        let out = build(&["--net-allow", &allow, "--network", "host"]);
        assert_eq!(out.status.code(), Some(2), "{user:?} {}", text(&out));
    }
}

#[test]
fn copy_wildcards_expand_in_the_context_and_a_pattern_matching_nothing_is_named() {
    for user in users() {
        let work = scratch();
        let w = work.path();
        layout(&w.join("lay"));
        let ctx = w.join("ctx");
        std::fs::create_dir_all(ctx.join("src/sub")).unwrap();
        for f in [
            "a.py",
            "b.py",
            "notes.md",
            "src/one.txt",
            "src/two.txt",
            "src/sub/deep.txt",
            "src/skip.log",
        ] {
            std::fs::write(ctx.join(f), format!("{f}\n")).unwrap();
        }
        let base = format!("FROM oci:{}:v1\n", w.join("lay").display());
        std::fs::write(
            ctx.join("Dockerfile"),
            format!("{base}WORKDIR /work\nCOPY *.py /app/\nCOPY --chmod=600 src/*.txt dir/\nCOPY [\"src/[s]*.log\", \"/single.log\"]\n"),
        )
        .unwrap();
        std::fs::write(
            ctx.join("None.Dockerfile"),
            format!("{base}COPY *.rs /app/\n"),
        )
        .unwrap();
        std::fs::write(
            ctx.join("Slash.Dockerfile"),
            format!("{base}\nCOPY *.py /app\n"),
        )
        .unwrap();
        give(w, user);
        let st = w.join("state");
        let st = st.to_str().unwrap();
        let out = lockbox(
            user,
            w,
            &["image", "build", "-t", "globbed", "--state-dir", st, "ctx"],
        );
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let script = "cd / && busybox find app work single.log | busybox sort; \
                      busybox cat /single.log; busybox stat -c %a work/dir/one.txt";
        let out = lockbox(
            user,
            w,
            &[
                "run",
                "--image",
                "globbed",
                "--state-dir",
                st,
                "--",
                "sh",
                "-c",
                script,
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "app\napp/a.py\napp/b.py\nsingle.log\nwork\nwork/dir\nwork/dir/one.txt\nwork/dir/two.txt\nsrc/skip.log\n600\n",
            "{user:?} {}",
            text(&out)
        );

        let build_f = |file: &str| {
            lockbox(
                user,
                w,
                &[
                    "image",
                    "build",
                    "-t",
                    "bad",
                    "-f",
                    file,
                    "--state-dir",
                    st,
                    "ctx",
                ],
            )
        };
        let out = build_f("ctx/None.Dockerfile");
        assert_eq!(out.status.code(), Some(2), "{user:?} {}", text(&out));
        assert!(
            text(&out).contains("line 2")
                && text(&out).contains("*.rs: no file in the build context matches"),
            "{}",
            text(&out)
        );
        let out = build_f("ctx/Slash.Dockerfile");
        assert_eq!(out.status.code(), Some(2), "{user:?} {}", text(&out));
        assert!(
            text(&out).contains("line 3")
                && text(&out).contains("must be a directory and end with a /"),
            "{}",
            text(&out)
        );
    }
}

/// An OCI layout at `dir` whose index has two platforms' images (no tag: `oci:DIR`), each
/// busybox with /arch naming its platform: linux/amd64 and linux/arm64 (busybox is the
/// host's either way: what is checked is which one is picked).
fn two_platform_layout(dir: &Path) {
    let mut entries = Vec::new();
    for arch in ["amd64", "arm64"] {
        let root = dir.join(format!("root-{arch}"));
        oci::busybox_root(&root, &["sh", "cat"]);
        std::fs::write(root.join("arch"), format!("{arch}\n")).unwrap();
        let lay = dir.join(format!("lay-{arch}"));
        oci::layout(&lay, &root, serde_json::json!({"Env": ["PATH=/bin"]}), arch);
        // Its manifest, with the config rewritten for `arch`, into `dir`'s blobs.
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(lay.join("index.json")).unwrap()).unwrap();
        let blob = |d: &serde_json::Value| {
            std::fs::read(lay.join("blobs/sha256").join(&d.as_str().unwrap()[7..])).unwrap()
        };
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&blob(&index["manifests"][0]["digest"])).unwrap();
        let mut config: serde_json::Value =
            serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
        config["architecture"] = serde_json::json!(arch);
        let put = |bytes: &[u8]| oci::blob(dir, bytes);
        let layer = blob(&manifest["layers"][0]["digest"]);
        put(&layer);
        let config = serde_json::to_vec(&config).unwrap();
        manifest["config"]["digest"] = serde_json::json!(put(&config));
        manifest["config"]["size"] = serde_json::json!(config.len());
        let manifest = serde_json::to_vec(&manifest).unwrap();
        entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": put(&manifest), "size": manifest.len(),
            "platform": {"os": "linux", "architecture": arch},
        }));
    }
    let index = serde_json::json!({"schemaVersion": 2, "manifests": entries});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

#[test]
fn from_platform_picks_that_platforms_image_and_a_missing_one_is_named() {
    for user in users() {
        let work = scratch();
        let w = work.path();
        two_platform_layout(&w.join("multi"));
        let ctx = w.join("ctx");
        std::fs::create_dir_all(&ctx).unwrap();
        let src = format!("oci:{}", w.join("multi").display());
        std::fs::write(
            ctx.join("Dockerfile"),
            format!("FROM --platform=linux/arm64 {src}\nRUN cat /arch > /seen\n"),
        )
        .unwrap();
        std::fs::write(
            ctx.join("Build.Dockerfile"),
            format!("FROM --platform=$BUILDPLATFORM {src}\nRUN cat /arch > /seen\n"),
        )
        .unwrap();
        std::fs::write(
            ctx.join("Missing.Dockerfile"),
            format!("FROM --platform=linux/s390x {src}\n"),
        )
        .unwrap();
        give(w, user);
        let st = w.join("state");
        let st = st.to_str().unwrap();
        let build = |tag: &str, file: &str| {
            lockbox(
                user,
                w,
                &[
                    "image",
                    "build",
                    "-t",
                    tag,
                    "-f",
                    file,
                    "--state-dir",
                    st,
                    "--json",
                    "ctx",
                ],
            )
        };
        let seen = |tag: &str| {
            let out = lockbox(
                user,
                w,
                &[
                    "run",
                    "--image",
                    tag,
                    "--state-dir",
                    st,
                    "--",
                    "cat",
                    "/seen",
                ],
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let out = build("arm", "ctx/Dockerfile");
        assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
        let image: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(image["platform"], "linux/arm64", "{image}");
        assert_eq!(seen("arm"), "arm64\n");

        if std::env::consts::ARCH == "x86_64" {
            let out = build("native", "ctx/Build.Dockerfile");
            assert_eq!(out.status.code(), Some(0), "{user:?} {}", text(&out));
            let image: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(image["platform"], "linux/amd64", "{image}");
            assert_eq!(seen("native"), "amd64\n");
        }

        let out = build("none", "ctx/Missing.Dockerfile");
        assert_eq!(out.status.code(), Some(1), "{user:?} {}", text(&out));
        assert!(
            text(&out)
                .contains("no image for platform linux/s390x (it has: linux/amd64, linux/arm64)"),
            "{}",
            text(&out)
        );
    }
}
