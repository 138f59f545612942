//! Background processes: tree kill, cursor logs, eviction, no loss without readers, stdin,
//! PTYs, and delete leaving nothing behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use bytes::Bytes;
use common::*;
use futures_util::StreamExt;
use lockbox_runtime::{LogChunk, ProcessCommand, ProcessSpec, ProcessState, PtySize};
use std::time::Duration;

fn argv(args: &[&str]) -> ProcessSpec {
    ProcessSpec {
        command: ProcessCommand::Argv(args.iter().map(|s| s.to_string()).collect()),
        cwd: None,
        env: Default::default(),
        pty: None,
        log_bytes: None,
        stdin: false,
    }
}

fn shell(script: &str) -> ProcessSpec {
    ProcessSpec {
        command: ProcessCommand::Shell {
            script: script.into(),
            session: None,
        },
        ..argv(&["unused"])
    }
}

fn bytes_of(c: &LogChunk) -> Vec<u8> {
    c.segments.iter().flat_map(|s| s.data.to_vec()).collect()
}

async fn wait_exit(sb: &lockbox_runtime::Sandbox, id: &str) -> lockbox_runtime::ProcessInfo {
    let mut logs = sb.follow_logs(id, u64::MAX).unwrap();
    while logs.next().await.is_some() {}
    sb.process(id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_leaves_nothing_of_the_tree_alive() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "kill_leaves_nothing_of_the_tree_alive"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    // Double fork, setsid and ignored SIGTERM: the daemon pattern.
    let p = sb
        .start_process(shell(
            "trap '' TERM; (setsid sh -c 'trap \"\" TERM; (trap \"\" TERM; exec sleep 301) & sleep 302' &) ; \
             echo ready; exec sleep 303",
        ))
        .await
        .unwrap();
    let mut logs = sb.follow_logs(&p.id, 0).unwrap();
    let first = logs.next().await.unwrap();
    assert_eq!(bytes_of(&first), b"ready\n");
    // The detached sleeps start asynchronously.
    let mut before = String::new();
    for _ in 0..500 {
        before = out(&run(&sb, "ps -eo args= | grep -c '^sleep 30[123]$'").await);
        if before == "3\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(before, "3\n", "the tree runs");
    let info = sb
        .kill_process(&p.id, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(info.state, ProcessState::Exited);
    assert_eq!(info.signal, Some(libc::SIGKILL));
    let after = run(&sb, "ps -eo args= | grep -c '^sleep 30[123]$' || true").await;
    assert_eq!(out(&after), "0\n", "nothing of the tree survives");
    rt.shutdown().await;
}

/// Issue 30: a command's exit ends what it left running (the shim walks `/proc` only when
/// it still has children), and a command that left nothing ends with its own status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_30_a_command_that_exits_leaves_nothing_of_its_tree_running() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "issue_30_a_command_that_exits_leaves_nothing_of_its_tree_running"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    // A child, a double-forked orphan and a setsid daemon, all ignoring SIGTERM; the
    // command waits until they run, then exits 7 on its own.
    let p = sb
        .start_process(shell(
            "trap '' TERM; sleep 321 & (sleep 322 &); setsid sh -c 'trap \"\" TERM; exec sleep 323' & \
             while [ \"$(ps -eo args= | grep -c '^sleep 32[123]$')\" != 3 ]; do sleep 0.01; done; exit 7",
        ))
        .await
        .unwrap();
    let info = wait_exit(&sb, &p.id).await;
    assert_eq!(info.state, ProcessState::Exited);
    assert_eq!(info.exit_code, Some(7));
    let after = run(&sb, "ps -eo args= | grep -c '^sleep 32[123]$' || true").await;
    assert_eq!(out(&after), "0\n", "nothing of the tree survives its exit");
    // And the common case: nothing left behind, the status as it was.
    let q = sb
        .start_process(argv(&["/bin/sh", "-c", "exit 3"]))
        .await
        .unwrap();
    assert_eq!(wait_exit(&sb, &q.id).await.exit_code, Some(3));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_resume_exactly_by_cursor_and_keep_exit_code() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let p = sb
        .start_process(shell(
            "for i in $(seq 1 1000); do echo \"line $i\"; done; echo err >&2; exit 7",
        ))
        .await
        .unwrap();
    let info = wait_exit(&sb, &p.id).await;
    assert_eq!(info.exit_code, Some(7));
    let mut cursor = 0;
    let mut all = Vec::new();
    loop {
        let c = sb.read_logs(&p.id, cursor, 777).unwrap();
        assert!(!c.truncated);
        assert_eq!(
            c.segments.first().map(|s| s.offset).unwrap_or(cursor),
            cursor
        );
        all.extend(bytes_of(&c));
        cursor = c.next;
        if c.eof {
            break;
        }
    }
    let expected: String = (1..=1000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(&all[..expected.len()], expected.as_bytes());
    assert_eq!(&all[expected.len()..], b"err\n");
    // The same cursor gives the same bytes again.
    let again = sb.read_logs(&p.id, 100, 10).unwrap();
    assert_eq!(bytes_of(&again), &all[100..110]);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_marks_truncated_and_nothing_is_lost_without_a_reader() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let mut spec = shell("head -c 300000 /dev/zero | tr '\\0' a; printf END");
    spec.log_bytes = Some(100_000);
    let p = sb.start_process(spec).await.unwrap();
    // No reader until it has exited.
    let info = wait_exit(&sb, &p.id).await;
    assert_eq!(info.exit_code, Some(0));
    assert_eq!(info.log_end, 300_003);
    let c = sb.read_logs(&p.id, 0, 1 << 20).unwrap();
    assert!(c.truncated);
    let layout: Vec<(u64, usize)> = c
        .segments
        .iter()
        .map(|s| (s.offset, s.data.len()))
        .collect();
    assert_eq!(c.segments[0].offset, 200_003, "{layout:?}");
    let data = bytes_of(&c);
    assert_eq!(data.len(), 100_000);
    assert!(data.ends_with(b"aaaEND"));
    assert!(c.eof);

    // Within the bound, a process that writes while nobody reads loses nothing.
    let q = sb
        .start_process(shell("for i in $(seq 1 20000); do echo $i; done"))
        .await
        .unwrap();
    wait_exit(&sb, &q.id).await;
    let c = sb.read_logs(&q.id, 0, 1 << 20).unwrap();
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert!(!c.truncated);
    assert_eq!(bytes_of(&c), expected.as_bytes());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_round_trip_and_close() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let mut spec = argv(&["cat"]);
    spec.stdin = true;
    let p = sb.start_process(spec).await.unwrap();
    sb.write_stdin(&p.id, Bytes::from_static(b"one\0two\n"))
        .await
        .unwrap();
    let mut follow = sb.follow_logs(&p.id, 0).unwrap();
    let c = follow.next().await.unwrap();
    assert_eq!(bytes_of(&c), b"one\0two\n");
    sb.close_stdin(&p.id).await.unwrap();
    let info = wait_exit(&sb, &p.id).await;
    assert_eq!(info.exit_code, Some(0));
    let err = sb
        .write_stdin(&p.id, Bytes::from_static(b"late"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PROCESS_NOT_RUNNING");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pty_drives_an_interactive_shell() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_pty_drives_an_interactive_shell"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let mut spec = argv(&["bash", "--norc", "--noprofile", "-i"]);
    spec.pty = Some(PtySize { cols: 80, rows: 24 });
    let p = sb.start_process(spec).await.unwrap();
    let att = sb.attach_pty(&p.id).unwrap();
    let mut output = att.output;
    att.input
        .send(Bytes::from_static(b"stty size; tty; echo $((6*7))x\n"))
        .await
        .unwrap();
    let mut seen = String::from_utf8_lossy(&att.scrollback).into_owned();
    while !(seen.contains("24 80") && seen.contains("42x") && seen.contains("/dev/pts/")) {
        let chunk = tokio::time::timeout(Duration::from_secs(20), output.next())
            .await
            .expect("pty output")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    sb.resize_pty(&p.id, 100, 30).unwrap();
    att.input
        .send(Bytes::from_static(b"stty size\n"))
        .await
        .unwrap();
    while !seen.contains("30 100") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), output.next())
            .await
            .expect("pty output")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    // A second viewer gets the scrollback.
    let second = sb.attach_pty(&p.id).unwrap();
    assert!(String::from_utf8_lossy(&second.scrollback).contains("42x"));
    att.input
        .send(Bytes::from_static(b"exit 5\n"))
        .await
        .unwrap();
    let info = wait_exit(&sb, &p.id).await;
    assert_eq!(info.exit_code, Some(5));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_process_starts_in_the_session_cwd_and_env() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "cd /tmp; export FROM_SESSION=yes").await;
    let p = sb
        .start_process(shell("pwd; echo $FROM_SESSION"))
        .await
        .unwrap();
    wait_exit(&sb, &p.id).await;
    let c = sb.read_logs(&p.id, 0, 1000).unwrap();
    assert_eq!(bytes_of(&c), b"/tmp\nyes\n");
    let missing = sb
        .start_process(argv(&["/no/such/program"]))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), "INVALID_REQUEST", "{missing}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_leaves_no_process_behind() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    // Durations unique to this run, so that only this test's sleeps are counted on a host
    // where other tests (or other runs of this one) sleep too.
    let tag = std::process::id() % 1_000_000;
    let secs = |n: u32| format!("40{n}.{tag:06}");
    let p = sb
        .start_process(shell(&format!(
            "setsid sleep {} & exec sleep {}",
            secs(0),
            secs(1)
        )))
        .await
        .unwrap();
    run(&sb, &format!("(setsid sleep {} &) ; echo", secs(2))).await;
    let _ = p;
    let ours: Vec<String> = (0..3).map(secs).collect();
    // The background sleeps start asynchronously.
    for _ in 0..1000 {
        if host_sleepers(&ours) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(host_sleepers(&ours), 3);
    let info = rt.delete_sandbox(sb.id()).await.unwrap();
    assert_eq!(info.state, lockbox_runtime::SandboxState::Stopped);
    assert_eq!(host_sleepers(&ours), 0);
    let err = sb.exec(req("true")).await.unwrap_err();
    assert_eq!(err.code(), "SANDBOX_NOT_RUNNING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_whose_processes_killed_its_agent_answers_not_running_not_internal() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_sandbox_whose_processes_killed_its_agent_answers_not_running_not_internal"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    // Everything the sandbox's user may signal in its pid namespace, the agent too.
    // The agent may die before it answers the start itself: either way is the sandbox ending.
    if let Err(e) = sb.start_process(shell("kill -9 -1")).await {
        assert_eq!(e.code(), "SANDBOX_NOT_RUNNING", "{e}");
    }
    // Every later call is the sandbox having ended, never an internal error.
    let mut codes = Vec::new();
    for _ in 0..500 {
        codes = vec![
            sb.stat("/").await.err().map(|e| e.code().to_string()),
            sb.list("/", false, false)
                .await
                .err()
                .map(|e| e.code().to_string()),
            sb.watch("/tmp", false)
                .await
                .err()
                .map(|e| e.code().to_string()),
            sb.exec(req("true"))
                .await
                .err()
                .map(|e| e.code().to_string()),
        ];
        if codes.iter().all(Option::is_some) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for code in &codes {
        assert!(
            matches!(
                code.as_deref(),
                Some("SANDBOX_NOT_RUNNING" | "SESSION_TERMINATED")
            ),
            "{codes:?}"
        );
    }
    rt.shutdown().await;
}

/// Processes visible on the host running `sleep D` for one of `durations`.
fn host_sleepers(durations: &[String]) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            durations
                .iter()
                .any(|d| c.as_slice() == format!("sleep\0{d}\0").as_bytes())
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_outlive_idle_runtime_threads() {
    // tokio retires idle blocking threads after 10 s; a sandbox started from one must not
    // die with it (the init's parent-death signal is per thread).
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(out(&run(&sb, "echo alive").await), "alive\n");
    rt.shutdown().await;
}

/// The sandbox's `usage` as [`lockbox_runtime::Runtime::sandbox_info`] reads it now.
async fn usage_of(rt: &lockbox_runtime::Runtime, id: &str) -> lockbox_runtime::ResourceUse {
    rt.sandbox_info(id).unwrap().usage.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_counts_the_sandboxs_live_processes_and_the_cpu_of_those_that_ended() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "info_counts_the_sandboxs_live_processes_and_the_cpu_of_those_that_ended"
    ));
    let state = scratch();
    let mut spec = lockbox_runtime::SandboxSpec::default();
    spec.policy.limits.memory = Some(lockbox_policy::ByteSize(1 << 30));
    spec.policy.limits.processes = Some(200);
    spec.idle_timeout = Some(Duration::from_secs(600));
    let (rt, sb) = sandbox_with(state.path(), spec).await;
    let info = rt.sandbox_info(sb.id()).unwrap();
    let policy = info.policy.unwrap();
    assert_eq!(
        (policy.net, policy.max_memory_bytes, policy.max_processes),
        (lockbox_runtime::NetKind::None, Some(1 << 30), Some(200))
    );
    assert_eq!(policy.idle_timeout, Some(Duration::from_secs(600)));
    let idle = info.usage.unwrap();
    assert!(idle.processes >= 2, "init and agent at least: {idle:?}");
    assert!(idle.rss_bytes > 0, "{idle:?}");

    sb.start_process(shell("sleep 501 & sleep 502 & exec sleep 503"))
        .await
        .unwrap();
    let mut busy = idle;
    for _ in 0..500 {
        busy = usage_of(&rt, sb.id()).await;
        if busy.processes >= idle.processes + 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(busy.processes >= idle.processes + 3, "{idle:?} → {busy:?}");
    assert!(busy.threads >= busy.processes, "{busy:?}");

    // CPU spent by a command that has ended still counts (its parent reaped it).
    let before = usage_of(&rt, sb.id()).await.cpu;
    let r = run(
        &sb,
        "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'",
    )
    .await;
    assert_eq!(r.exit_code, 0);
    let after = usage_of(&rt, sb.id()).await.cpu;
    assert!(
        after >= before + Duration::from_millis(20),
        "{before:?} → {after:?}"
    );

    // Stopped: no use, the policy kept (read back from the record).
    let stopped = rt.delete_sandbox(sb.id()).await.unwrap();
    assert!(stopped.usage.is_none(), "{stopped:?}");
    let listed = rt.list_sandboxes().unwrap();
    let record = listed.iter().find(|i| i.id == sb.id()).unwrap();
    assert_eq!(record.policy.as_ref(), Some(&policy));
    assert!(record.usage.is_none());
}
