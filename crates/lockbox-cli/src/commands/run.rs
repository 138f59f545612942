//! `lockbox run`: one confined command, supervised until it ends.

use super::{print_error, workdir};
use crate::cli::RunArgs;
use crate::error::ExitCode;
use crate::error::{exit, CliError};
use crate::output::{eoutln, outln};
use crate::prearm::wire::{EndStatus, Ended};
use lockbox_confine::{Outcome, Running, Signals, Status, StopReason, Waited};
use lockbox_policy::name::quoted;
use lockbox_policy::{Net, Policy};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Instant;

/// Signals of the supervisor that are passed on to the sandbox.
const FORWARDED: [i32; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

pub fn run(args: &RunArgs) -> Result<ExitCode, CliError> {
    let mut policy = args
        .policy
        .to_policy()
        .map_err(|e| CliError::usage(super::chain(&e)))?;
    if let Some(dir) = &args.workspace.workdir {
        super::check_workdir(dir).map_err(CliError::usage)?;
    }
    if args.command.is_empty() && policy.image.is_none() {
        return Err(CliError::usage(
            "no command: give one after `--` (lockbox run [OPTIONS] -- CMD [ARGS...]); only an --image can supply its own",
        ));
    }
    if policy.image.is_some() && policy.cwd.is_none() {
        // The project is where an agent's command expects to start, as without an image.
        if let Some(dir) = &args.workspace.workdir {
            policy.cwd = std::path::absolute(dir).ok();
        }
    }
    let image = super::image::RunImage::prepare(
        &mut policy,
        &args.command,
        &args.image,
        &args.workspace.state,
    )?;
    let command = image.as_ref().map_or(&args.command, |i| &i.argv);
    let audit = match &args.audit {
        None => None,
        Some(_) if !matches!(policy.net, Net::Allow(_) | Net::Deny(_)) => {
            return Err(CliError::usage(
                "--audit logs the network supervisor's decisions: it needs --net-allow or --net-deny",
            ))
        }
        Some(path) => Some(super::audit::AuditLog::open(path)?),
    };
    let ask = match args.net_ask {
        false => None,
        true if !matches!(policy.net, Net::Allow(_)) => {
            return Err(CliError::usage(
                "--net-ask asks about destinations off the allow-list: it needs --net-allow",
            ))
        }
        true => Some(super::ask::Prompt::open(
            args.net_ask_timeout
                .unwrap_or(lockbox_netsup::DEFAULT_ASK_TIMEOUT),
        )?),
    };
    let interceptor = super::credentials::start(
        args,
        &mut policy,
        audit.as_ref().map(|(_, sink)| sink.clone()),
    )?;
    let mut workspace = workdir::begin(&args.workspace, &mut policy, command)
        .map_err(|e| CliError::new(125, super::chain(&e)))?;
    // A pre-armed start where the run needs nothing of this process's at the start.
    let plain = image.is_none()
        && audit.is_none()
        && ask.is_none()
        && interceptor.is_none()
        && workspace.is_none();
    let handover = match plain {
        true => crate::prearm::client::connect(args, &policy)?,
        false => None,
    };
    // With --net-ask the command is in a session of its own: the terminal's signals reach
    // lockbox alone, which forwards them, and its size changes go to the sandbox's terminal.
    let mut blocked = FORWARDED.to_vec();
    if ask.is_some() {
        blocked.push(libc::SIGWINCH);
    }
    let signals = match Signals::block(&blocked) {
        Ok(s) => s,
        Err(e) => {
            if let Some(w) = workspace {
                w.discard();
            }
            return Err(CliError::new(125, e));
        }
    };
    if let Some(handover) = handover {
        use crate::prearm::client::Handed;
        match handover.run(&policy, command, &signals) {
            Ok(Handed::Direct) => {}
            Ok(Handed::Ran(ended, started_in)) => {
                std::mem::forget(signals);
                explain_outcome(&ended, &policy, command);
                if ended.exit_code != 0 && policy.cwd.is_none() {
                    explain_cwd(Some(&started_in), command);
                }
                return conclude(args, &ended, None);
            }
            Err(e) => {
                std::mem::forget(signals);
                return Err(e);
            }
        }
    }
    let mut started_in = None;
    let (audit_log, sink) = audit.unzip();
    let mut spawn = lockbox_confine::Spawn::command(&policy, command);
    if let Some(image) = &image {
        spawn = spawn.image_root(image.root.clone());
    }
    if let Some(sink) = sink {
        spawn = spawn.audit(sink);
    }
    let mut asking = None;
    if let Some((prompt, desk, stdio)) = ask {
        asking = Some(prompt.start()?);
        spawn = spawn.ask(desk).stdio(stdio).own_session();
    }
    if let Some(interceptor) = interceptor {
        spawn = spawn.interceptor(interceptor);
    }
    // With a branch, its record names the sandbox's init before the sandbox can write into
    // it: `branch list` calls the branch an orphan only once that init is gone (issue 32).
    let started = match &mut workspace {
        None => Ok(spawn.start()),
        Some(w) => match spawn.held() {
            Err(e) => Ok(Err(e)),
            // Dropping `held` on an error kills the waiting sandbox.
            Ok(held) => w.record_sandbox(held.pid()).map(|()| held.go()),
        },
    };
    let started = match started {
        Ok(started) => started,
        Err(e) => {
            if let Some(asking) = asking {
                asking.finish();
            }
            std::mem::forget(signals);
            if let Some(log) = audit_log {
                log.finish();
            }
            if let Some(w) = workspace {
                w.discard();
            }
            return Err(CliError::new(125, super::chain(&e)));
        }
    };
    let result = started.and_then(|mut running| {
        started_in = Some(running.cwd().to_owned());
        let outcome = supervise(&mut running, &policy, &signals, asking.as_ref());
        running.drop_before_exit();
        outcome
    });
    if let Some(asking) = asking {
        asking.finish();
    }
    // The process exits next. Unblocking now would deliver a ^C that raced the command's
    // end and turn its exit status into our own death by SIGINT, so the signals stay blocked.
    std::mem::forget(signals);
    if let Some(log) = audit_log {
        log.finish();
    }
    match result {
        Ok(outcome) => {
            let ended = Ended::of(&outcome);
            explain_outcome(&ended, &policy, command);
            if ended.exit_code != 0 && policy.cwd.is_none() {
                explain_cwd(started_in.as_deref(), command);
            }
            let to_report = args.report.is_some() || args.json;
            let finished = workspace.map(|w| w.finish(&args.workspace, &outcome, to_report));
            conclude(args, &ended, finished)
        }
        Err(e) => {
            if let Some(w) = workspace {
                w.discard();
            }
            let hint = e.hint();
            let error = CliError::new(125, e);
            Err(match hint {
                Some(h) => error.hint(h),
                None => error,
            })
        }
    }
}

fn supervise(
    running: &mut Running,
    policy: &Policy,
    signals: &Signals,
    asking: Option<&super::ask::Asking>,
) -> Result<Outcome, lockbox_confine::SetupError> {
    let deadline = policy.timeout.map(|t| Instant::now() + t);
    loop {
        match running.wait(deadline, Some(signals.as_fd()))? {
            Waited::Exited(outcome) => return Ok(outcome),
            Waited::Deadline => return running.stop(policy.kill_grace, StopReason::Timeout),
            Waited::Extra => {
                while let Some(sig) = signals.next() {
                    if sig.signal == libc::SIGWINCH {
                        if let Some(asking) = asking {
                            asking.resize();
                        }
                        continue;
                    }
                    // Ctrl-C and friends already reached the command through the terminal,
                    // unless it runs in a session of its own (--net-ask).
                    if sig.from_terminal && asking.is_none() {
                        continue;
                    }
                    if sig.signal == libc::SIGTERM {
                        return running.stop(policy.kill_grace, StopReason::Requested);
                    }
                    running.signal(sig.signal)?;
                }
            }
        }
    }
}

/// Writes the report (`--report`, `--json`) with the branch's part from `finished`, and gives
/// the exit code: the branch's, else the outcome's.
fn conclude(
    args: &RunArgs,
    ended: &Ended,
    finished: Option<workdir::Finished>,
) -> Result<ExitCode, CliError> {
    if args.report.is_some() || args.json {
        let mut report = ended.report.clone();
        if let Some(map) = report.as_object_mut() {
            map.insert("pre_armed".into(), ended.pre_armed.into());
            if let Some(serde_json::Value::Object(extra)) = finished.as_ref().map(|f| &f.report) {
                map.extend(extra.clone());
            }
        }
        let to_stdout = args.json || args.report.as_deref() == Some(Path::new("-"));
        if to_stdout {
            outln!("{}", crate::output::json(&report, false));
        }
        if let Some(path) = args.report.as_deref().filter(|p| *p != Path::new("-")) {
            let text = crate::output::json(&report, true) + "\n";
            if let Err(e) = std::fs::write(path, text) {
                print_error(
                    &format!("writing report {}: {}", quoted(path), super::os_error(&e)),
                    None,
                );
            }
        }
    }
    Ok(exit(
        finished
            .and_then(|f| f.exit_code)
            .unwrap_or(ended.exit_code),
    ))
}

fn explain_outcome(outcome: &Ended, policy: &Policy, command: &[std::ffi::OsString]) {
    let Some(program) = command.first().map(quoted) else {
        return;
    };
    if outcome.timed_out {
        if let Some(t) = policy.timeout {
            eoutln!(
                "lockbox: timed out after {}; stopped every process in the sandbox",
                lockbox_policy::HumanDuration(t)
            );
        }
    } else if outcome.oom_killed {
        let limit = policy
            .limits
            .memory
            .map(|m| m.to_string())
            .unwrap_or_default();
        eoutln!("lockbox: the sandbox exceeded its memory limit ({limit}) and was killed");
    } else if let EndStatus::ExecFailed(errno) = outcome.status {
        let why = std::io::Error::from_raw_os_error(errno);
        if errno == libc::ENOENT {
            eoutln!("lockbox: {program}: command not found inside the sandbox");
            eoutln!("hint: grant its directory with -r, or give its full path");
        } else {
            eoutln!("lockbox: {program}: cannot execute: {why}");
        }
    }
}

/// After a failure: if the command did not start in the caller's directory (it is not
/// visible inside) and one of its arguments is a relative path that exists here, say where
/// it started: the path means something else inside.
fn explain_cwd(started_in: Option<&Path>, argv: &[std::ffi::OsString]) {
    let (Some(inside), Ok(here)) = (started_in, std::env::current_dir()) else {
        return;
    };
    let names_a_path_here = argv.iter().any(|a| {
        let p = Path::new(a);
        p.is_relative() && !a.is_empty() && here.join(p).exists()
    });
    if inside != here && names_a_path_here {
        eoutln!(
            "hint: the command ran in {}: the current directory {} is not visible inside; \
             grant it (-r/-w), or choose one with --cwd",
            quoted(inside),
            quoted(&here)
        );
    }
}

/// The JSON report of `--report`/`--json` (fields in README.md and docs/pre-arm.md), without a branch's
/// part.
pub(crate) fn report(outcome: &Outcome) -> serde_json::Value {
    let (signal, code) = match outcome.status {
        Status::Signaled(sig) => (Some(sig), None),
        Status::Exited(code) => (None, Some(code)),
        Status::ExecFailed(_) => (None, None),
    };
    serde_json::json!({
        "exit_code": outcome.exit_code(),
        "command_exit_code": code,
        "signal": signal,
        "timed_out": outcome.timed_out,
        "oom_killed": outcome.oom_killed,
        "wall_time_ms": outcome.wall.as_secs_f64() * 1e3,
        "cpu_time_ms": outcome.cpu.as_secs_f64() * 1e3,
        "peak_memory_bytes": outcome.peak_memory.map(|(b, _)| b),
        "peak_memory_source": outcome.peak_memory.map(|(_, s)| s),
        "enforcement": outcome.enforcement,
        "network": outcome.net,
    })
}
