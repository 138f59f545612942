//! The in-sandbox agent: the lockbox binary re-executed as the command of a long-lived
//! sandbox (`lockbox __lockbox_agent FD`). It serves the runtime (`lockbox-runtime`) over
//! the `SOCK_SEQPACKET` socket `FD`: it starts commands (each under a subreaper shim, with
//! pipes or a PTY made inside the sandbox whose host ends go back with `SCM_RIGHTS`), signals
//! and kills their whole trees, and does file operations resolved inside the sandbox. It is
//! inside every wall of the sandbox (namespaces, Landlock, seccomp, no capabilities), so
//! nothing it does on the runtime's behalf can reach further than the sandboxed code itself.
//!
//! It is single-threaded (which is what makes `fork` without `exec` safe for the shims) and
//! never multiplexes output: the runtime reads the pipes directly.
//!
//! A binary that embeds the runtime calls [`main_if_agent`] first thing in `main`.

mod files;
mod proto;
mod server;
mod shim;
mod tree;
pub mod wire;

pub use proto::{AgentError, Body, EntryStat, Io, Message, Op, Reply, Request, SpawnSpec};

use std::ffi::OsStr;

/// The first argument (`argv[1]`) that makes the binary the agent.
pub const AGENT_ARG: &str = "__lockbox_agent";

/// Where [`crate::Spawn::agent`] makes the agent executable visible inside the sandbox.
pub const AGENT_PATH: &str = crate::plan::HELPER_PATH;

/// If `argv[1]` is [`AGENT_ARG`], runs the agent and exits the process; otherwise returns at
/// once. Call it before anything else in `main` (before threads are started).
pub fn main_if_agent() {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(OsStr::new(AGENT_ARG)) {
        return;
    }
    let fd = args.next().and_then(|s| s.to_str()?.parse::<i32>().ok());
    let code = match fd {
        Some(fd) if fd > 2 && std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists() => {
            server::run(crate::sys::owned(fd))
        }
        _ => {
            eprintln!(
                "lockbox: {AGENT_ARG} is internal: it serves lockbox-runtime inside a sandbox"
            );
            2
        }
    };
    std::process::exit(code);
}
