//! Replacing a running sandbox's network (`Runtime::replace_network`): the next connection
//! follows the new list, the sandbox's info and snapshots (so its forks) carry it, and a
//! change the sandbox cannot take is refused with the network left as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::*;
use lockbox_policy::{ErrorCode, Net, NetSpec, Policy};
use lockbox_runtime::{NetKind, OnExit, SandboxSpec, SnapshotOptions};
use std::net::{IpAddr, TcpListener, UdpSocket};

fn spec_of(net: Net) -> SandboxSpec {
    SandboxSpec {
        policy: Policy {
            net,
            ..Policy::default()
        },
        ..SandboxSpec::default()
    }
}

fn allow(specs: &[String]) -> Net {
    Net::Allow(specs.iter().map(|s| NetSpec::parse(s).unwrap()).collect())
}

/// Python in the sandbox connecting to `host:port`: `ok`, or the errno.
fn connect(host: &str, port: u16) -> String {
    format!(
        "python3 -c \"import socket\ntry:\n    socket.create_connection(('{host}', {port}), timeout=5); print('ok')\nexcept OSError as e:\n    print(e.errno)\""
    )
}

/// The host's address on its way out (not loopback), if it has one: what a deny-list
/// sandbox reaches the host's servers at (its loopback is its own).
fn host_address() -> Option<IpAddr> {
    let probe = UdpSocket::bind("0.0.0.0:0").ok()?;
    // No packet is sent: connecting a UDP socket only picks the route and source address.
    probe.connect("192.0.2.1:9").ok()?;
    let ip = probe.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_allow_list_decides_the_next_connection_and_follows_into_info_and_forks() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "replaced_allow_list_decides_the_next_connection_and_follows_into_info_and_forks"
    ));
    let state = scratch();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = format!("tcp://127.0.0.1:{port}");
    let work = scratch();
    let mut spec = spec_of(allow(std::slice::from_ref(&server)));
    spec.workdir = Some(work.path().to_owned());
    spec.on_exit = OnExit::Abort;
    let (rt, sb) = sandbox_with(state.path(), spec).await;
    let id = sb.id().to_owned();
    assert_eq!(out(&run(&sb, &connect("127.0.0.1", port)).await), "ok\n");

    let info = rt
        .replace_network(&id, allow(&["tcp://127.0.0.1:1".to_owned()]))
        .await
        .unwrap();
    let policy = info.policy.unwrap();
    assert_eq!(policy.net, NetKind::Allow);
    assert_eq!(policy.net_destinations.len(), 1);
    // Unlisted, 127.0.0.1 is the sandbox's own loopback, where nothing listens.
    assert_eq!(
        out(&run(&sb, &connect("127.0.0.1", port)).await),
        "111\n",
        "the host's server is out of reach once the list no longer holds it"
    );

    // A fork (of a snapshot taken now) has the list in force, not the one of the start.
    let (_, forks) = rt
        .fork_sandbox(&id, 1, SnapshotOptions::default())
        .await
        .unwrap();
    let fork = rt.sandbox(&forks[0].id).unwrap();
    assert_eq!(out(&run(&fork, &connect("127.0.0.1", port)).await), "111\n");
    assert_eq!(
        forks[0].policy.as_ref().unwrap().net_destinations[0].to_string(),
        "tcp://127.0.0.1:1"
    );

    // Back on the list.
    rt.replace_network(&id, allow(&[server])).await.unwrap();
    assert_eq!(out(&run(&sb, &connect("127.0.0.1", port)).await), "ok\n");

    // No network: an empty allow-list, recorded so.
    let info = rt.replace_network(&id, Net::None).await.unwrap();
    assert_eq!(info.policy.unwrap().net, NetKind::Allow);
    assert_eq!(out(&run(&sb, &connect("127.0.0.1", port)).await), "111\n");
    rt.delete_sandbox(&forks[0].id).await.unwrap();
    rt.delete_sandbox(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_list_sandbox_refused_after_update_reaches_host_again_after_clearing() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "deny_list_sandbox_refused_after_update_reaches_host_again_after_clearing"
    ));
    let Some(host) = host_address() else {
        lockbox_testkit::require!(
            false,
            "the host has no non-loopback address (a deny-list sandbox's loopback is its own)"
        );
        return;
    };
    let state = scratch();
    let listener = TcpListener::bind((host, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (rt, sb) = sandbox_with(state.path(), spec_of(Net::Deny(Vec::new()))).await;
    let id = sb.id().to_owned();
    let target = host.to_string();
    assert_eq!(out(&run(&sb, &connect(&target, port)).await), "ok\n");

    let denied = NetSpec::parse(&format!("{host}:*")).unwrap();
    rt.replace_network(&id, Net::Deny(vec![denied]))
        .await
        .unwrap();
    assert_eq!(out(&run(&sb, &connect(&target, port)).await), "13\n");

    rt.replace_network(&id, Net::Deny(Vec::new()))
        .await
        .unwrap();
    assert_eq!(out(&run(&sb, &connect(&target, port)).await), "ok\n");

    // An allow-list of addresses is fine; one naming a host needs lockbox's resolver,
    // which a deny-list sandbox (the host's resolv.conf) does not have.
    rt.replace_network(&id, allow(&[format!("tcp://{host}:{port}")]))
        .await
        .unwrap();
    assert_eq!(out(&run(&sb, &connect(&target, port)).await), "ok\n");
    let err = rt
        .replace_network(&id, allow(&["example.org:443".to_owned()]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotSupported, "{err}");
    assert!(err.to_string().contains("resolver"), "{err}");
    // Refused: the list in force stays.
    assert_eq!(out(&run(&sb, &connect(&target, port)).await), "ok\n");
    rt.delete_sandbox(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_started_without_a_list_keeps_its_network() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "sandbox_started_without_a_list_keeps_its_network"
    ));
    let state = scratch();
    let (rt, sb) = sandbox_with(state.path(), spec_of(Net::None)).await;
    let err = rt
        .replace_network(sb.id(), Net::Deny(Vec::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotSupported, "{err}");
    assert!(err.to_string().contains("fixed"), "{err}");
    let info = rt.sandbox_info(sb.id()).unwrap();
    assert_eq!(info.policy.unwrap().net, NetKind::None);
    rt.delete_sandbox(sb.id()).await.unwrap();
}

/// Python in the sandbox asking lockbox's resolver (its `/etc/resolv.conf`'s nameserver)
/// for `name`'s A records itself, past `/etc/hosts`: the reply's rcode and answer count.
fn ask_dns(name: &str) -> String {
    format!(
        "python3 -c \"import socket,struct\n\
         ns=[l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]\n\
         q=struct.pack('>HHHHHH',0x1234,0x0100,1,0,0,0)+b''.join(bytes([len(p)])+p.encode() for p in '{name}'.split('.'))+b'\\\\0'+struct.pack('>HH',1,1)\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(5); s.sendto(q,(ns,53))\n\
         r=s.recv(512); print(r[3]&15, struct.unpack('>H',r[6:8])[0])\""
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_list_sandbox_switched_to_a_deny_list_resolves_every_name_not_denied() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "allow_list_sandbox_switched_to_a_deny_list_resolves_every_name_not_denied"
    ));
    let state = scratch();
    let (rt, sb) = sandbox_with(
        state.path(),
        spec_of(allow(&["tcp://127.0.0.1:1".to_owned()])),
    )
    .await;
    let id = sb.id().to_owned();
    // Unlisted: NXDOMAIN (3), no answer.
    let r = run(&sb, &ask_dns("localhost")).await;
    assert_eq!(out(&r), "3 0\n", "{r:?}");
    // `{}` in E2B's terms: every name is resolved as the host resolves it.
    rt.replace_network(&id, Net::Deny(Vec::new()))
        .await
        .unwrap();
    let r = run(&sb, &ask_dns("localhost")).await;
    assert_eq!(out(&r), "0 1\n", "{r:?}");
    // A denied name is not.
    let denied = NetSpec::parse("localhost:*").unwrap();
    rt.replace_network(&id, Net::Deny(vec![denied]))
        .await
        .unwrap();
    let r = run(&sb, &ask_dns("localhost")).await;
    assert_eq!(out(&r), "3 0\n", "{r:?}");
    rt.delete_sandbox(&id).await.unwrap();
}
