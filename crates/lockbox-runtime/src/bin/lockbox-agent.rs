//! A minimal host for the in-sandbox agent, so the runtime's tests (and embedders that do
//! not want to dispatch in their own `main`) have an agent executable: set
//! `RuntimeConfig::agent_exe` to it.
#![forbid(unsafe_code)]

fn main() {
    lockbox_confine::agent::main_if_agent();
    eprintln!("lockbox-agent: the agent of lockbox-runtime sandboxes; not for direct use");
    std::process::exit(2);
}
