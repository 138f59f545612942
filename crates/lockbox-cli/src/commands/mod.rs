//! One module per `lockbox` subcommand; each returns the process exit code.

pub mod branch;
pub mod check;
pub mod journal;
pub mod run;
pub mod serve;
pub mod txn;
pub mod workdir;

/// Prints `lockbox: <error>` and its hint on stderr, as every command does.
pub fn print_error(error: &dyn std::fmt::Display, hint: Option<String>) {
    eprintln!("lockbox: {error}");
    if let Some(hint) = hint {
        eprintln!("hint: {hint}");
    }
}
