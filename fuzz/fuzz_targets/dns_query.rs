//! lockbox's resolver for an allow-list sandbox (`lockbox_netsup`'s `dns`): every byte of a
//! query comes from the sandbox, over UDP or TCP. Never panics; every reply it builds is a
//! DNS response that parses and never carries an address of the host's own (loopback, or
//! the host's interface), whatever the host's resolver said.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_policy::NetSpec;
use simple_dns::rdata::RData;
use simple_dns::{Packet, PacketFlag};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

const HOST: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3));

fn names() -> Vec<NetSpec> {
    static NAMES: OnceLock<Vec<NetSpec>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            ["example.org:443", "*.example.net:*", "a.test:80"]
                .iter()
                .filter_map(|s| NetSpec::parse(s).ok())
                .collect()
        })
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let resolved = vec![
        IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        HOST,
        IpAddr::V6(Ipv6Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    ];
    for reply in lockbox_netsup::fuzzing::dns_query(names(), data, resolved, &[HOST]) {
        let packet = Packet::parse(&reply).expect("a reply lockbox built parses");
        assert!(packet.has_flags(PacketFlag::RESPONSE));
        for record in &packet.answers {
            let ip = match &record.rdata {
                RData::A(a) => IpAddr::V4(Ipv4Addr::from(a.address)),
                RData::AAAA(a) => IpAddr::V6(Ipv6Addr::from(a.address)),
                _ => continue,
            };
            assert!(!ip.is_loopback() && ip != HOST, "answered {ip}");
        }
    }
});
