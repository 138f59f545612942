//! The network supervisor's ClientHello reader (`lockbox_netsup::client_hello_server_name`):
//! the first bytes a sandboxed process sends on a relayed TLS connection, so entirely the
//! attacker's. Never panics; what follows a whole ClientHello does not change its name, and
//! a flight not whole yet is not whole cut shorter either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_netsup::{client_hello_server_name, ClientHello};

const MAX: usize = 32 << 10;

fuzz_target!(|data: &[u8]| {
    match client_hello_server_name(data, MAX) {
        ClientHello::ServerName(Some(name)) => {
            // More bytes after a whole ClientHello do not change what it says.
            let mut longer = data.to_vec();
            longer.extend_from_slice(b"\x17\x03\x03");
            assert_eq!(
                client_hello_server_name(&longer, MAX),
                ClientHello::ServerName(Some(name))
            );
        }
        ClientHello::Incomplete => {
            // Cut shorter, a flight that is not whole yet stays not whole.
            let half = &data[..data.len() / 2];
            assert_eq!(client_hello_server_name(half, MAX), ClientHello::Incomplete);
        }
        ClientHello::ServerName(None) | ClientHello::Unreadable(_) => {}
    }
});
