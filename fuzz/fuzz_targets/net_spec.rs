//! `--net-allow` / `--net-deny` specs (`lockbox_policy::NetSpec::parse`), which also arrive
//! in TOML profiles and the server's JSON. Parsing never panics; a spec that parses prints
//! back to a spec that parses to the same value; and an address spec's rules match the
//! destination it names (its own first address, on its first port, for its protocol).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_policy::{NetHost, NetSpec, Ports, Proto};
use std::net::SocketAddr;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = NetSpec::parse(text) else {
        return;
    };
    let shown = spec.to_string();
    let back = NetSpec::parse(&shown).expect("a shown spec parses");
    assert_eq!(back, spec, "{text:?} -> {shown:?}");
    if let NetHost::Block(block) = &spec.host {
        let port = match spec.ports {
            Ports::Any => 1,
            Ports::Range(lo, _) => lo,
        };
        let proto = spec.proto.unwrap_or(Proto::Tcp);
        let dest = SocketAddr::new(block.addr, port);
        let rules = spec.rules(&[]);
        assert!(
            rules.iter().any(|r| r.matches(proto, dest)),
            "{text:?}: its rules {rules:?} do not match {dest}"
        );
    }
});
