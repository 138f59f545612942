//! The network supervisor's decoder of the address a sandboxed `connect`/`sendto`/`sendmsg`
//! passed (`lockbox_netsup::parse_sockaddr`): bytes copied from the sandbox's memory, so
//! entirely the attacker's. Never panics; what it returns is what the bytes say (family,
//! port in network order, address), so the decision is made on the destination the kernel
//! would use.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, SocketAddr};

fuzz_target!(|data: &[u8]| {
    let Some(addr) = lockbox_netsup::parse_sockaddr(data) else {
        return;
    };
    let family = i32::from(u16::from_ne_bytes([data[0], data[1]]));
    assert_eq!(addr.port(), u16::from_be_bytes([data[2], data[3]]));
    match (family, addr) {
        (libc::AF_INET, SocketAddr::V4(a)) => {
            assert!(data.len() >= 8);
            assert_eq!(a.ip().octets(), data[4..8]);
        }
        (libc::AF_INET6, SocketAddr::V6(a)) => {
            assert!(data.len() >= 24);
            assert_eq!(a.ip().octets(), data[8..24]);
            assert!(matches!(addr.ip(), IpAddr::V6(_)));
        }
        _ => panic!("family {family} decoded as {addr}"),
    }
});
