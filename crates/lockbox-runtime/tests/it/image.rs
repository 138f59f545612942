//! A long-lived sandbox on an OCI image (issue 29): an image with no glibc at all (busybox
//! and a static bash, from busybox-static and bash-static) runs the agent (a glibc binary,
//! through the host's loader bound beside it), sessions, processes and files; the image's
//! Env and WorkingDir apply; the image is held while the sandbox lives and released on
//! delete, and holds of sandboxes that are gone are released when a runtime opens the
//! state directory. As root and as uid 65534.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_runtime::{
    ProcessCommand, ProcessSpec, ProcessState, SandboxSpec, SessionOptions, WriteOptions,
};
use lockbox_testkit::oci;
use std::path::Path;
use tokio::io::AsyncReadExt;

/// An OCI layout at `dir`, tag `v1`: busybox (with a few applets), `/bin/bash` (static),
/// `/work`; Env `GREETING=from-image`, WorkingDir `/work`. `bash`: whether to include it.
fn layout(dir: &Path, bash: bool) {
    let root = dir.join("rootfs");
    oci::busybox_root(
        &root,
        &[
            "sh", "cat", "echo", "ls", "id", "mktemp", "head", "rm", "env", "pwd", "sleep", "test",
            "cut",
        ],
    );
    std::fs::create_dir_all(root.join("work")).unwrap();
    if bash {
        std::fs::copy("/bin/bash-static", root.join("bin/bash")).unwrap();
    }
    oci::layout(
        dir,
        &root,
        serde_json::json!({"Env": ["PATH=/bin", "GREETING=from-image"], "Cmd": ["sh"], "WorkingDir": "/work"}),
        "v1",
    );
}

fn image_spec(reference: &str) -> SandboxSpec {
    SandboxSpec {
        policy: lockbox_policy::Policy {
            image: Some(reference.to_owned()),
            ..lockbox_policy::Policy::default()
        },
        ..SandboxSpec::default()
    }
}

fn holders(state: &Path) -> Vec<String> {
    let store = lockbox_image::Store::in_state_dir(state).unwrap();
    store
        .list()
        .unwrap()
        .into_iter()
        .flat_map(|i| i.holders)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_on_a_busybox_image_without_glibc_runs_sessions_processes_and_files() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_sandbox_on_a_busybox_image_without_glibc_runs_sessions_processes_and_files"
    ));
    let work = scratch();
    let lay = work.path().join("lay");
    layout(&lay, true);
    let state = work.path().join("state");
    let reference = format!("oci:{}:v1", lay.display());
    let (rt, sb) = sandbox_with(&state, image_spec(&reference)).await;

    // The image's userland: no glibc anywhere, busybox's tools, the image's Env and cwd.
    let r = run(
        &sb,
        "echo \"$GREETING\"; pwd; ls /lib /usr 2>/dev/null | head -1; echo libs:$?; \
         busybox | head -1 | cut -c1-7",
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let text = out(&r);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("from-image"), "{text}");
    assert_eq!(lines.next(), Some("/work"), "{text}");
    assert!(
        !text.contains("libc"),
        "the host's libraries showed: {text}"
    );

    // A session keeps its state, as on the host's userland.
    sb.create_session(SessionOptions {
        id: Some("s1".into()),
        ..SessionOptions::default()
    })
    .await
    .unwrap();
    let mut r = req("cd /tmp && export KEPT=yes");
    r.session = Some("s1".into());
    sb.exec(r).await.unwrap();
    let mut r = req("echo \"$PWD $KEPT\"");
    r.session = Some("s1".into());
    assert_eq!(out(&sb.exec(r).await.unwrap()), "/tmp yes\n");

    // Files written through the API are the image root's, seen by its commands.
    sb.write_file(
        "/work/note.txt",
        Box::pin(std::io::Cursor::new(b"hello image".to_vec())),
        WriteOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out(&run(&sb, "cat /work/note.txt").await), "hello image");
    run(&sb, "echo made-inside > /work/out.txt").await;
    let mut f = sb.read_file("/work/out.txt", None).await.unwrap();
    let mut got = Vec::new();
    f.body.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"made-inside\n");

    // A process with an argv runs the image's binary.
    let p = sb
        .start_process(ProcessSpec {
            command: ProcessCommand::Argv(vec!["/bin/busybox".into(), "true".into()]),
            cwd: None,
            env: Default::default(),
            pty: None,
            log_bytes: None,
            stdin: false,
        })
        .await
        .unwrap();
    let mut state_now = p.state;
    for _ in 0..200 {
        if state_now != ProcessState::Running {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        state_now = sb.process(p.id.as_str()).unwrap().state;
    }
    let done = sb.process(p.id.as_str()).unwrap();
    assert_eq!(done.exit_code, Some(0), "{done:?}");

    // Held while it lives, released on delete.
    let id = sb.id().to_owned();
    assert_eq!(holders(&state), vec![format!("sandbox-{id}")]);
    rt.delete_sandbox(&id).await.unwrap();
    assert!(holders(&state).is_empty(), "{:?}", holders(&state));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_of_sandboxes_that_are_gone_are_released_when_a_runtime_opens() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "holds_of_sandboxes_that_are_gone_are_released_when_a_runtime_opens"
    ));
    let work = scratch();
    let lay = work.path().join("lay");
    layout(&lay, true);
    let state = work.path().join("state");
    let reference = format!("oci:{}:v1", lay.display());
    // What a killed runtime leaves: its sandbox's hold (and another holder's).
    let store = lockbox_image::Store::in_state_dir(&state).unwrap();
    let image = store
        .pull(&reference, &lockbox_image::PullOptions::default())
        .await
        .unwrap();
    store.hold(&image.id, "sandbox-sb-gone").unwrap();
    store.hold(&image.id, "someone-else").unwrap();
    let rt = runtime(&state).await;
    assert_eq!(holders(&state), vec!["someone-else".to_owned()]);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_without_bash_fails_a_shell_command_naming_bash_but_runs_processes() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "an_image_without_bash_fails_a_shell_command_naming_bash_but_runs_processes"
    ));
    let work = scratch();
    let lay = work.path().join("lay");
    layout(&lay, false);
    let state = work.path().join("state");
    let reference = format!("oci:{}:v1", lay.display());
    let (rt, sb) = sandbox_with(&state, image_spec(&reference)).await;
    let e = sb.exec(req("echo hi")).await.unwrap_err();
    assert!(e.to_string().contains("bash"), "{e}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_the_store_lacks_and_its_source_does_not_have_is_an_image_error() {
    let work = scratch();
    let state = work.path().join("state");
    let lay = work.path().join("lay");
    layout(&lay, true);
    let rt = runtime(&state).await;
    let e = rt
        .create_sandbox(image_spec(&format!("oci:{}:no-such-tag", lay.display())))
        .await
        .unwrap_err();
    assert!(
        matches!(e.code().as_str(), "IMAGE_NOT_FOUND" | "BAD_REFERENCE"),
        "{e} {:?}",
        e.code()
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_of_an_image_sandboxs_snapshot_runs_on_the_image_and_holds_it() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_fork_of_an_image_sandboxs_snapshot_runs_on_the_image_and_holds_it"
    ));
    let work = scratch();
    let lay = work.path().join("lay");
    layout(&lay, true);
    let dir = work.path().join("project");
    std::fs::create_dir_all(&dir).unwrap();
    let state = work.path().join("state");
    let reference = format!("oci:{}:v1", lay.display());
    let spec = SandboxSpec {
        workdir: Some(dir.clone()),
        ..image_spec(&reference)
    };
    let (rt, sb) = sandbox_with(&state, spec).await;
    let d = dir.display();
    run(&sb, &format!("echo kept > {d}/file")).await;
    let snap = sb.snapshot(None).await.unwrap();
    // A workspace abort restarts the sandbox: on the image still, still held once.
    sb.abort().await.unwrap();
    assert_eq!(out(&run(&sb, "echo \"$GREETING\"").await), "from-image\n");
    assert_eq!(holders(&state), vec![format!("sandbox-{}", sb.id())]);
    let forks = rt.fork_snapshot(snap.id.as_str(), 1).await.unwrap();
    let fork = rt.sandbox(forks[0].id.as_str()).unwrap();
    let r = run(
        &fork,
        &format!("cat {d}/file; echo \"$GREETING\"; busybox true && echo busybox"),
    )
    .await;
    assert_eq!(out(&r), "kept\nfrom-image\nbusybox\n", "{r:?}");
    let mut held = holders(&state);
    held.sort();
    let mut want = vec![
        format!("sandbox-{}", sb.id()),
        format!("sandbox-{}", fork.id()),
    ];
    want.sort();
    assert_eq!(held, want);
    rt.delete_sandbox(sb.id()).await.unwrap();
    assert_eq!(holders(&state), vec![format!("sandbox-{}", fork.id())]);
    rt.shutdown().await;
    assert!(holders(&state).is_empty());
}
