//! `lockbox completions SHELL` and `lockbox man`: generated from the clap definitions, so
//! they never disagree with `--help`.

use crate::cli::Cli;
use crate::error::CliError;
use crate::error::ExitCode;
use clap::CommandFactory;
use lockbox_policy::name::quoted;
use std::path::Path;

/// Prints the completion script for `shell` on stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<ExitCode, CliError> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "lockbox", &mut script);
    crate::output::stdout_bytes(&script);
    Ok(ExitCode::SUCCESS)
}

/// Prints the manual page (roff) of `lockbox` on stdout, or with `dir` writes one page per
/// command there, as git does (`lockbox.1`, `lockbox-run.1`, `lockbox-branch-diff.1`, ...).
pub fn man(dir: Option<&Path>) -> Result<ExitCode, CliError> {
    let cmd = Cli::command();
    let result = match dir {
        None => page(&cmd).map(|p| crate::output::stdout_bytes(&p)),
        Some(dir) => write_pages(&cmd, "lockbox", dir),
    };
    result.map(|()| ExitCode::SUCCESS).map_err(|e| {
        let at = dir
            .map(|d| format!(" in {}", quoted(d)))
            .unwrap_or_default();
        CliError::new(1, format!("writing the manual pages{at}: {e}"))
    })
}

fn page(cmd: &clap::Command) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut out)?;
    Ok(out)
}

fn write_pages(cmd: &clap::Command, name: &str, dir: &Path) -> std::io::Result<()> {
    // The page's title is its file's name, so `man lockbox-run` finds what it shows.
    let cmd = cmd.clone().name(name.to_owned());
    std::fs::write(dir.join(format!("{name}.1")), page(&cmd)?)?;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(())
}
