//! The `lockbox` command (the library `lockbox_cli` does the work).
#![forbid(unsafe_code)]

/// Freed heap blocks are zeroed: a sandbox's init, a fork of this process, inherits no
/// freed copy of a credential header (issue 32, `lockbox_confine::ZeroOnFree`).
#[global_allocator]
static ALLOC: lockbox_confine::ZeroOnFree = lockbox_confine::ZeroOnFree;

fn main() -> std::process::ExitCode {
    // A long-lived sandbox's agent is the agent lockbox embeds (src/agent.rs), or this binary
    // re-executed inside it when the state directory is mounted noexec.
    lockbox_agent::main_if_agent();
    // `lockbox run` may hand its command to a pre-armed sandbox of this executable's helper.
    lockbox_cli::enable_pre_arm();
    let code = lockbox_cli::main(std::env::args_os().collect());
    std::process::ExitCode::from(code.0)
}
