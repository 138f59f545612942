//! The network audit log of a sandbox: its supervisor's decisions, of that sandbox only,
//! kept (`audit_log`) and live (`audit`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use futures_util::StreamExt;
use lockbox_policy::{Net, NetSpec, Policy};
use lockbox_runtime::{NetDecision, NetEvent, NetEventKind, Sandbox, SandboxSpec};
use std::time::Duration;

fn allowing(spec: &str) -> SandboxSpec {
    SandboxSpec {
        policy: Policy {
            net: Net::Allow(vec![NetSpec::parse(spec).unwrap()]),
            ..Policy::default()
        },
        ..SandboxSpec::default()
    }
}

/// Waits until `sb` has kept `n` events; returns them.
async fn kept(sb: &Sandbox, n: usize) -> Vec<NetEvent> {
    for _ in 0..200 {
        let events = sb.audit_log();
        if events.len() >= n {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("fewer than {n} events: {:#?}", sb.audit_log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandboxs_audit_log_holds_its_own_network_decisions_only() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "each_sandboxs_audit_log_holds_its_own_network_decisions_only"
    ));
    let state = scratch();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let rt = runtime(state.path()).await;
    let a = rt
        .create_sandbox(allowing(&format!("tcp://127.0.0.1:{port}")))
        .await
        .unwrap();
    let b = rt
        .create_sandbox(allowing("tcp://127.0.0.1:1"))
        .await
        .unwrap();
    let (sa, sb) = (rt.sandbox(&a.id).unwrap(), rt.sandbox(&b.id).unwrap());
    let mut live = sa.audit();
    let script = format!(
        "import socket\n\
         try:\n    socket.create_connection(('192.0.2.1', 80), timeout=5); print('open')\n\
         except OSError as e:\n    print(e.errno)\n\
         socket.create_connection(('127.0.0.1', {port}), timeout=5); print('ok')\n\
         try:\n    socket.getaddrinfo('evil.test', 80, socket.AF_INET); print('found')\n\
         except socket.gaierror:\n    print('nx')\n"
    );
    let r = run(&sa, &format!("python3 -c \"{script}\"")).await;
    assert_eq!(out(&r), "13\nok\nnx\n", "{r:?}");
    let r = run(
        &sb,
        "python3 -c \"import socket\ntry:\n    socket.create_connection(('192.0.2.2', 81), timeout=5)\nexcept OSError as e:\n    print(e.errno)\"",
    )
    .await;
    assert_eq!(out(&r), "13\n", "{r:?}");

    let events = kept(&sa, 3).await;
    let summary: Vec<(NetEventKind, Option<NetDecision>, Option<String>)> = events
        .iter()
        .map(|e| (e.kind, e.decision, e.reason.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                NetEventKind::Connect,
                Some(NetDecision::Denied),
                Some("not in the allow-list".into())
            ),
            (
                NetEventKind::Connect,
                Some(NetDecision::Allowed),
                Some(format!("address rule tcp 127.0.0.1:{port}"))
            ),
            (
                NetEventKind::Dns,
                Some(NetDecision::Denied),
                Some("nxdomain: name not listed".into())
            ),
        ],
        "{events:#?}"
    );
    for e in &events {
        assert_eq!(e.sandbox.as_deref(), Some(a.id.as_str()), "{e:?}");
        assert!(e.pid.unwrap() > 0, "{e:?}");
        assert!(
            e.command.as_deref().unwrap().starts_with("python3"),
            "{e:?}"
        );
    }
    assert_eq!(events[2].name.as_deref(), Some("evil.test"));
    let other = kept(&sb, 1).await;
    assert_eq!(other.len(), 1, "{other:#?}");
    assert_eq!(other[0].sandbox.as_deref(), Some(b.id.as_str()));
    assert_eq!(other[0].port, Some(81));

    // The live stream gives the same events, and none of the other sandbox's.
    for want in &events {
        let got = tokio::time::timeout(Duration::from_secs(10), live.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, want);
    }
    rt.delete_sandbox(&a.id).await.unwrap();
    rt.delete_sandbox(&b.id).await.unwrap();
}
