//! `lockbox pipeline`, `lockbox gather` and `lockbox txn ...`: transactions over sandboxes
//! (`lockbox-txn`). Each stage command is a shell string run by `/bin/sh -c` in the workdir,
//! under the policy given by the shared policy flags.
//!

use super::print_error;
use crate::cli::PolicyArgs;
use clap::{Args, Subcommand, ValueEnum};
use lockbox_policy::parse_duration;
use lockbox_txn::{
    ConflictPolicy, Gather, LockPolicy, Pipeline, PreparedTxn, Selection, Stage, TxnId,
};
use lockbox_txn::{ListedTxn, TxnError, TxnOutcome};
use std::path::PathBuf;

/// Flags shared by `pipeline` and `gather`.
#[derive(Debug, Args)]
pub struct TxnFlags {
    /// The directory the transaction commits to (stages see it at its own path).
    #[arg(long, value_name = "DIR")]
    pub workdir: PathBuf,
    /// Where transaction records live (default: $XDG_STATE_HOME/lockbox, root: /var/lib/lockbox).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Run everything, print the changes (A/M/D/T path), commit nothing.
    #[arg(long, conflicts_with = "prepare")]
    pub dry_run: bool,
    /// Run everything, keep the layers, print the id for `lockbox txn commit|abort ID`.
    #[arg(long)]
    pub prepare: bool,
    /// Hold the workdir lock for the whole transaction: `fail-if-busy`, `wait` or `wait:DURATION`.
    #[arg(long, value_name = "MODE", value_parser = parse_lock)]
    pub lock: Option<LockPolicy>,
    /// Commit only changes at or below PATH (relative to the workdir). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub only: Vec<PathBuf>,
    /// Discard changes at or below PATH (relative to the workdir). Repeatable.
    #[arg(long, value_name = "PATH")]
    pub exclude: Vec<PathBuf>,
    /// Rerun a failed stage up to N more times, each on a fresh layer.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub retries: u32,
}

impl TxnFlags {
    fn selection(&self) -> Selection {
        Selection {
            only: self.only.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct PipelineArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub txn: TxnFlags,
    /// A stage (shell command). Repeatable, in order; stdout feeds the next stage's stdin.
    #[arg(long = "stage", value_name = "CMD", required = true)]
    pub stages: Vec<String>,
    /// Run the stages at once with live pipes; each sees the pre-transaction workdir and
    /// their changes merge like gather sources (conflicts fail).
    #[arg(long)]
    pub stream: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ConflictArg {
    Fail,
    FirstWriterWins,
    LastWriterWins,
    Markers,
}

#[derive(Debug, Args)]
pub struct GatherArgs {
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub txn: TxnFlags,
    /// A source, NAME=CMD. Repeatable; sources run in parallel on snapshots of the workdir.
    #[arg(long = "source", value_name = "NAME=CMD", required = true, value_parser = parse_source)]
    pub sources: Vec<(String, String)>,
    /// Runs on the merged view; reads each source's stdout from $LOCKBOX_INPUTS/NAME.
    #[arg(long, value_name = "CMD")]
    pub consumer: Option<String>,
    /// What to do when sources change the same path.
    #[arg(long, value_enum, default_value = "fail")]
    pub conflict: ConflictArg,
}

#[derive(Debug, Args)]
pub struct TxnArgs {
    /// Where transaction records live.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: TxnCommand,
}

#[derive(Debug, Subcommand)]
pub enum TxnCommand {
    /// List transactions (id, state, kind, workdir).
    List,
    /// Show one transaction's record as JSON.
    Show { id: String },
    /// Commit a prepared transaction.
    Commit { id: String },
    /// Abort a prepared transaction.
    Abort { id: String },
    /// Finish or roll back interrupted transactions.
    Recover {
        #[arg(long, value_name = "DIR")]
        workdir: Option<PathBuf>,
    },
}

fn parse_lock(s: &str) -> Result<LockPolicy, String> {
    match s {
        "fail-if-busy" => Ok(LockPolicy::FailIfBusy),
        "wait" => Ok(LockPolicy::Wait(None)),
        _ => match s.strip_prefix("wait:") {
            Some(d) => parse_duration(d)
                .map(|d| LockPolicy::Wait(Some(d)))
                .map_err(|e| e.to_string()),
            None => Err("expected fail-if-busy, wait or wait:DURATION".into()),
        },
    }
}

fn parse_source(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(n, c)| (n.to_owned(), c.to_owned()))
        .ok_or_else(|| "expected NAME=CMD".into())
}

/// The state directory, as every lockbox command resolves it (see `StateArgs`).
fn state_dir(given: &Option<PathBuf>) -> PathBuf {
    let args = crate::cli::StateArgs {
        state_dir: given.clone(),
    };
    args.resolve()
        .unwrap_or_else(|_| std::env::temp_dir().join("lockbox-state"))
}

fn stage_of(flags: &TxnFlags, policy: &PolicyArgs, cmd: &str) -> Result<Stage, i32> {
    let workdir = &flags.workdir;
    let mut p = policy.to_policy().map_err(|e| {
        print_error(&format!("{e:#}"), None);
        2
    })?;
    let workdir = std::fs::canonicalize(workdir).map_err(|e| {
        print_error(&format!("workdir {}: {e}", workdir.display()), None);
        2
    })?;
    p.cwd.get_or_insert(workdir);
    Ok(Stage::sh(p, cmd).retries(flags.retries))
}

/// Prints the outcome (stage summary and changes on stderr, the last stdout on stdout) and
/// returns the exit code.
fn finish(result: Result<TxnOutcome, TxnError>) -> i32 {
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            let hint = (e.exit_code() == 4).then(|| "run `lockbox txn recover`".to_owned());
            print_error(&e, hint);
            return i32::from(e.exit_code());
        }
    };
    for s in &outcome.stages {
        eprintln!(
            "lockbox: {}: exit {} in {:?}",
            s.name, s.exit_code, s.duration
        );
    }
    for c in &outcome.conflicts {
        eprintln!(
            "lockbox: conflict: {} written by {}",
            c.path.display(),
            c.stages.join(", ")
        );
    }
    if let Some(reason) = &outcome.abort_reason {
        eprintln!("lockbox: not committed: {reason:?}");
    }
    eprint!("{}", outcome.changes.to_lines());
    if let Ok(bytes) = outcome.stdout.read_all() {
        use std::io::Write;
        let _ = std::io::stdout().write_all(&bytes);
    }
    i32::from(outcome.exit_code())
}

fn resolve(prepared: Result<PreparedTxn, TxnError>, flags: &TxnFlags) -> i32 {
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => return finish(Err(e)),
    };
    if !prepared.all_succeeded() {
        return finish(Ok(prepared.outcome().clone()));
    }
    if flags.dry_run {
        print!("{}", prepared.outcome().changes.to_lines());
        return prepared.abort().map_or_else(|e| finish(Err(e)), |_| 0);
    }
    if flags.prepare {
        let id = prepared.keep();
        println!("{id}");
        return 0;
    }
    finish(prepared.commit())
}

pub fn pipeline(args: &PipelineArgs) -> i32 {
    let flags = &args.txn;
    let mut p =
        Pipeline::new(&state_dir(&flags.state_dir), &flags.workdir).select(flags.selection());
    if args.stream {
        p = p.stream(ConflictPolicy::Fail);
    }
    for cmd in &args.stages {
        match stage_of(flags, &args.policy, cmd) {
            Ok(s) => p = p.stage(s),
            Err(code) => return code,
        }
    }
    if let Some(lock) = flags.lock {
        p = p.lock(lock);
    }
    resolve(p.prepare(), flags)
}

pub fn gather(args: &GatherArgs) -> i32 {
    let flags = &args.txn;
    let policy = match args.conflict {
        ConflictArg::Fail => ConflictPolicy::Fail,
        ConflictArg::FirstWriterWins => ConflictPolicy::FirstWriterWins,
        ConflictArg::LastWriterWins => ConflictPolicy::LastWriterWins,
        ConflictArg::Markers => ConflictPolicy::Markers,
    };
    let mut g = Gather::new(&state_dir(&flags.state_dir), &flags.workdir)
        .conflict_policy(policy)
        .select(flags.selection());
    for (name, cmd) in &args.sources {
        match stage_of(flags, &args.policy, cmd) {
            Ok(s) => g = g.source(name, s),
            Err(code) => return code,
        }
    }
    if let Some(cmd) = &args.consumer {
        match stage_of(flags, &args.policy, cmd) {
            Ok(s) => g = g.consumer(s),
            Err(code) => return code,
        }
    }
    if let Some(lock) = flags.lock {
        g = g.lock(lock);
    }
    resolve(g.prepare(), flags)
}

pub fn txn(args: &TxnArgs) -> i32 {
    let state = state_dir(&args.state_dir);
    let id = |s: &str| TxnId::parse(s);
    let result: Result<i32, TxnError> = match &args.command {
        TxnCommand::List => lockbox_txn::list(&state).map(|all| {
            for t in all {
                match t {
                    ListedTxn::Ok(r) => println!(
                        "{}\t{}\t{:?}\t{}",
                        r.id,
                        r.state.name(),
                        r.kind,
                        r.workdir.display()
                    ),
                    ListedTxn::Damaged { dir, error } => {
                        println!("{}\tdamaged\t{error}", dir.display())
                    }
                }
            }
            0
        }),
        TxnCommand::Show { id: s } => id(s).and_then(|id| {
            let all = lockbox_txn::list(&state)?;
            let rec = all.into_iter().find_map(|t| match t {
                ListedTxn::Ok(r) if r.id == id => Some(r),
                _ => None,
            });
            match rec {
                Some(r) => {
                    println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                    Ok(0)
                }
                None => Err(TxnError::NotFound {
                    id,
                    state_dir: state.clone(),
                }),
            }
        }),
        TxnCommand::Commit { id: s } => id(s)
            .and_then(|id| PreparedTxn::open(&state, &id))
            .map(|p| finish(p.commit())),
        TxnCommand::Abort { id: s } => id(s)
            .and_then(|id| PreparedTxn::open(&state, &id))
            .map(|p| finish(p.abort())),
        TxnCommand::Recover { workdir } => {
            lockbox_txn::recover(&state, workdir.as_deref()).map(|r| {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                0
            })
        }
    };
    result.unwrap_or_else(|e| {
        print_error(&e, None);
        i32::from(e.exit_code())
    })
}
