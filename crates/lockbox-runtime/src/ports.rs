//! Exposed ports: a server listening inside the sandbox made reachable from the host.
//!
//! The agent connects to the port on the sandbox's own loopback (it runs inside every wall
//! of the sandbox, so it reaches only what sandboxed code could) and hands the connected
//! socket back; the runtime talks through it. Nothing changes in the sandbox's network
//! policy: an exposed port lets connections *in*, nothing out. With
//! [`ExposeOptions::host_loopback`] the runtime also listens on `127.0.0.1:0` on the host
//! and forwards each accepted connection through a fresh sandbox connection.

use lockbox_agent::{Body, Op};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::sandbox::{lock, SandboxInner};
use crate::types::{ExposeOptions, PortInfo};
use crate::RuntimeError;

/// Most ports one sandbox may expose at once: each may hold a host listener and its
/// forwarded connections; a dev server or two per sandbox is the use, not a port scan.
pub const MAX_EXPOSED_PORTS: usize = 16;

/// Most connections one host-loopback listener forwards at once. Each holds two host
/// sockets (the client's and the sandbox's) and a task; beyond this, new connections wait
/// in the listener's backlog until one ends, so a client cannot exhaust the server's
/// descriptors through one exposed port.
pub const MAX_FORWARDED_CONNECTIONS: usize = 256;

/// An exposed port's record; dropping it stops its host listener.
#[derive(Debug)]
pub(crate) struct Exposed {
    info: PortInfo,
    listener: Option<JoinHandle<()>>,
}

impl Drop for Exposed {
    fn drop(&mut self) {
        if let Some(task) = self.listener.take() {
            task.abort();
        }
    }
}

/// The exposed ports of a sandbox, by port.
pub(crate) type Ports = std::sync::Mutex<BTreeMap<u16, Exposed>>;

/// Checks a port number from an API (1-65535).
pub fn check_port(port: u32) -> Result<u16, RuntimeError> {
    match u16::try_from(port) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(RuntimeError::invalid(
            "port",
            format!("{port} is not a TCP port (1-65535)"),
        )),
    }
}

/// The server's proxy path of `port` of sandbox `id`.
pub(crate) fn proxy_path(id: &str, port: u16) -> String {
    format!("/v1/sandboxes/{id}/ports/{port}/")
}

pub(crate) async fn expose(
    inner: &Arc<SandboxInner>,
    port: u16,
    opts: ExposeOptions,
) -> Result<PortInfo, RuntimeError> {
    {
        let ports = lock(&inner.ports);
        if let Some(e) = ports.get(&port) {
            // Exposing again is a no-op unless it asks for a host listener it lacks.
            if !opts.host_loopback || e.info.host_address.is_some() {
                return Ok(e.info.clone());
            }
        } else if ports.len() >= MAX_EXPOSED_PORTS {
            return Err(RuntimeError::LimitReached {
                what: "exposed ports per sandbox".into(),
                limit: MAX_EXPOSED_PORTS,
            });
        }
    }
    let mut info = PortInfo {
        port,
        path: proxy_path(&inner.id, port),
        host_address: None,
    };
    let mut listener = None;
    if opts.host_loopback {
        let socket = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(RuntimeError::os("listening on the host loopback"))?;
        let addr = socket
            .local_addr()
            .map_err(RuntimeError::os("the host listener's address"))?;
        info.host_address = Some(addr.to_string());
        listener = Some(tokio::spawn(forward(socket, Arc::downgrade(inner), port)));
    }
    let mut ports = lock(&inner.ports);
    if !ports.contains_key(&port) && ports.len() >= MAX_EXPOSED_PORTS {
        return Err(RuntimeError::LimitReached {
            what: "exposed ports per sandbox".into(),
            limit: MAX_EXPOSED_PORTS,
        });
    }
    ports.insert(
        port,
        Exposed {
            info: info.clone(),
            listener,
        },
    );
    Ok(info)
}

pub(crate) fn unexpose(inner: &SandboxInner, port: u16) -> Result<(), RuntimeError> {
    match lock(&inner.ports).remove(&port) {
        Some(_) => Ok(()),
        None => Err(RuntimeError::PortNotExposed { port }),
    }
}

pub(crate) fn list(inner: &SandboxInner) -> Vec<PortInfo> {
    lock(&inner.ports)
        .values()
        .map(|e| e.info.clone())
        .collect()
}

/// A new connection to exposed `port` inside the sandbox.
pub(crate) async fn connect(inner: &SandboxInner, port: u16) -> Result<TcpStream, RuntimeError> {
    if !lock(&inner.ports).contains_key(&port) {
        return Err(RuntimeError::PortNotExposed { port });
    }
    let agent = inner.instance().agent.clone();
    let (result, fds) = agent.call(Op::Connect { port }).await?;
    match result {
        Ok(Body::Connected { .. }) => {}
        Ok(other) => return Err(other.unexpected("connected").into()),
        Err(e) if matches!(e.errno, libc::ECONNREFUSED | libc::ETIMEDOUT) => {
            return Err(RuntimeError::PortNotListening { port })
        }
        Err(e) => return Err(RuntimeError::Agent(format!("failed: {}", e.message))),
    }
    let fd = fds
        .into_iter()
        .next()
        .ok_or_else(|| RuntimeError::Agent("sent no socket".into()))?;
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)
        .map_err(RuntimeError::os("a port's connection"))?;
    TcpStream::from_std(std).map_err(RuntimeError::os("a port's connection"))
}

/// Accepts on the host listener and forwards each connection into the sandbox until the
/// port is unexposed (the task is aborted) or the sandbox is gone.
async fn forward(listener: TcpListener, sandbox: Weak<SandboxInner>, port: u16) {
    let slots = Arc::new(Semaphore::new(MAX_FORWARDED_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                // Out of descriptors, or the client left before the accept: not in a loop.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(inner) = sandbox.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let upstream = connect(&inner, port).await;
            drop(inner);
            match upstream {
                Ok(mut upstream) => {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
                Err(e) => tracing::debug!("forwarding to port {port}: {e}"),
            }
        });
    }
}
