//! `lockbox pipeline`, `lockbox gather` and `lockbox txn ...`: transactions over sandboxes
//! (`lockbox-txn`). Each stage command is a shell string run by `/bin/sh -c` in the workdir,
//! under the policy given by the shared policy flags and that stage's `--stage-opts`.
//! `--json` / `--report` give the outcome as JSON (schema in docs/transactions.md).

use super::image::{RunImage, RunImageFailure};
use super::print_error;
use crate::cli::PolicyArgs;
use crate::error::CliError;
use crate::error::ExitCode;
use crate::output::json;
use crate::output::{eout, eoutln, out, outln};
use clap::{Args, Parser, Subcommand, ValueEnum};
use lockbox_policy::name::{quoted, Encoded};
use lockbox_policy::{parse_duration, ErrorCode, HumanDuration, Policy};
use lockbox_txn::{
    AbortReason, ConflictPolicy, LockPolicy, PreparedTxn, Selection, StageImageError, StageSpec,
    Txn, TxnId, TxnKind, TxnRecord, TxnSpec,
};
use lockbox_txn::{ListedTxn, TxnError, TxnOutcome};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

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
    /// Policy options for one stage, on top of the shared ones: SEL is a stage number
    /// (pipeline, from 1), a source name or `consumer` (gather); OPTIONS are policy options
    /// as on this command line, e.g. '2:--net host --timeout 30s'. A --profile among them
    /// replaces the shared policy for that stage. Two more options confine the stage's
    /// writes to the workdir: '--writable DIR' (repeatable; relative to the workdir or
    /// absolute inside it; created if missing) lets it write only at or below DIR, and
    /// '--read-only' nowhere (its /tmp stays writable); e.g. 'frontend:--writable web'.
    /// Enforced by a read-only mount of the rest of the view (any workdir, /tmp included),
    /// by Landlock where the kernel has it, and by a check of the stage's writes afterwards.
    /// Repeatable.
    #[arg(long = "stage-opts", value_name = "SEL:OPTIONS", value_parser = parse_stage_opts)]
    pub stage_opts: Vec<(String, Vec<String>)>,
    /// Print the outcome as JSON on stdout (the last stage's stdout becomes its "stdout"
    /// field) instead of the summary on stderr.
    #[arg(long)]
    pub json: bool,
    /// Also write the outcome as JSON to FILE (`-`: stdout, like --json).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// How stages with an --image (shared, or in their --stage-opts) get it.
    #[command(flatten)]
    pub image: crate::cli::RunImageArgs,
}

impl TxnFlags {
    /// The spec of a `kind` transaction, without its stages.
    fn spec(&self, kind: TxnKind, state_dir: &Path) -> TxnSpec {
        let mut spec = TxnSpec::new(kind, state_dir.to_owned(), self.workdir.clone());
        spec.only = self.only.clone();
        spec.exclude = self.exclude.clone();
        if let Some(lock) = self.lock {
            spec.lock = lock;
        }
        spec
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
    /// The first stage's stdin: FILE, or `-` for lockbox's own stdin [default: empty].
    #[arg(long, value_name = "FILE")]
    pub stdin: Option<PathBuf>,
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
    /// Where transaction records live (default: $XDG_STATE_HOME/lockbox, root: /var/lib/lockbox).
    #[arg(long, value_name = "DIR", global = true)]
    pub state_dir: Option<PathBuf>,
    /// Print JSON (list: an array of records; show/commit/abort: one object).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: TxnCommand,
}

#[derive(Debug, Subcommand)]
pub enum TxnCommand {
    /// List transactions (id, state, kind, workdir).
    List,
    /// Show one transaction's record as JSON, with its exit code and what it means.
    Show {
        /// The transaction's id (from `lockbox txn list`).
        id: String,
    },
    /// Commit a prepared transaction (all of it, or the --only/--exclude part).
    Commit {
        /// The prepared transaction's id (printed by `--prepare`).
        id: String,
        /// Commit only changes at or below PATH (relative to the workdir). Repeatable.
        #[arg(long, value_name = "PATH")]
        only: Vec<PathBuf>,
        /// Discard changes at or below PATH. Repeatable.
        #[arg(long, value_name = "PATH")]
        exclude: Vec<PathBuf>,
    },
    /// Abort a prepared transaction.
    Abort {
        /// The prepared transaction's id (printed by `--prepare`).
        id: String,
    },
    /// Finish or roll back interrupted transactions.
    Recover {
        /// Only those of this workdir [default: every workdir with transactions].
        #[arg(long, value_name = "DIR")]
        workdir: Option<PathBuf>,
    },
}

/// The policy options of one `--stage-opts`, parsed like the command line's.
#[derive(Debug, Parser)]
#[command(no_binary_name = true, name = "--stage-opts")]
struct StagePolicyArgs {
    #[command(flatten)]
    policy: PolicyArgs,
    /// Let the stage write only at or below DIR of the workdir. Repeatable.
    #[arg(long, value_name = "DIR")]
    writable: Vec<PathBuf>,
    /// Make the stage's view of the workdir read-only.
    #[arg(long, conflicts_with = "writable")]
    read_only: bool,
}

/// `--writable DIR` as a path relative to the workdir (`given` as on the command line,
/// `canonical` resolved): relative paths must stay inside it, absolute ones lie inside it.
fn writable_in(dir: &Path, given: &Path, canonical: &Path) -> Result<PathBuf, String> {
    let outside = || {
        format!(
            "--writable {}: not inside the workdir {}",
            quoted(dir),
            quoted(given)
        )
    };
    let rel = if dir.is_absolute() {
        dir.strip_prefix(canonical)
            .or_else(|_| dir.strip_prefix(given))
            .map_err(|_| outside())?
    } else {
        dir
    };
    let mut clean = PathBuf::new();
    for c in rel.components() {
        match c {
            std::path::Component::Normal(name) => clean.push(name),
            std::path::Component::CurDir => {}
            _ => return Err(outside()),
        }
    }
    Ok(clean)
}

fn parse_stage_opts(s: &str) -> Result<(String, Vec<String>), String> {
    let (sel, opts) = s
        .split_once(':')
        .ok_or("expected SEL:OPTIONS, e.g. '2:--net host'")?;
    if sel.is_empty() {
        return Err("empty stage selector before ':'".into());
    }
    let words = shlex::split(opts).ok_or("unbalanced quotes in the options")?;
    StagePolicyArgs::try_parse_from(&words).map_err(|e| e.to_string())?;
    Ok((sel.to_owned(), words))
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
fn state_dir(given: &Option<PathBuf>) -> Result<PathBuf, CliError> {
    let args = crate::cli::StateArgs {
        state_dir: given.clone(),
    };
    args.resolve()
        .map_err(|e| CliError::usage(super::chain(&e)))
}

/// Recovers the interrupted transactions of `workdir` before a command touches it, saying
/// on stderr what it did. A failure is a warning: the command goes on (its own commit, if
/// any, recovers again and fails clearly).
pub fn recover_sweep(state_dir: &Path, workdir: &Path) {
    if !workdir.is_dir() {
        // Nothing to recover into; the command itself reports the bad workdir.
        return;
    }
    match lockbox_txn::recover_workdir(state_dir, workdir) {
        Ok(Some(r)) => {
            for id in &r.rolled_forward {
                eoutln!("lockbox: finished transaction {id}, interrupted after its commit point");
            }
            for id in &r.rolled_back {
                eoutln!(
                    "lockbox: rolled back transaction {id}, interrupted before its commit point"
                );
            }
            for id in &r.abandoned {
                eoutln!("lockbox: aborted transaction {id}: its process died while it ran");
            }
            for dir in &r.removed {
                eoutln!(
                    "lockbox: removed {}: a crash left it half-made",
                    quoted(dir)
                );
            }
            for id in &r.left_prepared {
                eoutln!(
                    "lockbox: transaction {id} is still prepared: its commit was interrupted before its commit point"
                );
            }
        }
        // Busy: a live commit holds the lock and recovers the workdir itself.
        Ok(None) => {}
        Err(e) => eoutln!(
            "lockbox: warning: recovering transactions of {}: {e}",
            quoted(workdir)
        ),
    }
}

/// The policy of the stage selected by `sel`: the shared one with its `--stage-opts`.
fn stage_of(flags: &TxnFlags, base: &Policy, sel: &str, cmd: &str) -> Result<StageSpec, CliError> {
    let usage = CliError::usage;
    let workdir = std::fs::canonicalize(&flags.workdir)
        .map_err(|e| usage(format!("workdir {}: {e}", quoted(&flags.workdir))))?;
    let mut p = base.clone();
    let mut writable: Option<Vec<PathBuf>> = None;
    for (_, words) in flags.stage_opts.iter().filter(|(s, _)| s == sel) {
        let args = StagePolicyArgs::try_parse_from(words)
            .map_err(|e| usage(format!("--stage-opts {sel}: {e}")))?;
        p = args
            .policy
            .to_policy_over(Some(&p))
            .map_err(|e| usage(format!("--stage-opts {sel}: {}", super::chain(&e))))?;
        if args.read_only || !args.writable.is_empty() {
            let list = writable.get_or_insert_with(Vec::new);
            for dir in &args.writable {
                let rel = writable_in(dir, &flags.workdir, &workdir)
                    .map_err(|e| usage(format!("--stage-opts {sel}: {e}")))?;
                list.push(rel);
            }
        }
    }
    p.cwd.get_or_insert(workdir);
    let mut stage = StageSpec::sh(p, cmd);
    stage.retries = flags.retries;
    stage.writable = writable;
    Ok(stage)
}

/// Checks that every `--stage-opts` selects an existing stage.
fn check_selectors(flags: &TxnFlags, known: &[String]) -> Result<(), CliError> {
    match flags
        .stage_opts
        .iter()
        .find(|(sel, _)| !known.contains(sel))
    {
        Some((sel, _)) => Err(CliError::usage(format!(
            "--stage-opts {sel}: no such stage (known: {})",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

fn base_policy(policy: &PolicyArgs) -> Result<Policy, CliError> {
    policy
        .to_policy()
        .map_err(|e| CliError::usage(super::chain(&e)))
}

/// What the command did with the transaction, for the JSON's `action`.
#[derive(Debug, Clone, Copy)]
enum Action {
    Committed,
    Aborted,
    DryRun,
    Prepared,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Committed => "committed",
            Action::Aborted => "aborted",
            Action::DryRun => "dry_run",
            Action::Prepared => "prepared",
        }
    }
}

/// How the outcome is printed.
#[derive(Debug, Clone, Copy, Default)]
struct Output<'a> {
    json: bool,
    report: Option<&'a Path>,
}

impl<'a> Output<'a> {
    fn of(flags: &'a TxnFlags) -> Output<'a> {
        // `--report -` is `--json`: the outcome on stdout.
        let dash = flags.report.as_deref() == Some(Path::new("-"));
        Output {
            json: flags.json || dash,
            report: flags.report.as_deref().filter(|_| !dash),
        }
    }

    /// Writes `value` to the report file and, with `--json`, to stdout. A report that
    /// cannot be written turns a success into exit 125.
    fn emit(&self, value: &Value, code: i32) -> i32 {
        if self.json {
            outln!("{}", json(value, true));
        }
        if let Some(path) = self.report {
            let text = json(value, true) + "\n";
            if let Err(e) = std::fs::write(path, text) {
                let why = super::os_error(&e);
                print_error(&format!("writing report {}: {why}", quoted(path)), None);
                return if code == 0 { 125 } else { code };
            }
        }
        code
    }
}

fn error_json(e: &TxnError) -> Value {
    json!({
        "committed": false,
        "exit_code": e.exit_code(),
        "error": { "code": e.code(), "message": e.to_string() },
    })
}

/// The outcome as JSON (schema in docs/transactions.md).
fn outcome_json(outcome: &TxnOutcome, action: Action, with_stdout: bool) -> Value {
    let mut v = serde_json::to_value(outcome).unwrap_or_else(|_| json!({}));
    v["action"] = json!(action.name());
    v["exit_code"] = json!(outcome.exit_code());
    if with_stdout {
        let bytes = outcome.stdout.read_all().unwrap_or_default();
        v["stdout"] = json!(String::from_utf8_lossy(&bytes));
    }
    v
}

/// Prints the outcome — summary and changes on stderr, the last stdout on stdout; or JSON —
/// and returns the exit code.
fn finish(result: Result<TxnOutcome, TxnError>, action: Action, out: Output<'_>) -> i32 {
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            let hint = (e.exit_code() == 4).then(|| "run `lockbox txn recover`".to_owned());
            print_error(&e, hint);
            return out.emit(&error_json(&e), i32::from(e.exit_code()));
        }
    };
    let action = if outcome.abort_reason.is_some() && !matches!(action, Action::DryRun) {
        Action::Aborted
    } else {
        action
    };
    let code = i32::from(outcome.exit_code());
    if out.json {
        return out.emit(&outcome_json(&outcome, action, true), code);
    }
    for (i, s) in outcome.stages.iter().enumerate() {
        eoutln!(
            "lockbox: {}: exit {} in {}",
            lockbox_txn::stage_label(i, &s.name),
            s.exit_code,
            HumanDuration(s.duration)
        );
    }
    for c in &outcome.conflicts {
        eoutln!(
            "lockbox: conflict: {} written by {}",
            quoted(&c.path),
            c.stages.join(", ")
        );
    }
    match (&outcome.abort_reason, action) {
        (Some(_), Action::DryRun) => out!("{}", outcome.changes.to_lines()),
        (Some(_), _) => eoutln!("lockbox: {outcome}"),
        (None, _) => {}
    }
    if !matches!(action, Action::DryRun) {
        eout!("{}", outcome.changes.to_lines());
        if let Ok(bytes) = outcome.stdout.read_all() {
            crate::output::stdout_bytes(&bytes);
        }
    }
    out.emit(&outcome_json(&outcome, action, false), code)
}

fn resolve(prepared: Result<PreparedTxn, TxnError>, flags: &TxnFlags) -> i32 {
    let out = Output::of(flags);
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => return finish(Err(e), Action::Aborted, out),
    };
    if !prepared.all_succeeded() {
        return finish(Ok(prepared.outcome().clone()), Action::Aborted, out);
    }
    if flags.dry_run {
        let aborted = prepared.abort().map(|mut o| {
            o.abort_reason = Some(AbortReason::DryRun);
            o
        });
        return finish(aborted, Action::DryRun, out);
    }
    if flags.prepare {
        let outcome = prepared.outcome().clone();
        let id = match prepared.keep() {
            Ok(id) => id,
            Err(e) => return finish(Err(e), Action::Prepared, out),
        };
        if !out.json {
            outln!("{id}");
        }
        return out.emit(&outcome_json(&outcome, Action::Prepared, false), 0);
    }
    finish(prepared.commit(), Action::Committed, out)
}

pub fn pipeline(args: &PipelineArgs) -> Result<ExitCode, CliError> {
    let flags = &args.txn;
    super::check_workdir(&flags.workdir).map_err(CliError::usage)?;
    let state = state_dir(&flags.state_dir)?;
    recover_sweep(&state, &flags.workdir);
    let known: Vec<String> = (1..=args.stages.len()).map(|i| i.to_string()).collect();
    check_selectors(flags, &known)?;
    let base = base_policy(&args.policy)?;
    let mut spec = flags.spec(TxnKind::Pipeline, &state);
    let stdin = match &args.stdin {
        None => None,
        Some(path) => {
            let read = if path.as_os_str() == "-" {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes).map(|_| bytes)
            } else {
                std::fs::read(path)
            };
            let why = |e: std::io::Error| {
                CliError::usage(format!("--stdin {}: {}", quoted(path), super::os_error(&e)))
            };
            Some(read.map_err(why)?)
        }
    };
    spec.stream = args.stream;
    for (cmd, sel) in args.stages.iter().zip(&known) {
        spec.stages.push(stage_of(flags, &base, sel, cmd)?);
    }
    let (txn, _held) = build(&spec, stdin, flags);
    exit_code(resolve(txn.and_then(|t| t.prepare()), flags))
}

pub fn gather(args: &GatherArgs) -> Result<ExitCode, CliError> {
    let flags = &args.txn;
    super::check_workdir(&flags.workdir).map_err(CliError::usage)?;
    let state = state_dir(&flags.state_dir)?;
    recover_sweep(&state, &flags.workdir);
    let mut known: Vec<String> = args.sources.iter().map(|(n, _)| n.clone()).collect();
    if args.consumer.is_some() {
        known.push("consumer".into());
    }
    check_selectors(flags, &known)?;
    let base = base_policy(&args.policy)?;
    let mut spec = flags.spec(TxnKind::Gather, &state);
    spec.conflict = match args.conflict {
        ConflictArg::Fail => ConflictPolicy::Fail,
        ConflictArg::FirstWriterWins => ConflictPolicy::FirstWriterWins,
        ConflictArg::LastWriterWins => ConflictPolicy::LastWriterWins,
        ConflictArg::Markers => ConflictPolicy::Markers,
    };
    for (name, cmd) in &args.sources {
        let mut s = stage_of(flags, &base, name, cmd)?;
        s.name = name.clone();
        spec.sources.push(s);
    }
    if let Some(cmd) = &args.consumer {
        spec.consumer = Some(stage_of(flags, &base, "consumer", cmd)?);
    }
    let (txn, _held) = build(&spec, None, flags);
    exit_code(resolve(txn.and_then(|t| t.prepare()), flags))
}

/// The transaction of `spec`, with the images its stages name (`--image`, shared or in a
/// stage's `--stage-opts`) found or pulled into the state directory's store as `lockbox run
/// --image` does; each stays held, so that no `lockbox image rm` or prune takes it, until
/// the returned holds are dropped after the transaction.
fn build(
    spec: &TxnSpec,
    stdin: Option<Vec<u8>>,
    flags: &TxnFlags,
) -> (Result<Txn, TxnError>, Vec<RunImage>) {
    let mut held = Vec::new();
    let txn = spec.build_with_images(stdin, &mut |policy, argv| {
        match RunImage::open(policy, argv, &flags.image, &spec.state_dir) {
            Ok(Some(image)) => {
                let resolved = (image.root.clone(), image.argv.clone());
                held.push(image);
                Ok(resolved)
            }
            Ok(None) => Err(StageImageError {
                reason: "no image named".into(),
                code: ErrorCode::TxnUsage,
                exit_code: 2,
            }),
            Err(RunImageFailure::Image(e)) => Err(StageImageError {
                reason: e.to_string(),
                code: e.code(),
                // A bad reference or an unknown image is the caller's; anything else is the
                // transaction's set-up failing.
                exit_code: if e.exit_code() == 2 { 2 } else { 125 },
            }),
            Err(RunImageFailure::Other(e)) => Err(StageImageError {
                reason: e.message,
                code: ErrorCode::TxnUsage,
                exit_code: e.code,
            }),
        }
    });
    (txn, held)
}

/// A transaction command's exit code: 0 is success, anything else was reported with the
/// outcome (summary or JSON) already.
fn exit_code(code: i32) -> Result<ExitCode, CliError> {
    match u8::try_from(code) {
        Ok(0) => Ok(ExitCode::SUCCESS),
        Ok(c) => Err(CliError::reported(c)),
        Err(_) => Err(CliError::reported(1)),
    }
}

fn record_json(r: &TxnRecord) -> Value {
    let (code, meaning) = r.verdict();
    let mut v = serde_json::to_value(r).unwrap_or_else(|_| json!({}));
    v["exit_code"] = json!(code);
    v["meaning"] = json!(meaning);
    v
}

pub fn txn(args: &TxnArgs) -> Result<ExitCode, CliError> {
    let state = state_dir(&args.state_dir)?;
    let out = Output {
        json: args.json,
        report: None,
    };
    let id = |s: &str| TxnId::parse(s);
    let result: Result<i32, TxnError> = match &args.command {
        TxnCommand::List => lockbox_txn::list(&state).map(|all| {
            if args.json {
                let v: Vec<Value> = all
                    .iter()
                    .map(|t| match t {
                        ListedTxn::Ok(r) => record_json(r),
                        ListedTxn::Damaged { dir, error } => json!({
                            "dir": Encoded(dir), "state": "damaged", "error": error.to_string()
                        }),
                    })
                    .collect();
                outln!("{}", json(&v, true));
                return 0;
            }
            for t in all {
                match t {
                    ListedTxn::Ok(r) => outln!(
                        "{}\t{}\t{}\t{}",
                        r.id,
                        r.state.name(),
                        match r.kind {
                            TxnKind::Pipeline => "pipeline",
                            TxnKind::Gather => "gather",
                        },
                        quoted(&r.workdir)
                    ),
                    ListedTxn::Damaged { dir, error } => outln!(
                        "{}\tdamaged\t{error}; remove it with `lockbox txn abort ID`",
                        quoted(&dir)
                    ),
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
                    outln!("{}", json(&record_json(&r), true));
                    Ok(0)
                }
                None => Err(TxnError::NotFound {
                    id,
                    state_dir: state.clone(),
                }),
            }
        }),
        TxnCommand::Commit {
            id: s,
            only,
            exclude,
        } => id(s).and_then(|id| {
            let mut p = PreparedTxn::open(&state, &id)?;
            if let Some(workdir) = p.workdir() {
                recover_sweep(&state, workdir);
            }
            let selection = Selection {
                only: only.clone(),
                exclude: exclude.clone(),
            };
            if !selection.is_all() {
                p.select(&selection)?;
            }
            Ok(finish(p.commit(), Action::Committed, out))
        }),
        TxnCommand::Abort { id: s } => id(s).and_then(|id| match PreparedTxn::open(&state, &id) {
            Ok(p) => Ok(finish(p.abort(), Action::Aborted, out)),
            // No readable record (listed as damaged): removed as it is.
            Err(TxnError::NotFound { .. } | TxnError::CorruptRecord { .. }) => {
                lockbox_txn::remove_damaged(&state, &id)?;
                if args.json {
                    outln!("{}", json(&json!({ "id": id, "action": "removed" }), false));
                } else {
                    eoutln!("lockbox: removed transaction {id}, whose record was unreadable");
                }
                Ok(0)
            }
            Err(e) => Err(e),
        }),
        TxnCommand::Recover { workdir } => {
            if let Some(dir) = workdir {
                super::check_workdir(dir).map_err(CliError::usage)?;
            }
            lockbox_txn::recover(&state, workdir.as_deref()).map(|r| {
                outln!("{}", json(&r, true));
                0
            })
        }
    };
    let code = result.unwrap_or_else(|e| {
        print_error(&e, None);
        if args.json {
            outln!("{}", json(&error_json(&e), false));
        }
        i32::from(e.exit_code())
    });
    exit_code(code)
}
