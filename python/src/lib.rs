//! `lockbox._lockbox`: the native half of the Python SDK. A thin layer over the Rust crates:
//! keyword arguments arrive as the JSON form of [`lockbox_policy::Policy`] (built by the
//! pure-Python half, `python/lockbox/`), results go back as JSON or small classes, and errors
//! become the exceptions of `lockbox.errors` carrying the Rust error's code.
//!
//! - `txn`: transactional pipelines and gathers (`lockbox-txn`), prepared transactions;
//! - `plain`: a pipeline without a transaction (stages streaming into each other);
//! - `process`: one sandbox with pipes, supervised from Python (the function executor);
//! - `journal`: the step journal (`lockbox-journal`), sync and asyncio;
//! - `local`: long-lived sandboxes in this process (`lockbox serve`'s API without a socket);
//! - `cli`: the `lockbox` command itself (the wheel's console script).
//!
//! Every call that runs a sandbox or waits for storage releases the GIL.
//!
//! Not here: the Python API's shape (classes `Sandbox`, `Pipeline`, `Gather`, outcomes):
//! that is `python/lockbox/*.py`.

#![forbid(unsafe_code)]

use pyo3::prelude::*;

/// The Rust heap of this module zeroes freed blocks: a sandbox's init, a fork of this
/// process, inherits no freed copy of a credential header built by the in-process runtime
/// (issue 32, `lockbox_confine::ZeroOnFree`).
#[global_allocator]
static ALLOC: lockbox_confine::ZeroOnFree = lockbox_confine::ZeroOnFree;

mod cli;
mod errors;
mod journal;
mod local;
mod plain;
mod policy;
mod process;
mod txn;

/// The extension module.
#[pymodule]
fn _lockbox(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(cli::enable_pre_arm, m)?)?;
    m.add_function(wrap_pyfunction!(errors::error_codes, m)?)?;
    m.add_function(wrap_pyfunction!(policy::check_policy, m)?)?;
    m.add_function(wrap_pyfunction!(policy::net_spec_error, m)?)?;
    m.add_function(wrap_pyfunction!(txn::run_txn, m)?)?;
    m.add_function(wrap_pyfunction!(txn::prepare_txn, m)?)?;
    m.add_function(wrap_pyfunction!(txn::recover, m)?)?;
    m.add_function(wrap_pyfunction!(txn::default_state_dir, m)?)?;
    m.add_class::<txn::PreparedTxn>()?;
    m.add_function(wrap_pyfunction!(plain::run_plain, m)?)?;
    m.add_function(wrap_pyfunction!(process::spawn, m)?)?;
    m.add_class::<process::Process>()?;
    m.add_function(wrap_pyfunction!(local::open_local, m)?)?;
    m.add_class::<local::LocalApi>()?;
    m.add_class::<local::LocalBody>()?;
    m.add_function(wrap_pyfunction!(policy::duration_ms, m)?)?;
    m.add_function(wrap_pyfunction!(journal::open_journal, m)?)?;
    m.add_class::<journal::Journal>()?;
    m.add_class::<journal::Run>()?;
    Ok(())
}
