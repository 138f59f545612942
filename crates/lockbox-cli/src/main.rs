//! The `lockbox` command (the library `lockbox_cli` does the work).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    // A long-lived sandbox's agent is this binary re-executed inside it (lockbox-runtime).
    lockbox_agent::main_if_agent();
    let code = lockbox_cli::main(std::env::args_os().collect());
    std::process::ExitCode::from(code.0)
}
