//! `lockbox serve`: the HTTP API of long-lived sandboxes (lockbox-server) on a listener,
//! until SIGTERM or SIGINT; then every sandbox is deleted (its branch's on-exit applied).

use crate::error::CliError;
use crate::error::ExitCode;
use crate::output::{eoutln, outln};
use anyhow::Context;
use clap::Args;
use lockbox_policy::ByteSize;
use lockbox_runtime::{CredentialSource, CredentialSpec, Credentials, Runtime, RuntimeConfig};
use lockbox_server::{ServerConfig, Token};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

const ABOUT: &str = "\
Examples:
  lockbox serve                                  on 127.0.0.1:7070, token in <state-dir>/server.token
  lockbox serve --listen localhost:0 --print-token   any free port; the JSON line says which
  curl -H \"Authorization: Bearer $(cat /var/lib/lockbox/server.token)\" \\
       -H \"Content-Type: application/json\" -d {} http://127.0.0.1:7070/v1/sandboxes

On start, one JSON line on stdout: {\"listen\": ADDR, \"token_file\": PATH, \"ports_listen\":
ADDR, \"ports_domain\": DOMAIN} (plus \"token\" with --print-token); the token itself is never
printed otherwise. Every route but /healthz
needs `Authorization: Bearer <token>`. The API is described at /openapi.json and in
docs/server.md. MCP clients (streamable HTTP) use POST /mcp with the same token: the
sandboxes as tools, see docs/mcp.md (`lockbox mcp` serves them over stdio).

The review console is at http://ADDR/ui: log in with the token, which is exchanged for an
HttpOnly, SameSite=Strict session cookie (kept in memory: a restart logs everyone out); with
it, requests must come from this server's origin, and those that change state need the
X-CSRF-Token header. A sandbox's exposed ports are never served on that origin: a browser
is sent to the port's own, http://{port}-{sandbox}.localhost:PORTS/ (--ports-listen). With
--journal (or LOCKBOX_JOURNAL) the console and GET /v1/journal/runs show that journal's runs.

SIGTERM or SIGINT stops the server: open streams end, requests in flight get a few seconds,
then every sandbox is deleted (on_exit applied; branches are kept by default). Sandboxes of
a server that died without stopping are listed as `lost` by the next one.

What a client or a sandbox can make the server hold is bounded by the flags above: the soft
open-files limit is raised to the hard one at start; at --max-connections a new connection
replaces the oldest half-open one, or is refused at once, as is one beyond
--max-connections-per-peer from one address; a slow request head is closed after
--header-timeout, an idle connection after
--connection-idle-timeout, a stalled body or unread response after --io-timeout; an exec's reply
holds at most --max-exec-output of each stream (stream larger outputs with exec/stream);
process logs share --max-log-memory.";

/// Flags of `lockbox serve`.
#[derive(Debug, Args)]
#[command(after_help = ABOUT)]
pub struct ServeArgs {
    /// HOST:PORT to listen on: an IP address or a host name (`localhost:7070`,
    /// `[::1]:7070`); port 0: any free port, see the JSON line on stdout. Plain HTTP: keep
    /// it on loopback or put a TLS proxy in front.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070", value_parser = parse_listen)]
    pub listen: Listen,
    /// HOST:PORT where exposed ports are served, each on an origin of its own:
    /// http://{port}-{sandbox}.{--ports-domain}:PORT/ (so a sandbox's page never sets cookies
    /// on the console's origin); `off`: none [default: the --listen host, a free port].
    #[arg(long, value_name = "ADDR|off", value_parser = parse_ports_listen)]
    pub ports_listen: Option<PortsListen>,
    /// The domain of the exposed ports' host names, `{port}-{sandbox}.DOMAIN`: it must
    /// reach the ports listener (browsers resolve *.localhost to the loopback), and must not
    /// be the console's, nor share a site with it (see docs/server.md, "Exposed ports").
    #[arg(long, value_name = "DOMAIN", default_value = "localhost", value_parser = lockbox_server::check_ports_domain)]
    pub ports_domain: String,
    #[command(flatten)]
    pub state: crate::cli::StateArgs,
    /// Read the bearer token from FILE [default: <state-dir>/server.token, generated
    /// (32 random bytes, hex, mode 0600) when missing].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The step journal the console and `GET /v1/journal/runs` show: sqlite:PATH, file:DIR
    /// or postgres://USER@HOST:PORT/DB. It must exist already; nothing is created [default:
    /// none].
    #[arg(long, value_name = "URL", env = "LOCKBOX_JOURNAL")]
    pub journal: Option<lockbox_journal::StorageUrl>,
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
    /// Stopped sandboxes kept in `GET /v1/sandboxes` (the most recently created; older
    /// ones are forgotten as sandboxes stop), and as many lost ones (left running by a
    /// server that died; their branches stay in `lockbox branch list`). Running ones are
    /// always listed.
    #[arg(long, value_name = "N", default_value_t = lockbox_runtime::DEFAULT_KEEP_STOPPED)]
    pub keep_stopped: usize,
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
    /// Connections open at once. At the cap, a new connection closes the oldest one that has
    /// not sent a complete request head and takes its place; when every one has started a
    /// request, it is answered 503 SERVER_BUSY (Retry-After: 1) and closed. SSE and
    /// WebSocket streams count too [default: half the open-files limit
    /// (raised to its hard limit at start), at most 16384; the start message says how many]
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Connections open at once from one IP address; one more is answered 503 SERVER_BUSY
    /// (details.what: max_connections_per_peer), so one client's idle or half-open
    /// connections cannot lock the others out. Behind a reverse proxy every client is the
    /// proxy's address: raise it there.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_PEER)]
    pub max_connections_per_peer: usize,
    /// A connection must send its first request head within this long of opening, and a
    /// later head within one to two times this long of its first byte, or it is closed
    /// (slow or half-sent heads).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_dur)]
    pub header_timeout: Duration,
    /// A connection with no request in flight (kept alive between requests) is closed after
    /// this long. Keep it above clients' own idle limit (reqwest, Go: 90 s), so that a
    /// client never sends a request on a connection the server is closing.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_dur)]
    pub connection_idle_timeout: Duration,
    /// A request body that sends nothing, or a response the client does not read, for this
    /// long ends the connection (408 REQUEST_TIMEOUT for the body). Requests being handled
    /// and open streams are never cut for being quiet.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_dur)]
    pub io_timeout: Duration,
    /// Most bytes of stdout, and of stderr, one `exec` returns; the rest is read and
    /// dropped, and the reply says stdout_truncated / stderr_truncated. exec/stream has no
    /// such bound.
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = parse_size)]
    pub max_exec_output: ByteSize,
    /// Sessions of one sandbox at most; more answers 429 LIMIT_REACHED.
    #[arg(long, value_name = "N", default_value_t = lockbox_runtime::DEFAULT_MAX_SESSIONS)]
    pub max_sessions: usize,
    /// Sessions, of all sandboxes together, whose pipes (5 open files each) stay open
    /// between commands: those used last. Another idle session holds none; its next command
    /// asks the sandbox's agent for them again (one round trip) [default: 512, or fewer
    /// when the open-files limit is low: at most a quarter of what the connections leave]
    #[arg(long, value_name = "N")]
    pub held_sessions: Option<usize>,
    /// Processes one sandbox keeps, running or exited; starting one more forgets the
    /// oldest exited one, or answers 429 LIMIT_REACHED when all are running.
    #[arg(long, value_name = "N", default_value_t = lockbox_runtime::DEFAULT_MAX_PROCESSES)]
    pub max_processes: usize,
    /// All process logs together (each process reserves its log size); starting a process
    /// whose log does not fit forgets its sandbox's oldest exited processes, or answers 429.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size)]
    pub max_log_memory: ByteSize,
    /// What all snapshots together may cost on disk: every entry's blocks (a directory at
    /// least 4 KiB) plus 512 bytes per inode. A snapshot beyond it answers 429
    /// LIMIT_REACHED; its copy stops there and nothing of it is kept.
    #[arg(long, value_name = "SIZE", default_value = "10G", value_parser = parse_size)]
    pub max_snapshot_bytes: ByteSize,
    /// Entries (inodes) all snapshots together may hold; beyond, as --max-snapshot-bytes.
    #[arg(long, value_name = "N", default_value_t = lockbox_runtime::DEFAULT_MAX_SNAPSHOT_ENTRIES)]
    pub max_snapshot_entries: u64,
    /// Sandboxes kept started ahead per pooled spec: for the default policy with no
    /// workdir (an empty `POST /v1/sandboxes` body, labels and timeouts aside) always, and
    /// for each other spec after its first creation (policy, network, env, cwd, image and
    /// workdir alike; an E2B template's creations too), within --pool-max-spares. A
    /// creation of a pooled spec takes one and is ready at once (a workdir's, if the
    /// workdir did not change since it was armed; a workdir of more than 4096 entries is
    /// not pooled); the pool refills in the background. 0: no pool.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub pool: u16,
    /// The pool's ready sandboxes of all specs together at most (the default spec's
    /// --pool always fit): a spec newly in use evicts the least recently used one's, and a
    /// spec not created for 5 minutes is dropped. Equal to --pool: only the default spec
    /// is pooled. [default: 4 x --pool, at least 8: room for three more specs]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=512))]
    pub pool_max_spares: Option<u16>,
    /// A secret sandboxes may use but never read: NAME@HOST[,HOST...]=env:VAR (a variable
    /// of this server's environment) or NAME@HOST[,HOST...]=file:PATH, read once at start
    /// and kept in memory, and sent only to the HOSTs named (required: a client cannot
    /// send it to a host of its choosing). A sandbox body names it only through a rule
    /// (`"http_auth": ["HOST bearer NAME"]`); no request can name a variable or a file.
    /// Repeatable. See docs/security.md "Credentials".
    #[arg(long, value_name = "NAME@HOSTS=SOURCE", value_parser = crate::cli::parse_rule::<CredentialSpec>)]
    pub credential: Vec<CredentialSpec>,
    /// Also trust the CA certificates of FILE (PEM) for the real servers of intercepted
    /// hosts (`http_auth`/`http_allow`), besides the host's trust store.
    #[arg(long = "upstream-ca", value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    /// The agents' ceiling: what `/mcp` and scoped tokens (`POST /v1/tokens`) may grant.
    #[command(flatten)]
    pub ceiling: crate::cli::CeilingArgs,
    /// A browser origin (`https://agent.example`) besides loopback ones that may call
    /// `/mcp`; a request with any other `Origin` is 403 FORBIDDEN. Repeatable.
    #[arg(long, value_name = "ORIGIN")]
    pub mcp_allow_origin: Vec<String>,
    /// E2B's sandbox domain: a request with `Host: {port}-{sandboxID}.DOMAIN` goes to that
    /// E2B sandbox (as E2B's own hosts do), besides the `E2b-Sandbox-Id` and
    /// `E2b-Sandbox-Port` headers the SDK sends to `E2B_SANDBOX_URL`. See docs/e2b.md.
    #[arg(long, value_name = "DOMAIN")]
    pub e2b_domain: Option<String>,
    /// A policy profile (TOML, as `lockbox run --profile`) every E2B sandbox starts from:
    /// what it may read or write, limits, environment. E2B's network fields, `envVars` and
    /// working directory apply over it. Default: lockbox's default policy. See docs/e2b.md.
    #[arg(long, value_name = "FILE")]
    pub e2b_profile: Option<std::path::PathBuf>,
}

/// Connections one IP address may hold by default (`--max-connections-per-peer`).
const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 512;

/// Most connections by default, whatever the open-files limit: a waiting connection costs
/// a descriptor, a task and at most 64 KiB of head buffer (issue 32: 10,000 idle ones must
/// not lock a client out).
const MAX_DEFAULT_CONNECTIONS: usize = 16_384;

/// Descriptors kept for sandboxes, sessions and files when the connection cap is derived
/// from the descriptor limit: half of them.
fn default_max_connections(nofile: Option<u64>) -> usize {
    let half = nofile.map_or(usize::MAX, |n| usize::try_from(n / 2).unwrap_or(usize::MAX));
    half.clamp(1, MAX_DEFAULT_CONNECTIONS)
}

/// Descriptors the server keeps for itself besides connections: its own files and the 64
/// refusals it may have open.
const DESCRIPTOR_RESERVE: u64 = 32 + 64;

/// Descriptors a sandbox holds in the server: its agent's socket (measured; see
/// docs/server.md, "Limits"). Its init is parked (no pidfd, no report socket), and its idle
/// sessions hold none beyond `--held-sessions`.
const DESCRIPTORS_PER_SANDBOX: u64 = 1;

/// Descriptors of one session's pipes while they are open in the server.
const DESCRIPTORS_PER_SESSION: u64 = 5;

/// `--held-sessions`, or its default: 512, or a quarter of the descriptors the
/// connections and the server's reserve leave, if fewer.
fn held_sessions(args: &ServeArgs, max_connections: usize, nofile: Option<u64>) -> usize {
    args.held_sessions.unwrap_or_else(|| {
        let room = nofile.map_or(u64::MAX, |limit| {
            limit.saturating_sub(DESCRIPTOR_RESERVE + max_connections as u64)
        });
        let fit = usize::try_from(room / 4 / DESCRIPTORS_PER_SESSION).unwrap_or(usize::MAX);
        fit.min(lockbox_runtime::DEFAULT_MAX_HELD_SESSIONS)
    })
}

/// Descriptors the sessions used last keep open (`held` of them). A session running a
/// command beyond them holds its five for the command's time, on a connection of its own.
fn session_descriptors(held: usize) -> u64 {
    DESCRIPTORS_PER_SESSION * held as u64
}

/// Descriptors the server may need at most: its own, the connections and refusals, the
/// sessions' pipes open at once, and per sandbox 1 and up to 3 per process record
/// (measured; see docs/server.md, "Limits").
fn descriptors_needed(args: &ServeArgs, max_connections: usize, held: usize) -> u64 {
    let per_sandbox = DESCRIPTORS_PER_SANDBOX + 3 * args.max_processes as u64;
    DESCRIPTOR_RESERVE
        + max_connections as u64
        + session_descriptors(held)
        + args.max_sandboxes as u64 * per_sandbox
}

impl ServeArgs {
    /// `--pool-max-spares`, or its default: four times `--pool` (the default spec and three
    /// more), at least 8.
    fn pool_max_spares(&self) -> u16 {
        self.pool_max_spares
            .unwrap_or_else(|| self.pool.saturating_mul(4).max(8))
    }
}

/// The sandboxes the server runs at most: `--max-sandboxes`, or fewer when the open-files
/// limit has room for fewer, besides the pool's spares (`--pool-max-spares`), the
/// connections, the sessions whose pipes stay open and the server's reserve. Beyond, a create
/// answers 429 LIMIT_REACHED instead of the server running out of descriptors (then no
/// connection, `/healthz` and `DELETE` included, could be accepted: issue 34). `None`: no
/// room for even one.
fn max_sandboxes(
    args: &ServeArgs,
    max_connections: usize,
    held: usize,
    nofile: Option<u64>,
) -> Option<usize> {
    let Some(limit) = nofile else {
        return Some(args.max_sandboxes);
    };
    let room = limit
        .saturating_sub(DESCRIPTOR_RESERVE + max_connections as u64 + session_descriptors(held));
    let fit = (room / DESCRIPTORS_PER_SANDBOX).saturating_sub(u64::from(args.pool_max_spares()));
    let fit = usize::try_from(fit).unwrap_or(usize::MAX);
    (fit > 0).then(|| fit.min(args.max_sandboxes))
}

fn warn_if_descriptors_short(
    args: &ServeArgs,
    max_connections: usize,
    held: usize,
    nofile: Option<u64>,
) {
    let needed = descriptors_needed(args, max_connections, held);
    if let Some(limit) = nofile.filter(|&limit| limit < needed) {
        eoutln!(
            "lockbox: warning: with these limits the server may need {needed} open files but \
             may have {limit}: raise the hard limit (ulimit -Hn) or lower --max-sandboxes, \
             --max-sessions or --max-processes"
        );
    }
}

/// Processes (and threads) an idle sandbox holds once its default shell runs: its init, its
/// agent and the shell, which runs in place of its shim (docs/server.md, "Limits").
const PROCESSES_PER_SANDBOX: u64 = 3;

/// How many idle sandboxes the process ids leave room for, at [`PROCESSES_PER_SANDBOX`] each,
/// and what bounds them: `kernel.pid_max` or `kernel.threads-max` less the tasks that run
/// now (`/proc/loadavg`), or for a user other than root its `RLIMIT_NPROC` (which counts the
/// processes of every sandbox, all in user namespaces of this user). `None` when unknown.
fn sandboxes_processes_allow() -> Option<(u64, String)> {
    let number =
        |path: &str| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let running: u64 = loadavg
        .split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()?;
    let (pid_max, threads_max) = (
        number("/proc/sys/kernel/pid_max")?,
        number("/proc/sys/kernel/threads-max")?,
    );
    let mut bound = if pid_max <= threads_max {
        (
            pid_max.saturating_sub(running),
            format!("kernel.pid_max ({pid_max}) with {running} tasks running"),
        )
    } else {
        (
            threads_max.saturating_sub(running),
            format!("kernel.threads-max ({threads_max}) with {running} tasks running"),
        )
    };
    if !rustix::process::geteuid().is_root() {
        let nproc = rustix::process::getrlimit(rustix::process::Resource::Nproc).current;
        if let Some(nproc) = nproc.filter(|&n| n < bound.0) {
            bound = (nproc, format!("RLIMIT_NPROC ({nproc}, ulimit -u)"));
        }
    }
    Some((bound.0 / PROCESSES_PER_SANDBOX, bound.1))
}

fn warn_if_processes_short(max_sandboxes: usize) {
    let Some((fit, bound)) = sandboxes_processes_allow() else {
        return;
    };
    if fit < max_sandboxes as u64 {
        eoutln!(
            "lockbox: warning: {bound} leaves room for about {fit} idle sandboxes \
             ({PROCESSES_PER_SANDBOX} processes each once their shell runs), not {max_sandboxes}: \
             beyond, creates and commands fail to start their processes"
        );
    }
}

/// Raises the soft limit on open descriptors to the hard one (connections, sessions'
/// pipes and sandboxes all hold descriptors); the soft limit now in force (`None`: no
/// limit). Sandboxes inherit it unless their policy sets `max_open_files`.
fn raise_nofile() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            eoutln!("lockbox: warning: cannot raise the open-files limit to its hard limit: {e}");
            return limit.current;
        }
    }
    limit.maximum
}

/// `--listen`: what was given and the addresses it resolved to (tried in order).
#[derive(Debug, Clone)]
pub struct Listen {
    text: String,
    addrs: Vec<SocketAddr>,
}

fn parse_listen(s: &str) -> Result<Listen, String> {
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err("expected HOST:PORT (e.g. 127.0.0.1:7070 or localhost:7070)".into());
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("port {port:?} is not a number from 0 to 65535"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err("expected HOST:PORT: the host is missing".into());
    }
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|e| format!("cannot resolve host {host:?}: {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("host {host:?} has no address"));
    }
    Ok(Listen {
        text: s.to_owned(),
        addrs,
    })
}

/// `--ports-listen`.
#[derive(Debug, Clone)]
pub enum PortsListen {
    /// No ports listener.
    Off,
    /// This address.
    On(Listen),
}

fn parse_ports_listen(s: &str) -> Result<PortsListen, String> {
    if s == "off" {
        return Ok(PortsListen::Off);
    }
    parse_listen(s).map(PortsListen::On)
}

fn parse_size(s: &str) -> Result<ByteSize, String> {
    s.parse()
        .map_err(|e: lockbox_policy::PolicyError| e.to_string())
}

/// A duration flag: `10s`, `30m`...; zero is refused (shared with `lockbox mcp`).
pub(crate) fn parse_dur(s: &str) -> Result<Duration, String> {
    let d = lockbox_policy::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

/// Runs the server; the exit code.
pub fn run(args: &ServeArgs) -> Result<ExitCode, CliError> {
    let credentials = read_credentials(args)?;
    let ceiling = args.ceiling.resolve()?;
    let e2b_policy = read_e2b_profile(args)?;
    serve(args, credentials, ceiling, e2b_policy)?;
    Ok(ExitCode::SUCCESS)
}

/// `--e2b-profile`'s policy, read once now; a missing file or a bad profile is a usage
/// error (exit 2) naming the file and the key.
fn read_e2b_profile(args: &ServeArgs) -> Result<Option<lockbox_policy::Policy>, CliError> {
    let Some(path) = &args.e2b_profile else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("--e2b-profile {}: {e}", path.display())))?;
    lockbox_policy::Policy::from_toml(&text)
        .map(Some)
        .map_err(|e| CliError::usage(format!("--e2b-profile {}: {e}", path.display())))
}

/// The registry of `--credential`s, read once now; usage errors (exit 2) name the
/// credential and its variable or file, never a value.
fn read_credentials(args: &ServeArgs) -> Result<(Credentials, Vec<PathBuf>), CliError> {
    // Bodies come from clients: each credential names where it may go (issue 32).
    if let Some(c) = args.credential.iter().find(|c| c.hosts.is_empty()) {
        return Err(CliError::usage(format!(
            "--credential {}: name the hosts it may be sent to ({}@HOST[,HOST...]=SOURCE)",
            c.name, c.name
        ))
        .hint(format!(
            "e.g. --credential {}@api.openai.com=env:VAR",
            c.name
        )));
    }
    let credentials = Credentials::read_all(&args.credential, |var| std::env::var_os(var))
        .map_err(|e| CliError::usage(format!("--credential: {e}")))?;
    if let Some(ca) = &args.upstream_ca {
        if !ca.is_file() {
            return Err(CliError::usage(format!(
                "--upstream-ca {}: not a readable file",
                ca.display()
            )));
        }
    }
    let mut files = Vec::new();
    for c in &args.credential {
        let CredentialSource::File(path) = &c.source else {
            continue;
        };
        let file = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        // Every sandbox with the default reads would see it (a body's own grants are
        // checked per sandbox, by the runtime).
        if let Some(grant) = lockbox_policy::FsPolicy::default().grant_showing(&file) {
            return Err(CliError::usage(format!(
                "--credential {}: its file {} is readable inside every sandbox (through {grant}); a credential never enters one",
                c.name,
                path.display()
            ))
            .hint("keep the file outside the sandboxes' view (e.g. under /root or /var/lib), or use env:VAR"));
        }
        files.push(file);
    }
    Ok((credentials, files))
}

fn serve(
    args: &ServeArgs,
    (credentials, credential_files): (Credentials, Vec<PathBuf>),
    ceiling: lockbox_policy::Ceiling,
    e2b_policy: Option<lockbox_policy::Policy>,
) -> anyhow::Result<()> {
    if args.max_sandboxes == 0
        || args.max_streams == 0
        || args.max_connections == Some(0)
        || args.max_connections_per_peer == 0
        || args.max_sessions == 0
        || args.max_processes == 0
    {
        anyhow::bail!(
            "--max-sandboxes, --max-streams, --max-connections, --max-connections-per-peer, \
             --max-sessions and --max-processes must be at least 1"
        );
    }
    let nofile = raise_nofile();
    let max_connections = match args.max_connections {
        Some(n) => {
            if nofile.is_some_and(|limit| n as u64 > limit / 2) {
                eoutln!(
                    "lockbox: warning: --max-connections {n} leaves few of the {} open \
                     files this process may have for sandboxes",
                    nofile.unwrap_or_default()
                );
            }
            n
        }
        None => default_max_connections(nofile),
    };
    let held = held_sessions(args, max_connections, nofile);
    let Some(max_sandboxes) = max_sandboxes(args, max_connections, held, nofile) else {
        anyhow::bail!(
            "the open-files limit ({}) leaves no room for a sandbox besides {max_connections} \
             connections, {} pooled spares and the pipes of {} sessions: raise it (ulimit -n) \
             or lower --max-connections, --pool-max-spares or --held-sessions",
            nofile.unwrap_or_default(),
            args.pool_max_spares(),
            held
        );
    };
    if max_sandboxes < args.max_sandboxes {
        eoutln!(
            "lockbox: warning: the open-files limit ({}) has room for {max_sandboxes} sandboxes \
             (a descriptor each: its agent's socket) besides {max_connections} \
             connections, the pool's spares and the pipes of {} sessions (--held-sessions), \
             not --max-sandboxes {}: \
             creates beyond answer 429 LIMIT_REACHED; raise the hard limit (ulimit -Hn) or \
             lower --max-connections or --held-sessions",
            nofile.unwrap_or_default(),
            held,
            args.max_sandboxes
        );
    } else {
        warn_if_descriptors_short(args, max_connections, held, nofile);
    }
    warn_if_processes_short(max_sandboxes);
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
    runtime_config.agent_exe = crate::agent::for_runtime(&state_dir)?;
    runtime_config.max_sandboxes = max_sandboxes;
    runtime_config.default_idle_timeout = args.idle_timeout;
    runtime_config.default_log_bytes = usize::try_from(args.log_bytes.bytes())
        .context("--log-bytes is larger than this machine's address space")?;
    runtime_config.max_exec_output = usize::try_from(args.max_exec_output.bytes())
        .context("--max-exec-output is larger than this machine's address space")?;
    runtime_config.max_log_memory = usize::try_from(args.max_log_memory.bytes())
        .context("--max-log-memory is larger than this machine's address space")?;
    runtime_config.max_sessions = args.max_sessions;
    runtime_config.max_held_sessions = held;
    runtime_config.max_processes = args.max_processes;
    runtime_config.keep_stopped = args.keep_stopped;
    runtime_config.max_snapshot_bytes = Some(args.max_snapshot_bytes.bytes());
    runtime_config.max_snapshot_entries = Some(args.max_snapshot_entries);
    runtime_config.pool_size = usize::from(args.pool);
    runtime_config.pool_max_spares = usize::from(args.pool_max_spares());
    runtime_config.credentials = credentials;
    runtime_config.credential_files = credential_files;
    runtime_config.upstream_ca.clone_from(&args.upstream_ca);
    let server_config = ServerConfig {
        journal: None,
        keepalive: args.keepalive,
        max_body: usize::try_from(args.max_body.bytes()).unwrap_or(usize::MAX),
        max_streams: args.max_streams,
        max_connections,
        max_connections_per_peer: args.max_connections_per_peer,
        header_timeout: args.header_timeout,
        connection_idle_timeout: args.connection_idle_timeout,
        io_timeout: args.io_timeout,
        ceiling,
        mcp_allow_origins: args.mcp_allow_origin.clone(),
        e2b_domain: args
            .e2b_domain
            .as_deref()
            .map(|d| d.trim().trim_matches('.').to_ascii_lowercase())
            .filter(|d| !d.is_empty()),
        e2b_policy,
        ..ServerConfig::default()
    };
    let tokio = super::long_running_runtime()?;
    tokio.block_on(async {
        // Handlers first: a signal that arrives right after the address is printed must
        // stop the server cleanly, not kill it with the default action.
        let stop = stop_signal().context("installing SIGTERM/SIGINT handlers")?;
        let mut server_config = server_config;
        if let Some(url) = &args.journal {
            let storage = url
                .open_existing()
                .await
                .with_context(|| format!("--journal {}", redacted(url)))?;
            server_config.journal = Some(lockbox_server::JournalSource {
                url: redacted(url),
                journal: lockbox_journal::Journal::open(storage),
            });
        }
        let runtime = Runtime::open(runtime_config)
            .with_context(|| format!("opening state directory {}", state_dir.display()))?;
        let listener = tokio::net::TcpListener::bind(&args.listen.addrs[..])
            .await
            .with_context(|| format!("--listen {}: cannot listen", args.listen.text))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let ports = match &args.ports_listen {
            Some(PortsListen::Off) => None,
            Some(PortsListen::On(listen)) => Some(
                tokio::net::TcpListener::bind(&listen.addrs[..])
                    .await
                    .with_context(|| format!("--ports-listen {}: cannot listen", listen.text))?,
            ),
            None => Some(
                tokio::net::TcpListener::bind(SocketAddr::new(addr.ip(), 0))
                    .await
                    .with_context(|| format!("listening for exposed ports on {}", addr.ip()))?,
            ),
        };
        let ports_addr = match &ports {
            Some(l) => Some(l.local_addr().context("reading the ports listener's address")?),
            None => None,
        };
        let mut line = serde_json::json!({
            "listen": addr.to_string(),
            "token_file": lockbox_policy::name::Encoded(&token_file),
        });
        if let Some(ports_addr) = ports_addr {
            line["ports_listen"] = ports_addr.to_string().into();
            line["ports_domain"] = args.ports_domain.as_str().into();
        }
        if args.print_token {
            line["token"] = token.secret().into();
        }
        outln!("{}", crate::output::json(&line, false));
        eoutln!(
            "lockbox: serving http://{addr} (token in {}; API at /openapi.json; MCP at /mcp; console at /ui)",
            token_file.display()
        );
        eoutln!(
            "lockbox: up to {max_sandboxes} sandboxes, {max_connections} connections, {} per address (open-files limit {})",
            args.max_connections_per_peer.min(max_connections),
            nofile.map_or("unlimited".to_owned(), |n| n.to_string())
        );
        if !addr.ip().is_loopback() {
            eoutln!("lockbox: warning: {addr} is not loopback and the API is plain HTTP");
        }
        eoutln!(
            "lockbox: agents' ceiling (/mcp, scoped tokens): {}",
            server_config.ceiling
        );
        if let Some(ports_addr) = ports_addr {
            eoutln!(
                "lockbox: exposed ports at http://{{port}}-{{sandbox}}.{}:{}/",
                args.ports_domain,
                ports_addr.port()
            );
        }
        let ports = match ports {
            Some(listener) => Some(
                lockbox_server::PortsListener::new(listener, &args.ports_domain)
                    .map_err(|e| anyhow::anyhow!("--ports-domain: {e}"))?,
            ),
            None => None,
        };
        lockbox_server::serve_with_ports(listener, ports, runtime, token, server_config, stop)
            .await
            .context("serving")
    })
}

/// The journal's URL without a password (`postgres://user:secret@host` → `postgres://user@host`),
/// for messages and for clients.
fn redacted(url: &lockbox_journal::StorageUrl) -> String {
    let text = url.to_string();
    match (text.find("://"), text.find('@')) {
        (Some(scheme), Some(at)) if scheme < at => {
            let userinfo = &text[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}{}", &text[..scheme + 3], &text[at..]),
                None => text,
            }
        }
        _ => text,
    }
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
