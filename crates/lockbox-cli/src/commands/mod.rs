//! One module per `lockbox` subcommand; each returns `Result<ExitCode, CliError>`, which
//! `main` turns into the exit status.

use crate::output::eoutln;
pub mod ask;
pub mod audit;
pub mod branch;
pub mod branch_part;
pub mod branch_prompt;
pub mod check;
pub mod credentials;
pub mod help;
pub mod image;
pub mod journal;
pub mod mcp;
pub mod pre_arm;
pub mod run;
pub mod serve;
pub mod snapshot;
pub mod txn;
pub mod workdir;

/// The async runtime of `serve` and `mcp`. Its blocking pool keeps the threads it has started
/// (idle for up to a year, not tokio's 10 s) and starts one at once: tokio panics when it
/// cannot start a blocking thread while it has none, which is what happens once the process
/// ids run out (RLIMIT_NPROC, pid_max: an idle sandbox holds 4); the server would then die
/// at its next file call or stop, leaving its sandboxes behind. With a thread kept, the work
/// waits for it instead.
pub fn long_running_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    const YEAR: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(YEAR)
        .build()
        .context("starting the async runtime")?;
    runtime
        .block_on(runtime.spawn_blocking(|| ()))
        .context("starting the async runtime's blocking pool")?;
    Ok(runtime)
}

/// Prints `lockbox: <error>` and its hint on stderr, as every command does.
pub fn print_error(error: &dyn std::fmt::Display, hint: Option<String>) {
    eoutln!("lockbox: {error}");
    if let Some(hint) = hint {
        eoutln!("hint: {hint}");
    }
}

/// Checks a `--workdir` before anything starts: it must be an existing directory. The
/// message names the flag and the path; the caller exits 2 (usage error).
pub fn check_workdir(path: &std::path::Path) -> Result<(), String> {
    use lockbox_policy::name::quoted;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("--workdir {}: not a directory", quoted(path))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("--workdir {}: no such directory", quoted(path)))
        }
        Err(e) => Err(format!("--workdir {}: {}", quoted(path), os_error(&e))),
    }
}

/// An OS error as a person reads it: "Permission denied", without Rust's "(os error 13)".
pub fn os_error(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    }
}

/// An error and its causes on one line, each cause once: a message that already ends with
/// its source's text ("workdir w: No such file or directory (os error 2)") does not get it
/// again, as `{:#}` would.
pub fn chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let t = cause.to_string();
        if text.is_empty() {
            text = t;
        } else if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
    }
    text
}

/// Prints a command-line error as clap does, adding the hint a `run` without `--` needs;
/// returns the exit code (2 for a usage error, 0 for `--help`/`--version`).
pub fn usage_error(e: clap::Error, args: &[std::ffi::OsString]) -> crate::error::ExitCode {
    use clap::error::ErrorKind;
    let run_without_dashes = matches!(
        e.kind(),
        ErrorKind::UnknownArgument | ErrorKind::MissingRequiredArgument
    ) && args.get(1).is_some_and(|a| a == "run")
        && !args.iter().any(|a| a == "--");
    // Printing can only fail on a closed stream; the exit code says what happened.
    let _ = e.print();
    if run_without_dashes {
        let rest: Vec<String> = args[2..]
            .iter()
            .map(|a| {
                shlex::try_quote(&a.to_string_lossy())
                    .map_or_else(|_| "…".into(), |q| q.into_owned())
            })
            .collect();
        eoutln!(
            "\nhint: the command goes after `--`, so that its own flags are not read as lockbox's: \
             lockbox run [OPTIONS] -- {}",
            rest.join(" ")
        );
    }
    let code = u8::try_from(e.exit_code()).unwrap_or(2);
    crate::output::finish(crate::error::ExitCode::from(code))
}

#[cfg(test)]
mod tests {
    /// An error that prints its source in its own message, as many thiserror ones do.
    #[derive(Debug)]
    struct WithSource {
        source: std::io::Error,
    }

    impl std::fmt::Display for WithSource {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "workdir w: {}", self.source)
        }
    }

    impl std::error::Error for WithSource {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_in_its_message_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let e = anyhow::Error::new(WithSource { source: io }).context("starting");
        assert_eq!(
            super::chain(&e),
            "starting: workdir w: No such file or directory (os error 2)"
        );
        assert_eq!(format!("{e:#}").matches("os error 2").count(), 2, "{e:#}");
    }
}
