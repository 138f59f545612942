//! `PUT /sandboxes/{id}/network` (the SDK's `update_network`) over HTTP: the update
//! replaces the running sandbox's egress rules (a field left out is cleared), a pause and
//! resume keeps them, and a change the sandbox cannot take is a 409 naming why.

use crate::common::{also_as_nobody, out, run};
use crate::control::Plane;
use reqwest::Method;
use serde_json::{json, Value};
use std::net::{IpAddr, TcpListener, UdpSocket};

/// The host's address on its way out (not loopback), if it has one: what a sandbox with
/// E2B's default network (a deny-list, whose loopback is the sandbox's own) reaches the
/// host's servers at.
fn host_address() -> Option<IpAddr> {
    let probe = UdpSocket::bind("0.0.0.0:0").ok()?;
    // No packet is sent: connecting a UDP socket only picks the route and source address.
    probe.connect("192.0.2.1:9").ok()?;
    let ip = probe.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Python connecting to `host:port` in the lockbox sandbox serving E2B sandbox `id` (after
/// a resume, another one): `ok` or the errno.
async fn connect(e2b: &Plane, id: &str, host: &str, port: u16) -> String {
    let serving = match e2b.rt.sandbox(id) {
        Ok(sb) => sb,
        Err(_) => {
            let mut running = e2b.rt.list_sandboxes().unwrap();
            running.retain(|s| s.state == lockbox_runtime::SandboxState::Running);
            let [one] = running.as_slice() else {
                panic!("one sandbox expected: {running:?}");
            };
            e2b.rt.sandbox(&one.id).unwrap()
        }
    };
    let script = format!(
        "python3 -c \"import socket\ntry:\n    socket.create_connection(('{host}', {port}), timeout=5); print('ok')\nexcept OSError as e:\n    print(e.errno)\""
    );
    out(&run(&serving, &script).await).trim().to_owned()
}

async fn update(e2b: &Plane, id: &str, body: Value) -> (u16, Value) {
    e2b.call(Method::PUT, &format!("/sandboxes/{id}/network"), body)
        .await
}

async fn internet(e2b: &Plane, id: &str) -> Value {
    let (status, info) = e2b
        .call(Method::GET, &format!("/sandboxes/{id}"), json!({}))
        .await;
    assert_eq!(status, 200, "{info}");
    info["allowInternetAccess"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_network_applies_restrictions_clears_them_and_survives_a_pause() {
    also_as_nobody("network::update_network_applies_restrictions_clears_them_and_survives_a_pause");
    let Some(host) = host_address() else {
        lockbox_testkit::require!(
            false,
            "the host has no non-loopback address (E2B's default network does not reach the host's loopback)"
        );
        return;
    };
    let listener = TcpListener::bind((host, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let target = host.to_string();
    let state = lockbox_testkit::sandboxes::scratch();
    let e2b = Plane::start(state.path()).await;
    let (_, id) = e2b.create(json!({})).await;
    assert_eq!(connect(&e2b, &id, &target, port).await, "ok");

    let (status, body) = update(&e2b, &id, json!({"denyOut": [target]})).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(connect(&e2b, &id, &target, port).await, "13");

    // Paused and resumed: the sandbox comes back with the network in force.
    assert_eq!(e2b.on(&id, "pause", json!({})).await.0, 204);
    let (status, body) = update(&e2b, &id, json!({})).await;
    assert_eq!(status, 409, "a paused sandbox: {body}");
    let (status, body) = e2b
        .post(&format!("/sandboxes/{id}/connect"), json!({"timeout": 60}))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(connect(&e2b, &id, &target, port).await, "13");

    // `{}` clears every rule: the host is reachable again.
    let (status, body) = update(&e2b, &id, json!({})).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(connect(&e2b, &id, &target, port).await, "ok");

    // No internet: nothing is reachable, and the sandbox's info says so.
    let (status, body) = update(&e2b, &id, json!({"allow_internet_access": false})).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(internet(&e2b, &id).await, json!(false));
    assert_eq!(connect(&e2b, &id, &target, port).await, "13");
    let (status, body) = update(&e2b, &id, json!({})).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(internet(&e2b, &id).await, json!(true));
    assert_eq!(e2b.kill(&id).await, 204);
    e2b.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_network_clears_an_allow_list() {
    also_as_nobody("network::update_network_clears_an_allow_list");
    let Some(host) = host_address() else {
        lockbox_testkit::require!(false, "the host has no non-loopback address");
        return;
    };
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let target = host.to_string();
    let state = lockbox_testkit::sandboxes::scratch();
    let e2b = Plane::start(state.path()).await;
    // Only the host's loopback (an explicit entry reaches the host's, not the sandbox's).
    let (_, id) = e2b
        .create(json!({"network": {"denyOut": ["0.0.0.0/0"], "allowOut": ["127.0.0.1"]}}))
        .await;
    assert_eq!(connect(&e2b, &id, "127.0.0.1", port).await, "ok");
    assert_eq!(connect(&e2b, &id, &target, port).await, "13");

    let (status, body) = update(&e2b, &id, json!({})).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(connect(&e2b, &id, &target, port).await, "ok");
    // E2B's default again: the loopback is the sandbox's own (nothing listens there).
    assert_eq!(connect(&e2b, &id, "127.0.0.1", port).await, "111");

    // Back to an allow-list, by name this time: the sandbox has lockbox's resolver.
    let (status, body) = update(
        &e2b,
        &id,
        json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["example.test"]}),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(connect(&e2b, &id, &target, port).await, "13");
    assert_eq!(e2b.kill(&id).await, 204);
    e2b.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_network_refusals_name_the_field_or_the_reason() {
    also_as_nobody("network::update_network_refusals_name_the_field_or_the_reason");
    let state = lockbox_testkit::sandboxes::scratch();
    let e2b = Plane::start(state.path()).await;
    let (status, body) = update(&e2b, "nonexistent", json!({})).await;
    assert_eq!(status, 404, "{body}");

    let (_, id) = e2b.create(json!({})).await;
    let message = |b: &Value| b["message"].as_str().unwrap_or_default().to_owned();
    let (status, body) = update(
        &e2b,
        &id,
        json!({"allowOut": ["10.0.0.1"], "denyOut": ["10.0.0.2"]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).starts_with("allowOut"), "{body}");
    let (status, body) = update(&e2b, &id, json!({"denyOut": ["not a destination!"]})).await;
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).starts_with("denyOut"), "{body}");
    let (status, body) = update(&e2b, &id, json!({"egressProxy": {"address": "p:1080"}})).await;
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).starts_with("egressProxy"), "{body}");
    let (status, body) = update(&e2b, &id, json!({"dnsServers": ["1.1.1.1"]})).await;
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).starts_with("dnsServers"), "{body}");
    // A sandbox started with a deny-list uses the host's resolver: no allow-list by name.
    let (status, body) = update(
        &e2b,
        &id,
        json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["example.test"]}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(message(&body).contains("resolver"), "{body}");

    // Started without a network: fixed for its life.
    let (_, offline) = e2b.create(json!({"allow_internet_access": false})).await;
    let (status, body) = update(&e2b, &offline, json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert!(message(&body).contains("fixed"), "{body}");
    assert_eq!(internet(&e2b, &offline).await, json!(false));
    e2b.rt.shutdown().await;
}
