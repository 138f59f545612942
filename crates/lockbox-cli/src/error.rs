//! [`CliError`]: how a command fails. Commands return `Result<ExitCode, CliError>`; `main`
//! prints the error (`lockbox: <message>` and its hint) and exits with its code, in one place.

use std::fmt;

/// The exit status of a command (0–255). Not `std::process::ExitCode`, whose value cannot
/// be read back: the Python wheel's `lockbox` passes it to `exit` itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitCode(pub u8);

impl ExitCode {
    /// Success.
    pub const SUCCESS: ExitCode = ExitCode(0);
}

impl From<u8> for ExitCode {
    fn from(code: u8) -> ExitCode {
        ExitCode(code)
    }
}

/// A command's failure: what to tell the user and the exit code that says it to a script.
#[derive(Debug)]
pub struct CliError {
    /// One line naming what was wrong (the path, flag or id); empty when the command has
    /// already said everything (e.g. a JSON error object on stdout plus its own lines).
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
    /// The exit code.
    pub code: u8,
}

impl CliError {
    /// A failure with `code`.
    pub fn new(code: u8, message: impl fmt::Display) -> CliError {
        CliError {
            message: message.to_string(),
            hint: None,
            code,
        }
    }

    /// A usage error (exit 2): a bad flag, id or path.
    pub fn usage(message: impl fmt::Display) -> CliError {
        CliError::new(2, message)
    }

    /// A failure the command has already reported: only its exit code is left.
    pub fn reported(code: u8) -> CliError {
        CliError {
            message: String::new(),
            hint: None,
            code,
        }
    }

    /// Adds a hint.
    pub fn hint(mut self, hint: impl Into<String>) -> CliError {
        self.hint = Some(hint.into());
        self
    }

    /// Prints `lockbox: <message>` and the hint on stderr (nothing if already reported).
    pub fn print(&self) {
        if !self.message.is_empty() {
            crate::commands::print_error(&self.message, self.hint.clone());
        }
    }
}

/// An `anyhow` error of a binary-side step (exit 1), its causes on one line.
impl From<anyhow::Error> for CliError {
    fn from(e: anyhow::Error) -> CliError {
        CliError::new(1, crate::commands::chain(&e))
    }
}

/// A branch error: its own exit code (2 usage, 4 failed, 5 stale) and message.
impl From<lockbox_cow::CowError> for CliError {
    fn from(e: lockbox_cow::CowError) -> CliError {
        CliError::new(e.exit_code(), e)
    }
}

/// A transaction error: its own exit code and message.
impl From<lockbox_txn::TxnError> for CliError {
    fn from(e: lockbox_txn::TxnError) -> CliError {
        CliError::new(e.exit_code(), e)
    }
}

/// A process exit code from a command's own (`lockbox run` passes the command's through).
pub fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
