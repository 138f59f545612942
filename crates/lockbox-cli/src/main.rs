//! The `lockbox` command. Parsing lives in `cli`, one file per command in `commands/`;
//! this file only turns their results into the exit status, printing a failure once.
#![forbid(unsafe_code)]
// Every print goes through `output`'s macros: the std ones panic on a closed pipe.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod cli;
mod commands;
mod error;
mod output;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // A long-lived sandbox's agent is this binary re-executed inside it (lockbox-runtime).
    lockbox_confine::agent::main_if_agent();
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(e) => return commands::usage_error(e),
    };
    // Debug logs of each setup step on request (LOCKBOX_LOG=debug); errors are printed by
    // the commands themselves, so without it no subscriber is needed (and none is built,
    // which keeps start-up short).
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("LOCKBOX_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match args.command {
        cli::Command::Run(run) => commands::run::run(&run),
        cli::Command::Check(check) => commands::check::run(&check),
        cli::Command::Branch(branch) => commands::branch::run(&branch),
        cli::Command::Pipeline(args) => commands::txn::pipeline(&args),
        cli::Command::Gather(args) => commands::txn::gather(&args),
        cli::Command::Txn(args) => commands::txn::txn(&args),
        cli::Command::Serve(args) => commands::serve::run(&args),
        cli::Command::Journal(journal) => commands::journal::run(&journal),
        cli::Command::Completions { shell } => commands::help::completions(shell),
        cli::Command::Man { dir } => commands::help::man(dir.as_deref()),
    };
    let code = result.unwrap_or_else(|e| {
        e.print();
        ExitCode::from(e.code)
    });
    output::finish(code)
}
