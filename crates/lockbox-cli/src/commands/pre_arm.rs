//! `lockbox pre-arm`: start, stop or show this user's pre-arm helper (see `prearm`).

use crate::error::{CliError, ExitCode};
use crate::output::outln;
use crate::prearm::helper::{self, Options};
use crate::prearm::wire::{self, Reply, Request};
use clap::{Args, Subcommand};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct PreArmArgs {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Start the helper in the background, unless one runs; returns once it listens.
    Start(StartArgs),
    /// End the helper: no run is handed to it from now on, its spares go, and it exits once
    /// its runs in progress have; returns when it has (or after 10 s, saying so).
    Stop {
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the helper: pid, socket, spares per policy, runs handed over (exit 1: none
    /// runs).
    Status {
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// Spares kept per policy (each is a few processes and 1-2 MB of memory).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub spares: u16,
    /// Policies kept at most; a new one makes the least recently used go.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub policies: u16,
    /// Exit after this long without a run (e.g. 10m, 1h).
    #[arg(long, default_value = "10m", value_parser = crate::cli::parse_dur)]
    pub idle: Duration,
    /// Run in the foreground (for a service manager) instead of in the background.
    #[arg(long)]
    pub foreground: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &PreArmArgs) -> Result<ExitCode, CliError> {
    match &args.action {
        Action::Start(start) => start_helper(start),
        Action::Stop { json } => stop(*json),
        Action::Status { json } => status(*json),
    }
}

fn dir() -> Result<std::path::PathBuf, CliError> {
    crate::prearm::socket_dir().map_err(|e| CliError::new(1, format!("pre-arm directory {e}")))
}

fn start_helper(args: &StartArgs) -> Result<ExitCode, CliError> {
    if !crate::prearm::enabled() {
        return Err(CliError::new(
            1,
            "the pre-arm helper runs from the lockbox executable or the Python wheel's lockbox command only (this program links lockbox without saying how to start its helper)",
        ));
    }
    let opts = Options {
        spares: usize::from(args.spares),
        policies: usize::from(args.policies),
        idle: args.idle,
    };
    if args.foreground {
        return match helper::serve(opts) {
            Ok(true) => Ok(ExitCode::SUCCESS),
            Ok(false) => Err(CliError::new(
                1,
                "a pre-arm helper already runs for this socket",
            )),
            Err(e) => Err(CliError::new(1, format!("pre-arm helper: {e}"))),
        };
    }
    let dir = dir()?;
    if let Some(report) = ask_status(&dir) {
        return print_started(&report, args.json, true);
    }
    let extra: Vec<std::ffi::OsString> = vec![
        "--spares".into(),
        args.spares.to_string().into(),
        "--policies".into(),
        args.policies.to_string().into(),
        "--idle".into(),
        format!("{}s", args.idle.as_secs().max(1)).into(),
    ];
    let mut child = crate::prearm::client::spawn_helper(&dir, &extra)
        .map_err(|e| CliError::new(1, format!("starting the pre-arm helper: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(report) = ask_status(&dir) {
            return print_started(&report, args.json, false);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Another helper took the lock between our look and its start: fine if it answers.
            if let Some(report) = ask_status(&dir) {
                return print_started(&report, args.json, true);
            }
            return Err(CliError::new(
                1,
                format!("the pre-arm helper exited at its start ({status}); run `lockbox pre-arm start --foreground` to see why"),
            ));
        }
        if Instant::now() > deadline {
            return Err(CliError::new(
                1,
                "the pre-arm helper did not listen within 10 s",
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn print_started(
    report: &wire::StatusReport,
    json: bool,
    already: bool,
) -> Result<ExitCode, CliError> {
    if json {
        let value = serde_json::json!({
            "started": !already,
            "pid": report.pid,
            "socket": report.socket,
        });
        outln!("{}", crate::output::json(&value, false));
    } else if already {
        outln!(
            "a pre-arm helper already runs (pid {}, {})",
            report.pid,
            report.socket.display()
        );
    } else {
        outln!(
            "pre-arm helper started (pid {}, {})",
            report.pid,
            report.socket.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One request to the helper at `dir`, and its answer; `None` when no helper answers.
fn ask(dir: &std::path::Path, request: &Request) -> Option<Reply> {
    let conn = crate::prearm::client::dial_helper(dir)?;
    wire::send(conn.as_fd(), request, &[]).ok()?;
    wire::recv::<Reply>(conn.as_fd())
        .ok()?
        .map(|(reply, _)| reply)
}

fn ask_status(dir: &std::path::Path) -> Option<wire::StatusReport> {
    match ask(dir, &Request::Status)? {
        Reply::Status(report) => Some(report),
        _ => None,
    }
}

/// How long `stop` waits for the helper to exit (its runs in progress finish first).
const STOP_WAIT: Duration = Duration::from_secs(10);

fn stop(json: bool) -> Result<ExitCode, CliError> {
    let dir = dir()?;
    let pid = ask_status(&dir).map(|report| report.pid);
    let stopped = matches!(ask(&dir, &Request::Shutdown), Some(Reply::Stopping));
    // Returning only once it is gone: a `start` right after then starts a new helper, where
    // it would otherwise find the old one still answering while it winds down.
    let exited = stopped && pid.is_some_and(|pid| exited_within(pid, STOP_WAIT));
    if json {
        outln!(
            "{}",
            crate::output::json(
                &serde_json::json!({ "stopped": stopped, "exited": exited, "pid": pid }),
                false
            )
        );
    } else if exited {
        outln!("pre-arm helper stopped");
    } else if stopped {
        outln!(
            "pre-arm helper stopping: it ends once its runs in progress have (no new run is handed to it)"
        );
    } else {
        outln!("no pre-arm helper runs");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether process `pid` has ended within `wait` (gone, or a zombie: the helper is no
/// child of ours, and whoever inherited it may reap it late).
fn exited_within(pid: u32, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        let ended = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The state follows the command name's closing parenthesis.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
            Err(_) => true,
        };
        if ended {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn status(json: bool) -> Result<ExitCode, CliError> {
    let dir = dir()?;
    let Some(report) = ask_status(&dir) else {
        if json {
            outln!(
                "{}",
                crate::output::json(&serde_json::json!({ "running": false }), false)
            );
            return Ok(ExitCode::from(1));
        }
        return Err(CliError::new(1, "no pre-arm helper runs").hint("lockbox pre-arm start"));
    };
    if json {
        let mut value = serde_json::to_value(&report).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            map.insert("running".into(), true.into());
        }
        outln!("{}", crate::output::json(&value, false));
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "pre-arm helper: pid {}, {}",
        report.pid,
        report.socket.display()
    );
    outln!(
        "  {} spares per policy, at most {} policies, exits after {} s idle",
        report.spares_per_policy,
        report.max_policies,
        report.idle_exit_s
    );
    outln!(
        "  runs handed over: {}, misses: {}, in progress: {}",
        report.runs_handed_over,
        report.misses,
        report.runs_in_progress
    );
    for p in &report.policies {
        outln!(
            "  {} spare(s), used {} s ago, from {}: {}",
            p.spares,
            p.last_used_s_ago,
            p.cwd.display(),
            p.policy
        );
    }
    Ok(ExitCode::SUCCESS)
}
