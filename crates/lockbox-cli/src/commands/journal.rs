//! `lockbox journal list | status RUN | dump RUN | fork RUN`: inspect and fork durable step
//! journals. Parsing of `--journal` lives in `lockbox_journal::StorageUrl`; this file only
//! translates arguments into one journal call and prints the result.

use crate::error::ExitCode;
use std::io::Write;

use crate::error::CliError;

use anyhow::Context;
use clap::{Args, Subcommand};
use lockbox_journal::{EntryBody, ForkPoint, Journal, RunId, StepId, StepOutcome, StorageUrl};

/// Arguments of `lockbox journal`.
#[derive(Debug, Args)]
pub struct JournalArgs {
    /// Where the journal lives: sqlite:PATH, file:DIR or postgres://USER@HOST:PORT/DB
    /// (before or after the subcommand). Every command reads an existing journal: none is
    /// created.
    #[arg(long, value_name = "URL", env = "LOCKBOX_JOURNAL", global = true)]
    pub journal: Option<StorageUrl>,
    /// Print JSON: `list` an array of run ids, `fork` `{"run": ID}` (`status` always
    /// prints JSON; `dump --json` prints the stored lines).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: JournalCommand,
}

/// The `lockbox journal` subcommands.
#[derive(Debug, Subcommand)]
pub enum JournalCommand {
    /// List the runs in the journal
    List,
    /// Show where a run stands (running, suspended, finished) as JSON
    Status {
        /// The run's id (from `lockbox journal list`).
        run: RunId,
    },
    /// Print a run's entries
    Dump {
        /// The run's id (from `lockbox journal list`).
        run: RunId,
        /// First entry to print (with --json: the stored lines exactly, JSON with checksums,
        /// instead of a summary)
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
    /// Copy a run's entries before a step or offset into a new run (the source is untouched)
    Fork {
        /// The run to copy (it is left untouched).
        run: RunId,
        /// Cut before this step id (e.g. llm#3): it runs again in the fork
        #[arg(
            long,
            conflicts_with = "from_offset",
            required_unless_present = "from_offset"
        )]
        from_step: Option<StepId>,
        /// Keep entries 0..N
        #[arg(long)]
        from_offset: Option<u64>,
        /// Id of the new run (default: RUN.fork-<unix-ms>)
        #[arg(long)]
        to: Option<RunId>,
    },
}

/// Runs `lockbox journal`; returns the process exit code.
pub fn run(args: &JournalArgs) -> Result<ExitCode, CliError> {
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    match rt.block_on(run_async(args)) {
        // `lockbox journal dump RUN | head`: the reader left, which is not our failure.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(ExitCode::SUCCESS)
        }
        other => other.map_err(CliError::from),
    }
}

async fn run_async(args: &JournalArgs) -> anyhow::Result<ExitCode> {
    let Some(url) = &args.journal else {
        anyhow::bail!(
            "no journal given: add --journal URL (sqlite:PATH, file:DIR or postgres://…) or set LOCKBOX_JOURNAL"
        );
    };
    let storage = url.open_existing().await?;
    let journal = Journal::open(storage);
    let mut out = std::io::stdout().lock();
    match &args.command {
        JournalCommand::List => {
            let runs = journal.list().await?;
            if args.json {
                let ids: Vec<String> = runs.iter().map(ToString::to_string).collect();
                writeln!(out, "{}", serde_json::to_string(&ids)?)?;
            } else {
                for run in runs {
                    writeln!(out, "{run}")?;
                }
            }
        }
        JournalCommand::Status { run } => {
            let status = journal.status(run).await?;
            writeln!(out, "{}", serde_json::to_string_pretty(&status)?)?;
        }
        JournalCommand::Dump { run, offset } if args.json => {
            for raw in journal.raw_entries(run, *offset).await? {
                writeln!(out, "{}", raw.line)?;
            }
        }
        JournalCommand::Dump { run, offset, .. } => {
            for e in journal.entries(run, *offset).await? {
                let detail = match &e.body {
                    EntryBody::Step {
                        step_id,
                        outcome: StepOutcome::Ok(v),
                        ..
                    } => format!("{step_id} ok {v}"),
                    EntryBody::Step {
                        step_id,
                        outcome: StepOutcome::Err(v),
                        ..
                    } => format!("{step_id} err {v}"),
                    EntryBody::Start { version, metadata } => {
                        let version = serde_json::to_string(version)?;
                        format!("version={version} metadata={metadata}")
                    }
                    EntryBody::Suspend {
                        step_id, payload, ..
                    } => format!("{step_id} {payload}"),
                    EntryBody::Resume { step_id, value } => format!("{step_id} {value}"),
                    EntryBody::Complete { value } => value.to_string(),
                    EntryBody::Error { error } => error.to_string(),
                    EntryBody::Cancel { reason } => reason.clone(),
                };
                // Recorded values come from the agent: control characters in them are
                // escaped, so they cannot rewrite earlier lines on a terminal.
                writeln!(
                    out,
                    "{:>6}  session {:<4} {:<8} {}",
                    e.offset,
                    e.session,
                    e.body.kind(),
                    lockbox_policy::name::printable_text(&detail)
                )?;
            }
        }
        JournalCommand::Fork {
            run,
            from_step,
            from_offset,
            to,
        } => {
            let at = match (from_step, from_offset) {
                (Some(step), _) => ForkPoint::Step(step.clone()),
                (None, Some(offset)) => ForkPoint::Offset(*offset),
                (None, None) => anyhow::bail!("give --from-step ID or --from-offset N"),
            };
            let target = journal.fork(run, &at, to.as_ref()).await?;
            if args.json {
                let v = serde_json::json!({ "run": target.to_string() });
                writeln!(out, "{v}")?;
            } else {
                writeln!(out, "{target}")?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
