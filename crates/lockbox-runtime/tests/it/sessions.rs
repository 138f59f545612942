//! Sessions: persistent bash state, per-call cwd/env, serialisation, parallelism, timeouts,
//! byte-exact output, termination, stdin.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_state_persists_across_calls() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "session_state_persists_across_calls"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "cd /tmp && export GREETING=hello && greet() { echo \"$GREETING $1\"; } && alias hi='echo alias-works'").await;
    let r = run(&sb, "pwd; greet world; hi").await;
    assert_eq!(out(&r), "/tmp\nhello world\nalias-works\n", "{r:?}");
    assert_eq!(r.exit_code, 0);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_call_cwd_and_env_do_not_leak() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "cd / && export KEEP=1 && unset ONLY").await;
    let mut r = req("pwd; echo \"$ONLY $KEEP\"; ONLY=changed");
    r.cwd = Some("/tmp".into());
    r.env.insert("ONLY".into(), "for-this-call".into());
    r.env.insert("KEEP".into(), "overridden".into());
    let got = sb.exec(r).await.unwrap();
    assert_eq!(out(&got), "/tmp\nfor-this-call overridden\n");
    let after = run(&sb, "pwd; echo \"${ONLY-unset} $KEEP\"").await;
    assert_eq!(out(&after), "/\nunset 1\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_execs_on_one_session_run_one_at_a_time_with_unmixed_output() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "echo 0 > /tmp/running").await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let sb = sb.clone();
        tasks.push(tokio::spawn(async move {
            // Each command checks that no other is inside its critical section.
            let cmd = format!(
                "read n < /tmp/running; [ \"$n\" = 0 ] || echo OVERLAP; echo 1 > /tmp/running; \
                 for j in 1 2 3; do echo \"cmd{i} line$j\"; sleep 0.01; done; echo 0 > /tmp/running"
            );
            sb.exec(req(&cmd)).await.unwrap()
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        assert_eq!(
            out(&r),
            format!("cmd{i} line1\ncmd{i} line2\ncmd{i} line3\n"),
            "{r:?}"
        );
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_run_in_parallel() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    for id in ["a", "b"] {
        sb.create_session(lockbox_runtime::SessionOptions {
            id: Some(id.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    run(&sb, "mkfifo /tmp/a2b /tmp/b2a").await;
    // A rendezvous: each side blocks until the other has started. Serialised sessions
    // would deadlock here (bounded by the timeout, which would then report timed_out).
    let mut a = req("echo ping > /tmp/a2b; read x < /tmp/b2a; echo \"a got $x\"");
    a.session = Some("a".into());
    a.timeout = Some(std::time::Duration::from_secs(20));
    let mut b = req("read x < /tmp/a2b; echo pong > /tmp/b2a; echo \"b got $x\"");
    b.session = Some("b".into());
    b.timeout = Some(std::time::Duration::from_secs(20));
    let (ra, rb) = tokio::join!(sb.exec(a), sb.exec(b));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(!ra.timed_out && !rb.timed_out);
    assert_eq!(out(&ra), "a got pong\n");
    assert_eq!(out(&rb), "b got ping\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_command_and_children_and_session_keeps_state() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "timeout_kills_command_and_children_and_session_keeps_state"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "cd /tmp; export MARK=kept").await;
    let mut r = req(
        "trap '' TERM; (trap '' TERM; sleep 300) & setsid sh -c 'trap \"\" TERM; sleep 300' & \
         echo started; sleep 300",
    );
    r.timeout = Some(std::time::Duration::from_millis(300));
    let got = sb.exec(r).await.unwrap();
    assert!(got.timed_out);
    assert_eq!(got.exit_code, 124);
    assert_eq!(out(&got), "started\n");
    let after = run(
        &sb,
        "pwd; echo $MARK; ps -eo comm= | grep -c '^sleep$' || true",
    )
    .await;
    assert_eq!(out(&after), "/tmp\nkept\n0\n", "{after:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_byte_exact_binary_and_large() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    // 10 MB of every byte value, NULs included, no trailing newline; stderr separate.
    let r = run(
        &sb,
        "head -c 10000000 /dev/urandom > /tmp/blob; cat /tmp/blob; printf 'e\\0rr' >&2",
    )
    .await;
    assert_eq!(r.stdout.len(), 10_000_000);
    assert_eq!(&r.stderr[..], b"e\0rr");
    let sum = run(&sb, "sha256sum < /tmp/blob").await;
    let ours = sha256_hex(&r.stdout);
    assert!(out(&sum).starts_with(&ours), "{} vs {ours}", out(&sum));
    let partial = run(&sb, "printf 'no newline \\377\\376'").await;
    assert_eq!(&partial.stdout[..], b"no newline \xff\xfe");
    rt.shutdown().await;
}

fn sha256_hex(data: &[u8]) -> String {
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_returns_its_code_ends_the_session_and_the_next_call_gets_a_fresh_one() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "export OLD=1").await;
    let ended = sb.exec(req("echo bye; exit 3")).await.unwrap();
    assert_eq!(ended.exit_code, 3);
    assert_eq!(out(&ended), "bye\n");
    assert!(!ended.timed_out);
    let fresh = run(&sb, "echo \"${OLD-fresh}\"").await;
    assert_eq!(out(&fresh), "fresh\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heredocs_quotes_and_stdin_bytes_work() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let r = run(
        &sb,
        "cat <<'EOF'\nline 'one'\n\"two\" $HOME\nEOF\necho after",
    )
    .await;
    assert_eq!(out(&r), "line 'one'\n\"two\" $HOME\nafter\n");
    // An unterminated quote is a syntax error of that command only.
    let bad = run(&sb, "echo 'unterminated").await;
    assert_ne!(bad.exit_code, 0);
    assert_eq!(out(&run(&sb, "echo still-fine").await), "still-fine\n");
    // stdin: exact bytes, then EOF; default stdin is empty.
    let mut with_stdin = req("wc -c; cat /dev/stdin | od -An -c | head -1");
    with_stdin.stdin = Some(bytes::Bytes::from_static(b"a\0b\n"));
    let got = sb.exec(with_stdin).await.unwrap();
    assert_eq!(out(&got).lines().next(), Some("4"));
    let none = run(&sb, "cat; echo done").await;
    assert_eq!(out(&none), "done\n");
    let mut big = req("wc -c");
    big.stdin = Some(bytes::Bytes::from(vec![7u8; 1_000_000]));
    assert_eq!(out(&sb.exec(big).await.unwrap()), "1000000\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_stops_the_running_command_without_waiting_for_the_queue() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "true").await; // the default session exists
    let sb2 = sb.clone();
    let long = tokio::spawn(async move { sb2.exec(req("sleep 300")).await });
    // Wait until the command runs; the queue of the session is not involved.
    while !sb.list_sessions().await.iter().any(|s| s.busy) {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    loop {
        sb.interrupt("default", lockbox_runtime::Signal::INT)
            .await
            .unwrap();
        if long.is_finished() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let r = long.await.unwrap().unwrap();
    assert_eq!(r.exit_code, 130, "{r:?}");
    assert!(!r.timed_out);
    assert_eq!(out(&run(&sb, "echo alive").await), "alive\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_stream_sends_output_as_it_comes_then_exit() {
    use futures_util::StreamExt;
    use lockbox_runtime::ExecEvent;
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let mut stream = sb
        .exec_stream(req(
            "echo one; echo two >&2; sleep 0.2; printf three; (exit 4)",
        ))
        .await
        .unwrap();
    let mut out_bytes = Vec::new();
    let mut err_bytes = Vec::new();
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        match &e {
            ExecEvent::Stdout { data } => out_bytes.extend_from_slice(data),
            ExecEvent::Stderr { data } => err_bytes.extend_from_slice(data),
            _ => {}
        }
        events.push(e);
    }
    assert!(matches!(events.first(), Some(ExecEvent::Start { session }) if session == "default"));
    match events.last() {
        Some(ExecEvent::Exit(x)) => assert_eq!(x.exit_code, 4),
        other => panic!("last event {other:?}"),
    }
    assert_eq!(out_bytes, b"one\nthree");
    assert_eq!(err_bytes, b"two\n");
    // "one" arrived before the sleep ended: in its own event before "three".
    let first_out = events
        .iter()
        .position(|e| matches!(e, ExecEvent::Stdout { .. }))
        .unwrap();
    assert!(matches!(&events[first_out], ExecEvent::Stdout { data } if &data[..] == b"one\n"));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_that_never_returns_from_a_timeout_ends_the_session() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let mut r = req("while :; do :; done");
    r.timeout = Some(std::time::Duration::from_millis(200));
    let err = sb.exec(r).await.unwrap_err();
    assert_eq!(err.code(), "SESSION_TERMINATED", "{err}");
    assert_eq!(out(&run(&sb, "echo fresh").await), "fresh\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_named_listed_and_deleted() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let opts = lockbox_runtime::SessionOptions {
        id: Some("build".into()),
        cwd: Some("/tmp".into()),
        env: [("MODE".to_string(), "fast".to_string())].into(),
    };
    sb.create_session(opts.clone()).await.unwrap();
    assert_eq!(
        sb.create_session(opts).await.unwrap_err().code(),
        "ALREADY_EXISTS"
    );
    let mut r = req("pwd; echo $MODE");
    r.session = Some("build".into());
    assert_eq!(out(&sb.exec(r.clone()).await.unwrap()), "/tmp\nfast\n");
    let ids: Vec<String> = sb
        .list_sessions()
        .await
        .into_iter()
        .map(|s| s.id.into())
        .collect();
    assert_eq!(ids, ["build"]);
    sb.delete_session("build").await.unwrap();
    assert_eq!(sb.exec(r).await.unwrap_err().code(), "SESSION_NOT_FOUND");
    let mut bad = req("true");
    bad.env.insert("NOT VALID".into(), "x".into());
    assert_eq!(sb.exec(bad).await.unwrap_err().code(), "INVALID_REQUEST");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sandboxes_are_deleted_and_the_limit_is_enforced() {
    let state = scratch();
    let mut config = lockbox_runtime::RuntimeConfig::new(state.path());
    config.agent_exe = Some(agent_exe().to_owned());
    config.max_sandboxes = 1;
    let rt = lockbox_runtime::Runtime::open(config).unwrap();
    let spec = lockbox_runtime::SandboxSpec {
        idle_timeout: Some(std::time::Duration::from_millis(300)),
        ..Default::default()
    };
    let info = rt.create_sandbox(spec).await.unwrap();
    let err = rt.create_sandbox(Default::default()).await.unwrap_err();
    assert_eq!(err.code(), "LIMIT_REACHED");
    let mut state_now = rt.sandbox_info(&info.id).unwrap().state;
    for _ in 0..100 {
        if state_now == lockbox_runtime::SandboxState::Stopped {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        state_now = rt.sandbox_info(&info.id).unwrap().state;
    }
    assert_eq!(state_now, lockbox_runtime::SandboxState::Stopped);
    // The slot is free again.
    let again = rt.create_sandbox(Default::default()).await.unwrap();
    rt.delete_sandbox(&again.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_is_bound_read_only_at_a_fixed_path_not_its_host_path() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let host = agent_exe().display().to_string();
    let r = run(
        &sb,
        &format!(
            "test -x /dev/.lockbox-agent && echo bound; test -e '{host}' || echo host-path-hidden; \
             echo x 2>/dev/null > /dev/.lockbox-agent || echo read-only"
        ),
    )
    .await;
    assert_eq!(out(&r), "bound\nhost-path-hidden\nread-only\n", "{r:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_functions_and_aliases_cannot_break_the_protocol() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "rm() { echo fake-rm; }; head() { echo fake-head; }; alias printf='echo nope'; [() { :; }; \
         alias eval='echo broken'; alias __lb_post='echo broken'; eval() { echo broken; }").await;
    let redefine = run(&sb, "__lb_post() { :; }").await;
    assert_ne!(
        redefine.exit_code, 0,
        "the protocol's functions are read-only"
    );
    let mut r = req("cat; pwd");
    r.stdin = Some(bytes::Bytes::from_static(b"in\n"));
    r.cwd = Some("/tmp".into());
    let got = sb.exec(r).await.unwrap();
    assert_eq!(out(&got), "in\n/tmp\n", "{got:?}");
    assert_eq!(out(&run(&sb, "echo ok").await), "ok\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_flooding_the_status_pipe_ends_its_session_not_the_runtime() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    // While a command runs, bash keeps the status pipe's descriptor saved above 9, where
    // builtins reach it: write forged status lines (and more) to every such descriptor.
    let flood = "for fd in $(ls /proc/$$/fd); do [ \"$fd\" -ge 10 ] && \
                 { for i in $(seq 2000); do echo \"999 0\"; done >&\"$fd\"; } 2>/dev/null; done; sleep 1";
    let err = sb.exec(req(flood)).await.unwrap_err();
    assert_eq!(err.code(), "SESSION_TERMINATED", "{err}");
    assert_eq!(out(&run(&sb, "echo fresh").await), "fresh\n");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_output_keeps_the_first_bytes_and_says_it_was_cut() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    let cap = lockbox_runtime::DEFAULT_MAX_EXEC_OUTPUT;
    let r = run(&sb, "seq 1 10000000; echo err >&2").await;
    assert_eq!(r.stdout.len(), cap);
    assert!(r.stdout.starts_with(b"1\n2\n3\n"));
    assert!(r.stdout_truncated && !r.stderr_truncated);
    assert_eq!(&r.stderr[..], b"err\n");
    let small = run(&sb, "echo ok").await;
    assert!(!small.stdout_truncated);
    rt.shutdown().await;
}

/// The agent, a session's shell and the shim between them get small descriptor tables
/// however many descriptors the process holding the sandbox has open (`lockbox serve` holds
/// several per sandbox): a table is sized at each fork to the parent's highest open
/// descriptor and never shrinks, so the agent (a fork of the init, itself a clone of the
/// server) and, through its socket numbered as in its creator, every process it forked
/// carried a table that large (issue 34: 128 KB each at 2,000 sandboxes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_and_its_shells_get_small_descriptor_tables_when_their_creator_holds_thousands() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "the_agent_and_its_shells_get_small_descriptor_tables_when_their_creator_holds_thousands"
    ));
    // Room for them (the soft limit is often 1,024), in this test process only.
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(4096);
    limit.current = Some(hard.min(4096));
    setrlimit(Resource::Nofile, limit).unwrap();
    let held = 2000.min(hard.min(4096) as usize - 200);
    let state = scratch();
    // The agent's socket is made while these are open: its number is above them all.
    let fillers: Vec<std::fs::File> = (0..held)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    let (rt, sb) = sandbox(state.path()).await;
    drop(fillers);
    // The shell, its parent (the agent) and the agent's parent (the sandbox's init).
    let r = run(
        &sb,
        "init=$(awk '/^PPid/{print $2}' /proc/$PPID/status); \
         grep -h FDSize /proc/$$/status /proc/$PPID/status /proc/$init/status",
    )
    .await;
    let sizes: Vec<u32> = out(&r)
        .lines()
        .map(|l| l.trim_start_matches("FDSize:").trim().parse().unwrap())
        .collect();
    assert_eq!(sizes.len(), 3, "{r:?}");
    // bash keeps its script at descriptor 255: 256 slots, against 2,048 before.
    assert!(
        sizes.iter().all(|&n| n <= 256),
        "FDSize of shell, agent, init: {sizes:?} ({held} held)"
    );
    rt.shutdown().await;
}

/// The pipes of this process (its sessions' ends, among others).
fn own_pipes() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("pipe:"))
        })
        .count()
}

/// Issue 34: every idle session held five descriptors in the runtime, so a server with
/// thousands of sandboxes ran out of them. Beyond `max_held_sessions` (those used last),
/// an idle session's are closed and its next command asks its agent for them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_beyond_the_bound_hold_no_pipes_and_keep_their_state() {
    let name = lockbox_testkit::test_name!(
        "idle_sessions_beyond_the_bound_hold_no_pipes_and_keep_their_state"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let state = scratch();
    let rt = runtime_with(state.path(), |c| c.max_held_sessions = 2).await;
    let info = rt
        .create_sandbox(lockbox_runtime::SandboxSpec::default())
        .await
        .unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    let before = own_pipes();
    let in_session = |n: usize, command: String| {
        let mut r = req(&command);
        r.session = Some(format!("s{n}").as_str().into());
        r
    };
    for n in 0..6 {
        let opts = lockbox_runtime::SessionOptions {
            id: Some(format!("s{n}").as_str().into()),
            ..Default::default()
        };
        sb.create_session(opts).await.unwrap();
        let r = sb
            .exec(in_session(
                n,
                format!("mkdir -p /tmp/d{n} && cd /tmp/d{n} && X={n}"),
            ))
            .await
            .unwrap();
        assert_eq!(r.exit_code, 0, "{r:?}");
    }
    // Two sessions' five pipes each, not six sessions'.
    assert_eq!(own_pipes() - before, 2 * 5);
    for round in 0..3 {
        for n in (0..6).rev() {
            let mut r = in_session(n, "echo \"$X $PWD\"; cat".into());
            r.stdin = Some(format!("round {round}\n").into_bytes().into());
            let got = sb.exec(r).await.unwrap();
            assert_eq!(out(&got), format!("{n} /tmp/d{n}\nround {round}\n"));
        }
        assert_eq!(own_pipes() - before, 2 * 5);
    }
    // A session whose shell died while its pipes were closed here says so, as any.
    let got = sb.exec(in_session(5, "kill -9 $$".into())).await;
    assert!(got.is_err(), "{got:?}");
    let fresh = sb
        .exec(in_session(5, "echo ${X-fresh}".into()))
        .await
        .unwrap();
    assert_eq!(out(&fresh), "fresh\n");
    rt.shutdown().await;
}

/// Descriptors of this process other than pipes (the sessions' pipes are bounded apart:
/// see the test above).
fn own_descriptors_but_pipes() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| !t.to_string_lossy().starts_with("pipe:"))
        })
        .count()
}

/// Processes below this one.
fn own_descendants() -> usize {
    lockbox_testkit::descendants(std::process::id()).len()
}

/// Issue 34: an idle sandbox held three descriptors in the runtime (its init's pidfd, its
/// report socket, its agent's socket) and four processes (init, agent, the default shell's
/// shim, the shell): 10,000 of them passed both a hard limit of 20,000 open files and the
/// default `pid_max` of 32,768. Now its init is parked and its shell runs in place of the
/// shim: one descriptor, three processes. And a shell that exits still takes what it
/// started with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sandbox_holds_one_descriptor_in_the_runtime_and_three_processes() {
    let name = lockbox_testkit::test_name!(
        "an_idle_sandbox_holds_one_descriptor_in_the_runtime_and_three_processes"
    );
    also_as_nobody(&name);
    if !in_own_process(&name) {
        return;
    }
    let state = scratch();
    let rt = runtime(state.path()).await;
    let start = || async {
        let info = rt
            .create_sandbox(lockbox_runtime::SandboxSpec::default())
            .await
            .unwrap();
        let sb = rt.sandbox(&info.id).unwrap();
        let r = sb.exec(req("echo $$ $PPID")).await.unwrap();
        (sb, out(&r))
    };
    // What the runtime opens once for all (its first sandbox's) is not counted.
    let (first, _) = start().await;
    let (descriptors, processes) = (own_descriptors_but_pipes(), own_descendants());
    let mut sandboxes = Vec::new();
    for _ in 0..4 {
        sandboxes.push(start().await);
    }
    assert_eq!(own_descriptors_but_pipes() - descriptors, 4);
    assert_eq!(own_descendants() - processes, 4 * 3);
    // The shell is the agent's child, no shim between them.
    let (sb, pids) = &sandboxes[0];
    let agent = sb
        .exec(req("awk '/^PPid/{print $2}' /proc/$PPID/status"))
        .await
        .unwrap();
    let (shell, parent) = pids.trim().split_once(' ').unwrap();
    assert_eq!(
        out(&agent),
        "1\n",
        "the shell {shell}'s parent {parent} is not the agent"
    );

    // A shell that exits: what it left running (a daemon in its own session, a job) ends.
    let ended = first
        .exec(req("setsid sleep 300 & sleep 301 & exit 7"))
        .await
        .unwrap();
    assert_eq!(ended.exit_code, 7);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = first
            .exec(req("ps -eo comm= | grep -c '^sleep$' || true"))
            .await
            .unwrap();
        if out(&left) == "0\n" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "left: {left:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    rt.shutdown().await;
}
