//! Helpers of the E2B end-to-end tests: a runtime over a scratch state directory with
//! the `lockbox-agent` binary, and what [`lockbox_testkit::sandboxes`] gives every test that
//! runs sandboxes.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use lockbox_runtime::{ExecRequest, ExecResult, Runtime, RuntimeConfig, Sandbox, SandboxSpec};
pub use lockbox_testkit::sandboxes::{
    agent_exe, also_as_nobody, host_agents, in_own_process, scratch, Scratch,
};
use std::path::Path;

pub async fn runtime(state: &Path) -> Runtime {
    let mut config = RuntimeConfig::new(state);
    config.agent_exe = Some(agent_exe().to_owned());
    Runtime::open(config).unwrap()
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
