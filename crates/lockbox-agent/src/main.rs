//! `lockbox-agent`: the in-sandbox agent as an executable of its own, for hosts whose own
//! executable cannot re-execute itself as the agent (the runtime's tests and benchmarks,
//! embedders, the Python SDK's extension module); set `RuntimeConfig::agent_exe` to it.
#![forbid(unsafe_code)]

fn main() {
    lockbox_agent::main_if_agent();
    eprintln!("lockbox-agent: the agent of lockbox sandboxes; not for direct use");
    std::process::exit(2);
}
