//! The `lockbox` command as a library: [`main`] runs it. Parsing lives in `cli`, one file
//! per command in `commands/`; [`main`] only turns their results into the exit status,
//! printing a failure once. The binary (`main.rs`) and the Python wheel's `lockbox` script
//! (the extension links this crate) both call it.
#![forbid(unsafe_code)]
// Every print goes through `output`'s macros: the std ones panic on a closed pipe.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod agent;
mod cli;
mod commands;
mod error;
mod output;
mod prearm;

pub use crate::agent::install_agent;
pub use crate::prearm::client::{
    check_switch as check_pre_arm_switch, hand_over as pre_armed_run, PreArmedEnd,
};
pub use crate::prearm::enable as enable_pre_arm;
pub use crate::prearm::enable_in_extension as enable_pre_arm_in_extension;

use clap::Parser;
use std::ffi::OsString;

pub use crate::error::ExitCode;

/// Runs `lockbox` with `args` (the program name first, as `std::env::args_os` gives them).
pub fn main(args: Vec<OsString>) -> ExitCode {
    let parsed = match cli::parse_run_only(&args) {
        Some(run) => cli::Cli {
            command: cli::Command::Run(run),
        },
        None => match cli::Cli::try_parse_from(&args) {
            Ok(parsed) => parsed,
            Err(e) => return commands::usage_error(e, &args),
        },
    };
    // Debug logs of each setup step on request (LOCKBOX_LOG=debug); errors are printed by
    // the commands themselves, so without it no subscriber is needed (and none is built,
    // which keeps start-up short). But a server's errors go to no terminal: its 500s tell
    // the client to "see the server log", so their causes are logged unasked (issue 32).
    let filter = match tracing_subscriber::EnvFilter::try_from_env("LOCKBOX_LOG") {
        Ok(filter) => Some(filter),
        Err(_) if matches!(parsed.command, cli::Command::Serve(_)) => {
            Some(tracing_subscriber::EnvFilter::new("error"))
        }
        Err(_) => None,
    };
    if let Some(filter) = filter {
        // Only the first call installs one (a host process may have its own).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let result = match parsed.command {
        cli::Command::Run(run) => commands::run::run(&run),
        cli::Command::Check(check) => commands::check::run(&check),
        cli::Command::Branch(branch) => commands::branch::run(&branch),
        cli::Command::Snapshot(args) => commands::snapshot::run(&args),
        cli::Command::Pipeline(args) => commands::txn::pipeline(&args),
        cli::Command::Gather(args) => commands::txn::gather(&args),
        cli::Command::Txn(args) => commands::txn::txn(&args),
        cli::Command::Serve(args) => commands::serve::run(&args),
        cli::Command::Mcp(args) => commands::mcp::run(&args),
        cli::Command::Journal(journal) => commands::journal::run(&journal),
        cli::Command::Image(args) => commands::image::run(&args),
        cli::Command::PreArm(args) => commands::pre_arm::run(&args),
        cli::Command::Completions { shell } => commands::help::completions(shell),
        cli::Command::Man { dir } => commands::help::man(dir.as_deref()),
    };
    let code = result.unwrap_or_else(|e| {
        e.print();
        ExitCode::from(e.code)
    });
    output::finish(code)
}
