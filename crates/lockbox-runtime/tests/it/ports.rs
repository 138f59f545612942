//! Exposed ports: a server listening inside the sandbox reached from the host through the
//! agent's connection (`connect_port`) and a host loopback listener, on the real kernel.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{also_as_nobody, sandbox, scratch};
use lockbox_runtime::{ExposeOptions, ProcessCommand, ProcessSpec, Sandbox};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn shell(script: &str) -> ProcessSpec {
    ProcessSpec {
        command: ProcessCommand::Shell {
            script: script.into(),
            session: None,
        },
        cwd: None,
        env: Default::default(),
        pty: None,
        log_bytes: None,
        stdin: false,
    }
}

/// GET / over a fresh connection into the sandbox, retried until the server listens.
async fn get_through(sb: &Sandbox, port: u16) -> String {
    for _ in 0..200 {
        match sb.connect_port(port).await {
            Ok(mut s) => {
                s.write_all(b"GET /hello.txt HTTP/1.0\r\nHost: x\r\n\r\n")
                    .await
                    .unwrap();
                let mut body = String::new();
                s.read_to_string(&mut body).await.unwrap();
                return body;
            }
            Err(e) if e.code().as_str() == "PORT_NOT_LISTENING" => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the server in the sandbox never listened on {port}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_http_server_inside_is_fetched_through_connect_port_and_host_loopback() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_python_http_server_inside_is_fetched_through_connect_port_and_host_loopback"
    ));
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    // Not exposed: refused before anything is tried.
    let err = sb.connect_port(8765).await.unwrap_err();
    assert_eq!(err.code().as_str(), "PORT_NOT_EXPOSED", "{err}");

    sb.start_process(shell(
        "mkdir -p /tmp/site && cd /tmp/site && echo hello-from-inside > hello.txt && \
         exec python3 -m http.server 8765 --bind 127.0.0.1",
    ))
    .await
    .unwrap();
    let info = sb
        .expose_port(
            8765,
            ExposeOptions {
                host_loopback: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(info.port, 8765);
    assert_eq!(info.path, format!("/v1/sandboxes/{}/ports/8765/", sb.id()));
    let host = info.host_address.clone().expect("a host loopback address");
    assert!(host.starts_with("127.0.0.1:"), "{host}");
    assert_eq!(sb.ports(), vec![info.clone()]);

    let reply = get_through(&sb, 8765).await;
    assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
    assert!(reply.ends_with("hello-from-inside\n"), "{reply}");

    // The host loopback port forwards to the same server.
    let mut s = tokio::net::TcpStream::connect(&host).await.unwrap();
    s.write_all(b"GET /hello.txt HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).await.unwrap();
    assert!(reply.ends_with("hello-from-inside\n"), "{reply}");

    // Unexposed: the proxy path refuses and the host listener is gone.
    sb.unexpose_port(8765).unwrap();
    assert!(sb.ports().is_empty());
    let err = sb.connect_port(8765).await.unwrap_err();
    assert_eq!(err.code().as_str(), "PORT_NOT_EXPOSED");
    let mut gone = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(&host).await.is_err() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the host listener outlived the unexpose");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposed_port_nobody_listens_on_is_port_not_listening() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    sb.expose_port(9, ExposeOptions::default()).await.unwrap();
    let err = sb.connect_port(9).await.unwrap_err();
    assert_eq!(err.code().as_str(), "PORT_NOT_LISTENING", "{err}");
    assert!(
        matches!(
            err,
            lockbox_runtime::RuntimeError::PortNotListening { port: 9 }
        ),
        "{err}"
    );
    let err = sb.unexpose_port(10).unwrap_err();
    assert_eq!(err.code().as_str(), "PORT_NOT_EXPOSED", "{err}");
    let err = sb
        .expose_port(0, ExposeOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, lockbox_runtime::RuntimeError::InvalidRequest { field, .. } if field == "port"),
        "{err}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_exposes_at_most_max_exposed_ports() {
    let state = scratch();
    let (rt, sb) = sandbox(state.path()).await;
    for p in 0..lockbox_runtime::MAX_EXPOSED_PORTS {
        sb.expose_port(20000 + p as u16, ExposeOptions::default())
            .await
            .unwrap();
    }
    let err = sb
        .expose_port(30000, ExposeOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.code().as_str(), "LIMIT_REACHED", "{err}");
    // Exposing an exposed port again is not a new one.
    sb.expose_port(20000, ExposeOptions::default())
        .await
        .unwrap();
    rt.shutdown().await;
}
