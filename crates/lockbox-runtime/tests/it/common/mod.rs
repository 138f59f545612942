//! Helpers of the runtime's end-to-end tests: a runtime over a scratch state directory with
//! the `lockbox-agent` binary, and what [`lockbox_testkit::sandboxes`] gives every test that
//! runs sandboxes.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use lockbox_runtime::{ExecRequest, ExecResult, Runtime, RuntimeConfig, Sandbox, SandboxSpec};
pub use lockbox_testkit::sandboxes::{
    agent_exe, also_as_nobody, host_agents, in_own_process, scratch,
};
use std::path::Path;

/// A runtime over `state`. A test that opens a second runtime on a state directory after
/// dropping the first found its lock still held once in CI. The lock is an `flock` on an
/// open file: a copy of its descriptor in a sandbox another test of this process forked
/// meanwhile (until it executes), or a task of the first runtime not yet ended, would hold
/// it a moment longer; which one it was is not known. So "in use" is retried (10 s).
pub async fn runtime(state: &Path) -> Runtime {
    runtime_with(state, |_| {}).await
}

/// [`runtime`] with `config` changing its configuration first.
pub async fn runtime_with(state: &Path, config: impl Fn(&mut RuntimeConfig)) -> Runtime {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut c = RuntimeConfig::new(state);
        c.agent_exe = Some(agent_exe().to_owned());
        config(&mut c);
        match Runtime::open(c) {
            Err(e)
                if e.to_string().contains("in use by another")
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            other => return other.unwrap(),
        }
    }
}

/// A runtime and a running sandbox with the default policy.
pub async fn sandbox(state: &Path) -> (Runtime, Sandbox) {
    sandbox_with(state, SandboxSpec::default()).await
}

pub async fn sandbox_with(state: &Path, spec: SandboxSpec) -> (Runtime, Sandbox) {
    let rt = runtime(state).await;
    let info = rt.create_sandbox(spec).await.unwrap();
    let sb = rt.sandbox(&info.id).unwrap();
    (rt, sb)
}

pub fn req(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        ..ExecRequest::default()
    }
}

pub async fn run(sb: &Sandbox, command: &str) -> ExecResult {
    sb.exec(req(command)).await.unwrap()
}

pub fn out(r: &ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}
