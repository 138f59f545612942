//! `lockbox serve`: the HTTP API of long-lived sandboxes (lockbox-server) on a listener,
//! until SIGTERM or SIGINT; then every sandbox is deleted (its branch's on-exit applied).

use crate::output::{eoutln, outln};
use anyhow::Context;
use clap::Args;
use lockbox_policy::ByteSize;
use lockbox_runtime::{Runtime, RuntimeConfig};
use lockbox_server::{ServerConfig, Token};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

const ABOUT: &str = "\
On start, one JSON line on stdout: {\"listen\": ADDR, \"token_file\": PATH} (plus \"token\"
with --print-token); the token itself is never printed otherwise. Every route but /healthz
needs `Authorization: Bearer <token>`. The API is described at /openapi.json and in
docs/server.md. SIGTERM or SIGINT stops the server: open streams end, requests in flight get
a few seconds, then every sandbox is deleted (on_exit applied; branches are kept by default).
Sandboxes of a server that died without stopping are listed as `lost` by the next one.";

/// Flags of `lockbox serve`.
#[derive(Debug, Args)]
#[command(after_help = ABOUT)]
pub struct ServeArgs {
    /// Address and port to listen on (port 0: any free port, see the JSON line on stdout).
    /// Plain HTTP: keep it on loopback or put a TLS proxy in front.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub state: crate::cli::StateArgs,
    /// Read the bearer token from FILE [default: <state-dir>/server.token, generated
    /// (32 random bytes, hex, mode 0600) when missing].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Also print the token in the JSON line on stdout.
    #[arg(long)]
    pub print_token: bool,
    /// Running sandboxes at most; creating more answers 429 LIMIT_REACHED.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_sandboxes: usize,
    /// Largest buffered request body (JSON, stdin); more answers 413. File uploads stream
    /// and are not bound by it.
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = parse_size)]
    pub max_body: ByteSize,
    /// Open SSE and WebSocket streams at most; more answers 429 LIMIT_REACHED.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_streams: usize,
    /// Delete a sandbox after this long without a request (a sandbox's own
    /// idle_timeout_ms overrides it) [default: never].
    #[arg(long, value_name = "DURATION", value_parser = parse_dur)]
    pub idle_timeout: Option<Duration>,
    /// Output log kept per process (older bytes are evicted; readers see `truncated`).
    #[arg(long, value_name = "SIZE", default_value = "4M", value_parser = parse_size)]
    pub log_bytes: ByteSize,
    /// Interval of the SSE keepalive comment.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_dur)]
    pub keepalive: Duration,
}

fn parse_size(s: &str) -> Result<ByteSize, String> {
    s.parse()
        .map_err(|e: lockbox_policy::PolicyError| e.to_string())
}

fn parse_dur(s: &str) -> Result<Duration, String> {
    let d = lockbox_policy::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

/// Runs the server; the exit code.
pub fn run(args: &ServeArgs) -> i32 {
    match serve(args) {
        Ok(()) => 0,
        Err(e) => {
            super::print_error(&format!("{e:#}"), None);
            1
        }
    }
}

fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    if args.max_sandboxes == 0 || args.max_streams == 0 {
        anyhow::bail!("--max-sandboxes and --max-streams must be at least 1");
    }
    let state_dir = args.state.resolve()?;
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    let (token, token_file) = match &args.token_file {
        Some(path) => {
            warn_if_readable_by_others(path);
            (Token::from_file(path)?, path.clone())
        }
        None => Token::load_or_create(&state_dir)?,
    };
    let mut runtime_config = RuntimeConfig::new(&state_dir);
    runtime_config.max_sandboxes = args.max_sandboxes;
    runtime_config.default_idle_timeout = args.idle_timeout;
    runtime_config.default_log_bytes = usize::try_from(args.log_bytes.bytes())
        .context("--log-bytes is larger than this machine's address space")?;
    let server_config = ServerConfig {
        keepalive: args.keepalive,
        max_body: usize::try_from(args.max_body.bytes()).unwrap_or(usize::MAX),
        max_streams: args.max_streams,
        ..ServerConfig::default()
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    tokio.block_on(async {
        // Handlers first: a signal that arrives right after the address is printed must
        // stop the server cleanly, not kill it with the default action.
        let stop = stop_signal().context("installing SIGTERM/SIGINT handlers")?;
        let runtime = Runtime::open(runtime_config)
            .await
            .with_context(|| format!("opening state directory {}", state_dir.display()))?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let mut line = serde_json::json!({
            "listen": addr.to_string(),
            "token_file": lockbox_policy::name::Encoded(&token_file),
        });
        if args.print_token {
            line["token"] = token.secret().into();
        }
        outln!("{}", crate::output::json(&line, false));
        eoutln!(
            "lockbox: serving http://{addr} (token in {}; API at /openapi.json)",
            token_file.display()
        );
        if !addr.ip().is_loopback() {
            eoutln!("lockbox: warning: {addr} is not loopback and the API is plain HTTP");
        }
        lockbox_server::serve(listener, runtime, token, server_config, stop)
            .await
            .context("serving")
    })
}

/// Installs SIGTERM and SIGINT handlers; the future resolves at the first of them.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eoutln!("lockbox: stopping: deleting every sandbox");
    })
}

fn warn_if_readable_by_others(path: &std::path::Path) {
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            eoutln!(
                "lockbox: warning: token file {} is accessible to other users (chmod 600 it)",
                path.display()
            );
        }
    }
}
