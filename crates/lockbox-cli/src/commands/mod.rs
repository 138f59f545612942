//! One module per `lockbox` subcommand; each returns the process exit code.

use crate::output::eoutln;
pub mod branch;
pub mod check;
pub mod journal;
pub mod run;
pub mod serve;
pub mod txn;
pub mod workdir;

/// Prints `lockbox: <error>` and its hint on stderr, as every command does.
pub fn print_error(error: &dyn std::fmt::Display, hint: Option<String>) {
    eoutln!("lockbox: {error}");
    if let Some(hint) = hint {
        eoutln!("hint: {hint}");
    }
}
