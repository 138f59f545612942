//! The agent of long-lived sandboxes opened from Python (`lockbox.Sandbox.open()`).
//!
//! `lockbox-runtime` runs its in-sandbox agent by executing a host binary that dispatches to
//! [`lockbox_confine::agent::main_if_agent`] first thing. Embedded in Python, the current
//! executable is the Python interpreter, so the extension module (`lockbox._lockbox`) carries
//! this small binary (built by `python/build.rs`) and writes it to the state directory.
#![forbid(unsafe_code)]

fn main() {
    lockbox_confine::agent::main_if_agent();
    eprintln!(
        "lockbox-sdk-agent: the in-sandbox agent of lockbox's Python SDK; not for direct use"
    );
    std::process::exit(2);
}
