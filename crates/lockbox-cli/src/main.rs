//! The `lockbox` command. Parsing lives in `cli`, one file per command in `commands/`;
//! this file only turns results into exit codes.
#![forbid(unsafe_code)]

mod cli;
mod commands;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LOCKBOX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let code = match args.command {
        cli::Command::Run(run) => commands::run::run(&run),
        cli::Command::Check(check) => commands::check::run(&check),
    };
    std::process::exit(code);
}
