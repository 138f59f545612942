//! The `lockbox` command of the wheel (`lockbox._cli:main`): the CLI crate linked into this
//! extension, so `pip install ./python` alone gives the whole command.

use std::ffi::OsString;

use pyo3::prelude::*;

/// Runs `lockbox` with `argv` and ends the process with its exit status: the command owns the
/// process (signals, stdio) as the binary would, and nothing of Python runs after it.
#[pyfunction]
pub(crate) fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> PyResult<()> {
    let code = py.detach(move || lockbox_cli::main(argv));
    std::process::exit(i32::from(code.0))
}

/// Lets this process use (and start) a pre-arm helper of this extension's build: `launcher`
/// is the command that runs the wheel's `lockbox` (python and its arguments). Plain runs of
/// one command are then handed to it when it answers (docs/pre-arm.md).
#[pyfunction]
pub(crate) fn enable_pre_arm(launcher: Vec<OsString>) {
    lockbox_cli::enable_pre_arm_in_extension(launcher);
}
