//! `lockbox mcp`: lockbox's sandboxes as MCP tools over stdio, for an agent that starts it
//! (Claude Desktop, Codex, an MCP SDK). Its own runtime on the state directory, as `lockbox
//! serve` has; when stdin closes (or on SIGTERM/SIGINT) every sandbox it made is deleted,
//! each branch's on_exit applied (kept by default).

use crate::error::{CliError, ExitCode};
use crate::output::eoutln;
use anyhow::Context;
use clap::Args;
use lockbox_runtime::{Runtime, RuntimeConfig};
use lockbox_server::mcp::{serve_stdio, McpServer};
use lockbox_server::scope::Scope;
use std::time::Duration;

const ABOUT: &str = "\
Examples:
  lockbox mcp                                       tools on stdin/stdout, default state dir
  lockbox mcp --allow-workdir ~/src/app             agents may work on ~/src/app (and below)
  lockbox mcp --state-dir ~/.local/state/lockbox-mcp --idle-timeout 30m

Speaks MCP (JSON-RPC 2.0, one message per line) on stdin/stdout; stderr is for messages.
Tools: create_sandbox, list_sandboxes, delete_sandbox, exec, run_code, read_file,
write_file, list_files, changes, diff, commit, abort, snapshot, list_snapshots, fork,
restore, delete_snapshot (each one's schema states its limits and errors).

The model chooses its sandboxes' grants; the operator bounds them. By default an agent gets
no host path beyond the default reads, no writable host path, no workdir and no network but
its sandbox's loopback; --ceiling FILE and the --allow-* flags widen that. A call beyond
the ceiling is the tool error BEYOND_CEILING naming the field. An agent sees only the
sandboxes and snapshots it made.

An MCP client configuration (Claude Desktop's claude_desktop_config.json, and most others):
  {\"mcpServers\": {\"lockbox\": {\"command\": \"lockbox\", \"args\": [\"mcp\"]}}}

The runtime holds the state directory alone: a `lockbox serve` (or another `lockbox mcp`)
on the same one makes this fail; give each its own --state-dir, or have the client use the
server's /mcp route (streamable HTTP, same tools, bearer token). When stdin closes, calls
in flight finish, then every sandbox is deleted: workdir branches are kept unless a
sandbox's on_exit says commit or abort (see them with `lockbox branch list`). See
docs/mcp.md.";

/// Flags of `lockbox mcp`.
#[derive(Debug, Args)]
#[command(after_help = ABOUT)]
pub struct McpArgs {
    #[command(flatten)]
    pub state: crate::cli::StateArgs,
    #[command(flatten)]
    pub ceiling: crate::cli::CeilingArgs,
    /// Running sandboxes at most; creating more is the tool error LIMIT_REACHED.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = parse_positive)]
    pub max_sandboxes: usize,
    /// Delete a sandbox after this long without a tool call on it (a sandbox's own
    /// idle_timeout_ms overrides it) [default: never].
    #[arg(long, value_name = "DURATION", value_parser = super::serve::parse_dur)]
    pub idle_timeout: Option<Duration>,
}

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

/// Runs the stdio server until stdin closes; the exit code.
pub fn run(args: &McpArgs) -> Result<ExitCode, CliError> {
    let ceiling = args.ceiling.resolve()?;
    serve(args, ceiling)?;
    Ok(ExitCode::SUCCESS)
}

fn serve(args: &McpArgs, ceiling: lockbox_policy::Ceiling) -> anyhow::Result<()> {
    let state_dir = args.state.resolve()?;
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    let mut config = RuntimeConfig::new(&state_dir);
    config.agent_exe = crate::agent::for_runtime(&state_dir)?;
    config.max_sandboxes = args.max_sandboxes;
    config.default_idle_timeout = args.idle_timeout;
    // An exec result shows at most this much of each stream; holding more is waste.
    config.max_exec_output = lockbox_server::mcp::MAX_OUTPUT;
    let tokio = super::long_running_runtime()?;
    let result = tokio.block_on(async {
        let stop = stop_signal().context("installing SIGTERM/SIGINT handlers")?;
        let runtime = Runtime::open(config)
            .with_context(|| format!("opening state directory {}", state_dir.display()))?;
        eoutln!("lockbox: mcp: agents' ceiling: {ceiling}");
        let scope = std::sync::Arc::new(Scope::new(ceiling));
        let server = McpServer::new(runtime.clone(), scope, false);
        let served = serve_stdio(server, tokio::io::stdin(), tokio::io::stdout(), stop).await;
        // Whatever ended it, the sandboxes go: nobody is left to use them.
        runtime.shutdown().await;
        served.context("stdio")
    });
    // A read of stdin still blocked in its thread (after a signal) must not hold the exit.
    tokio.shutdown_background();
    result
}

/// Resolves at the first SIGTERM or SIGINT.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eoutln!("lockbox: mcp: stopping: deleting every sandbox");
    })
}
