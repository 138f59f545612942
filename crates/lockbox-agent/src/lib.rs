//! The in-sandbox agent of long-lived lockbox sandboxes, and the protocol the runtime
//! (`lockbox-runtime`) speaks to it.
//!
//! The agent is an executable started as the command of a long-lived sandbox
//! (`EXE __lockbox_agent FD`, bound read-only at [`lockbox_confine::AGENT_PATH`]). It serves
//! the runtime over the `SOCK_SEQPACKET` socket `FD`: it starts commands (each under a
//! subreaper shim, with pipes or a PTY made inside the sandbox whose host ends go back with
//! `SCM_RIGHTS`), signals and kills their whole trees, does file operations resolved
//! inside the sandbox, and connects to ports on the sandbox's loopback for exposed ports
//! (the connected socket goes back the same way). It is inside every wall of the sandbox (namespaces, Landlock, seccomp,
//! no capabilities), so nothing it does on the runtime's behalf can reach further than the
//! sandboxed code itself. It is single-threaded (which is what makes `fork` without `exec`
//! safe for the shims) and never multiplexes output: the runtime reads the pipes directly.
//!
//! Brief overview:
//! - the protocol: [`Request`] / [`Op`] from the runtime, [`Message`] / [`Reply`] / [`Body`]
//!   back, [`wire`] for one record with descriptors, versioned by [`PROTOCOL_VERSION`]
//!   (checked by [`check_hello`]); a reply of the wrong kind or version is a
//!   [`ProtocolError`] naming what was expected and what came;
//! - code contexts: [`contexts`], the runners (persistent Python and bash interpreters)
//!   the agent starts with [`Op::ContextStart`] and the typed frames the runtime exchanges
//!   with them over their own pipe pair;
//! - the agent: [`main_if_agent`], and the `lockbox-agent` binary that is nothing else.
//!
//! Which executable runs as the agent: any binary that calls [`main_if_agent`] first thing
//! in `main`. `lockbox` does, so `lockbox serve` re-executes itself and needs no second file
//! installed; this crate's `lockbox-agent` binary is the one for everyone else (the runtime's
//! tests and benchmarks, embedders that set `RuntimeConfig::agent_exe`, and the Python SDK,
//! whose extension module embeds it because the Python interpreter cannot be the agent).
//!
//! The agent has no `unsafe` code (`#![forbid(unsafe_code)]`): the system calls it needs
//! (`fork` without `exec` and the shim's descriptor surgery, `prctl`, `kill`, the seccomp
//! filter stacked on its commands) come from [`lockbox_confine::agent_sys`], a safe API
//! whose soundness does not depend on its caller (descriptors as `OwnedFd`/`BorrowedFd`,
//! `fork` only in a single-threaded process), and `/proc/PID/stat` is read
//! with [`lockbox_confine::proc_stat`].
//!
//! Not here: building and entering the sandbox (`lockbox-confine`), the runtime's end of the
//! socket, sessions and process logs (`lockbox-runtime`).
//!
//! ```
//! use lockbox_agent::{check_hello, Body, PROTOCOL_VERSION};
//! let reply = Body::Hello { pid: 1, cwd: "/work".into(), protocol: PROTOCOL_VERSION };
//! assert_eq!(check_hello(reply).unwrap().cwd, "/work");
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod contexts;
mod error;
mod files;
mod proto;
mod server;
mod shim;
mod tree;
mod watch;
pub mod wire;

pub use crate::error::ProtocolError;
pub use crate::proto::{
    check_hello, AgentError, Body, EntryStat, Hello, Io, Message, Op, Reply, Request, SpawnSpec,
    PROTOCOL_VERSION,
};
pub use crate::proto::{ChangeKind, FileChange, WatchEvent};
pub use crate::watch::push_bounded;

use std::ffi::OsStr;

/// The first argument (`argv[1]`) that makes the binary the agent.
pub const AGENT_ARG: &str = "__lockbox_agent";

/// If `argv[1]` is [`AGENT_ARG`], runs the agent on the socket named by `argv[2]` and exits
/// the process; if it is [`lockbox_confine::INIT_ARG`], runs the sandbox's re-executed init
/// ([`lockbox_confine::main_if_init`]: the agent's executable is also its init's);
/// otherwise returns at once. Call it before anything else in `main` (before threads are
/// started: the agent forks without `exec`).
pub fn main_if_agent() {
    lockbox_confine::main_if_init();
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(OsStr::new(AGENT_ARG)) {
        return;
    }
    let fd = args
        .next()
        .and_then(|s| s.to_str()?.parse::<i32>().ok())
        // Moved to a low number, the original closed: the shims and commands forked from
        // here then get small descriptor tables (`take_inherited_fd`).
        .and_then(lockbox_confine::agent_sys::take_inherited_fd);
    // Its table is a copy of its init's, as large as the server's highest descriptor was
    // at the clone (128 KB at 2,000 sandboxes): made as small as what it holds now. On
    // failure only the memory is lost.
    let _ = lockbox_confine::agent_sys::shrink_descriptor_table();
    let code = match fd {
        Some(fd) => server::run(fd),
        None => {
            eprintln!(
                "lockbox: {AGENT_ARG} is internal: it serves lockbox-runtime inside a sandbox"
            );
            2
        }
    };
    std::process::exit(code);
}
