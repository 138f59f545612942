//! Sessions: persistent bash state, per-call cwd/env, serialisation, parallelism, timeouts,
//! byte-exact output, termination, stdin.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_state_persists_across_calls() {
    also_as_nobody("session_state_persists_across_calls");
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    run(&sb, "cd /tmp && export GREETING=hello && greet() { echo \"$GREETING $1\"; } && alias hi='echo alias-works'").await;
    let r = run(&sb, "pwd; greet world; hi").await;
    assert_eq!(out(&r), "/tmp\nhello world\nalias-works\n", "{r:?}");
    assert_eq!(r.exit_code, 0);
    rt.shutdown().await;
}
