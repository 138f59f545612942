//! Long-lived sandboxes embedded in this process (`lockbox.Sandbox.open()`): the API of
//! `lockbox serve` (`lockbox_server::app`, over a `lockbox_runtime::Runtime`) called in
//! process, without a socket. The Python half (`lockbox/local.py`) is `lockbox.Client` with
//! this transport, so local and remote sandboxes share every method, type and error.
//!
//! The runtime's in-sandbox agent is the `lockbox-agent` binary `lockbox_cli` embeds, written
//! into the state directory on first use (`lockbox_cli::install_agent`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::body::{Body, BodyDataStream};
use futures_util::StreamExt;
use lockbox_runtime::{Runtime, RuntimeConfig};
use lockbox_server::{ServerConfig, Token};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tower::ServiceExt;

use crate::errors;

/// Default state directories tried (`BASE/0`, `BASE/1`, ...) before giving up.
const SLOTS: u32 = 64;

/// Runs `fut` to completion: on the SDK's runtime, or nested in place when called from one
/// of its threads (a journal step running on it, say), where `block_on` would panic.
fn block<F: std::future::Future>(fut: F) -> F::Output {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => tokio::task::block_in_place(|| handle.block_on(fut)),
        Err(_) => pyo3_async_runtimes::tokio::get_runtime().block_on(fut),
    }
}

fn setup_error(message: String) -> PyErr {
    errors::make(
        errors::Family::Setup,
        lockbox_policy::ErrorCode::SetupFailed,
        message,
        Some(125),
        serde_json::Value::Null,
    )
}

fn runtime_error(e: &lockbox_runtime::RuntimeError) -> PyErr {
    errors::make(
        errors::Family::Setup,
        e.code(),
        e.to_string(),
        Some(125),
        serde_json::Value::Null,
    )
}

/// Whether another runtime holds `STATE/runtime.lock` (the runtime's own lock, probed and
/// released at once; a race with another opener only makes `Runtime::open` fail).
fn held_elsewhere(state_dir: &Path) -> bool {
    let Ok(file) = std::fs::File::open(state_dir.join("runtime.lock")) else {
        return false;
    };
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        == Err(rustix::io::Errno::WOULDBLOCK)
}

async fn open_runtime(state_dir: &Path, agent_exe: Option<&Path>) -> PyResult<Runtime> {
    std::fs::create_dir_all(state_dir).map_err(|e| {
        setup_error(format!(
            "creating the state directory {}: {e}",
            state_dir.display()
        ))
    })?;
    let agent = match agent_exe {
        Some(p) => p.to_owned(),
        None => lockbox_cli::install_agent(state_dir).map_err(|e| {
            setup_error(format!(
                "writing the sandbox agent into {}: {e} (set agent_exe= or LOCKBOX_AGENT to an \
                 executable `lockbox` binary instead)",
                state_dir.join("agent").display()
            ))
        })?,
    };
    let mut config = RuntimeConfig::new(state_dir);
    config.agent_exe = Some(agent);
    // Sandboxes started ahead for `Sandbox.open()` calls with the default policy and no
    // workdir (docs/python.md): none unless asked, since a pool costs running sandboxes.
    if let Some(n) = std::env::var_os("LOCKBOX_POOL") {
        config.pool_size = n
            .to_str()
            .and_then(|n| n.parse().ok())
            .filter(|n| *n <= 64)
            .ok_or_else(|| setup_error(format!("LOCKBOX_POOL={n:?}: a number from 0 to 64")))?;
    }
    Runtime::open(config).map_err(|e| runtime_error(&e))
}

/// The embedded API: one runtime on one state directory, and the router of its routes.
#[pyclass(frozen, module = "lockbox._lockbox")]
pub(crate) struct LocalApi {
    router: axum::Router,
    runtime: Runtime,
    token: Token,
    state_dir: PathBuf,
}

/// Opens a runtime on `state_dir`, or (with `slots`) on the first of `state_dir/0`,
/// `state_dir/1`, ... that no other runtime holds.
#[pyfunction]
#[pyo3(signature = (state_dir, slots, agent_exe=None))]
pub(crate) fn open_local(
    py: Python<'_>,
    state_dir: PathBuf,
    slots: bool,
    agent_exe: Option<PathBuf>,
) -> PyResult<LocalApi> {
    let (runtime, dir) = py.detach(|| {
        block(async {
            if !slots {
                let rt = open_runtime(&state_dir, agent_exe.as_deref()).await?;
                return Ok((rt, state_dir.clone()));
            }
            for n in 0..SLOTS {
                let dir = state_dir.join(n.to_string());
                if held_elsewhere(&dir) {
                    continue;
                }
                return Ok((open_runtime(&dir, agent_exe.as_deref()).await?, dir));
            }
            Err(setup_error(format!(
                "every state directory {}/0..{} is in use by another lockbox runtime; pass \
                 state_dir= to use another one",
                state_dir.display(),
                SLOTS - 1
            )))
        })
    })?;
    let token = Token::generate().map_err(|e| setup_error(e.to_string()))?;
    let router = lockbox_server::app(runtime.clone(), token.clone(), ServerConfig::default());
    Ok(LocalApi {
        router,
        runtime,
        token,
        state_dir: dir,
    })
}

#[pymethods]
impl LocalApi {
    /// The bearer token the router expects.
    #[getter]
    fn token(&self) -> String {
        self.token.secret().to_owned()
    }

    /// The state directory the runtime holds.
    #[getter]
    fn state_dir(&self) -> PathBuf {
        self.state_dir.clone()
    }

    /// One request: `(status, content type, body)`; the body is read (or streamed) with
    /// [`LocalBody`]. The GIL is released while the request runs.
    #[pyo3(signature = (method, uri, headers, body=None))]
    fn request(
        &self,
        py: Python<'_>,
        method: &str,
        uri: &str,
        headers: Vec<(String, String)>,
        body: Option<Vec<u8>>,
    ) -> PyResult<(u16, String, LocalBody)> {
        let mut req = axum::http::Request::builder().method(method).uri(uri);
        for (k, v) in &headers {
            req = req.header(k, v);
        }
        let req = req
            .body(Body::from(body.unwrap_or_default()))
            .map_err(|e| PyValueError::new_err(format!("bad request: {e}")))?;
        let router = self.router.clone();
        let resp = match py.detach(|| block(router.oneshot(req))) {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
        let ctype = resp
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let status = resp.status().as_u16();
        let stream = resp.into_body().into_data_stream();
        Ok((
            status,
            ctype,
            LocalBody {
                stream: Mutex::new(Some(stream)),
            },
        ))
    }

    /// Reads credentials (`NAME=env:VAR` / `NAME=file:PATH`, from this process's
    /// environment and files) into the runtime's registry, which sandboxes' `http_auth`
    /// rules pick from; `upstream_ca`: CA certificates trusted for the real servers.
    /// `ValueError` naming the credential and its source, never its value.
    #[pyo3(signature = (specs, upstream_ca=None))]
    fn define_credentials(&self, specs: Vec<String>, upstream_ca: Option<PathBuf>) -> PyResult<()> {
        let specs = specs
            .iter()
            .map(|s| s.parse::<lockbox_runtime::CredentialSpec>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let read = lockbox_runtime::Credentials::read_all(&specs, |var| std::env::var_os(var))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.runtime.define_credentials(read, upstream_ca);
        Ok(())
    }

    /// Deletes every sandbox of the runtime (each one's `on_exit` applies), waiting for it.
    fn shutdown(&self, py: Python<'_>) {
        let rt = self.runtime.clone();
        py.detach(|| block(rt.shutdown()));
    }
}

/// A response body, read whole or chunk by chunk (server-sent events).
#[pyclass(frozen, module = "lockbox._lockbox")]
pub(crate) struct LocalBody {
    stream: Mutex<Option<BodyDataStream>>,
}

#[pymethods]
impl LocalBody {
    /// The next chunk, or `None` at the end (or once closed). Releases the GIL while waiting.
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let chunk = py.detach(|| {
            let mut guard = self.stream.lock().unwrap_or_else(|p| p.into_inner());
            let stream = guard.as_mut()?;
            match block(stream.next()) {
                Some(Ok(bytes)) => Some(Ok(bytes)),
                Some(Err(e)) => Some(Err(e.to_string())),
                None => {
                    *guard = None;
                    None
                }
            }
        });
        match chunk {
            None => Ok(None),
            Some(Ok(bytes)) => Ok(Some(PyBytes::new(py, &bytes))),
            Some(Err(e)) => Err(setup_error(format!("reading a response: {e}"))),
        }
    }

    /// Every remaining byte.
    fn read_all<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut all = Vec::new();
        while let Some(chunk) = self.next_chunk(py)? {
            all.extend_from_slice(chunk.as_bytes());
        }
        Ok(PyBytes::new(py, &all))
    }

    /// Drops the stream (ends a follow or an exec stream's subscription).
    fn close(&self) {
        *self.stream.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}
