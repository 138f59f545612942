//! Which addresses are the host's own, or reach the host's own services: never answered for
//! a listed name (see [`super::dns`]) unless an address rule names them, so a name cannot
//! be rebound onto the host (issue 32).
//!
//! An address is read through every form that carries another one, as a host's stack or a
//! gateway would route it: IPv4-mapped and IPv4-compatible IPv6 (`::ffff:127.0.0.1`,
//! `::127.0.0.1`), NAT64 (`64:ff9b::a9fe:a9fe` is 169.254.169.254, RFC 6052), 6to4
//! (`2002:7f00:1::`, RFC 3056) and Teredo (RFC 4380). Internal are loopback, unspecified and
//! "this network" (0/8), link-local, multicast, broadcast and reserved (240/4), the
//! shared address space 100.64/10 (carrier-grade NAT, where cloud metadata services such as
//! Alibaba's 100.100.100.200 live), 192.0.0/24, unique-local and site-local IPv6 (AWS's
//! metadata service is `fd00:ec2::254`), the local-use NAT64 prefix 64:ff9b:1::/48 (RFC
//! 8215: its embedding depends on the operator's prefix length), and every address of one
//! of the host's interfaces ([`host_addresses`], read again for each answer, so interfaces
//! that come and go are followed).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is internal (for the audit log and the run report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Internal {
    Loopback,
    Unspecified,
    LinkLocal,
    Multicast,
    /// Broadcast, and the rest of 240/4.
    Reserved,
    /// 100.64/10, 192.0.0/24, unique-local and site-local IPv6, local-use NAT64.
    Private,
    /// An address of one of the host's interfaces.
    HostInterface,
}

impl Internal {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Internal::Loopback => "loopback",
            Internal::Unspecified => "unspecified",
            Internal::LinkLocal => "link-local",
            Internal::Multicast => "multicast",
            Internal::Reserved => "reserved",
            Internal::Private => "private (metadata or carrier-grade NAT range)",
            Internal::HostInterface => "the host's own interface",
        }
    }
}

/// Why `ip` is internal, if it is: itself or an IPv4 address it carries, given `host`, the
/// addresses of the host's interfaces.
pub(super) fn classify(ip: IpAddr, host: &[IpAddr]) -> Option<Internal> {
    let own = |ip: IpAddr| host.iter().any(|h| same(*h, ip));
    match ip {
        IpAddr::V4(a) => {
            let kind = v4(a);
            kind.or_else(|| own(ip).then_some(Internal::HostInterface))
        }
        IpAddr::V6(a) => {
            if let Some(kind) = v6(a) {
                return Some(kind);
            }
            if own(ip) {
                return Some(Internal::HostInterface);
            }
            embedded(a)
                .into_iter()
                .flatten()
                .find_map(|inner| classify(IpAddr::V4(inner), host))
        }
    }
}

/// Two addresses naming one interface address (an IPv6 form of an IPv4 one, say).
fn same(a: IpAddr, b: IpAddr) -> bool {
    a == b || lockbox_policy::canonical(a) == lockbox_policy::canonical(b)
}

fn v4(a: Ipv4Addr) -> Option<Internal> {
    let [x, y, z, _] = a.octets();
    Some(match (x, y, z) {
        (127, _, _) => Internal::Loopback,
        (0, _, _) => Internal::Unspecified,
        (169, 254, _) => Internal::LinkLocal,
        (224..=239, _, _) => Internal::Multicast,
        (240..=255, _, _) => Internal::Reserved,
        (100, 64..=127, _) | (192, 0, 0) => Internal::Private,
        _ => return None,
    })
}

fn v6(a: Ipv6Addr) -> Option<Internal> {
    let s = a.segments();
    Some(match s[0] {
        _ if a.is_loopback() => Internal::Loopback,
        _ if a.is_unspecified() => Internal::Unspecified,
        0xff00..=0xffff => Internal::Multicast,
        0xfe80..=0xfebf => Internal::LinkLocal,
        // Site-local (deprecated, RFC 3879) and unique-local (RFC 4193).
        0xfec0..=0xfeff | 0xfc00..=0xfdff => Internal::Private,
        0x0064 if s[1] == 0xff9b && s[2] == 1 => Internal::Private,
        _ => return None,
    })
}

/// The IPv4 addresses an IPv6 address carries for a stack or gateway to reach.
fn embedded(a: Ipv6Addr) -> [Option<Ipv4Addr>; 2] {
    let s = a.segments();
    let low = Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
    let at = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        // IPv4-compatible (::a.b.c.d, RFC 4291 2.5.5.1) and IPv4-mapped (::ffff:a.b.c.d).
        [0, 0, 0, 0, 0, 0 | 0xffff, _, _] => [Some(low), None],
        // SIIT's IPv4-translated ::ffff:0:a.b.c.d (RFC 2765).
        [0, 0, 0, 0, 0xffff, 0, _, _] => [Some(low), None],
        // NAT64's well-known prefix (RFC 6052).
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => [Some(low), None],
        // 6to4: the gateway's IPv4 address follows the prefix.
        [0x2002, hi, lo, ..] => [Some(at(hi, lo)), None],
        // Teredo: the server's address, and the client's, inverted.
        [0x2001, 0, hi, lo, ..] => [Some(at(hi, lo)), Some(Ipv4Addr::from(!u32::from(low)))],
        _ => [None, None],
    }
}

/// The addresses of the host's interfaces now, in the calling thread's network namespace
/// (the host's, for the supervisor); none if they cannot be read.
pub(super) fn host_addresses() -> Vec<IpAddr> {
    crate::sys::interface_addresses()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn issue_32_the_hosts_own_and_metadata_addresses_in_every_form_are_internal() {
        let host = [
            ip("192.0.2.2"),
            ip("198.18.0.1"),
            ip("fd18::1"),
            ip("2001:db8::2"),
        ];
        for a in [
            "192.0.2.2",
            "198.18.0.1",
            "::ffff:198.18.0.1",
            "64:ff9b::c612:1",
            "2002:c612:1::",
            "2001:db8::2",
            "fd18::1",
            "fd00:ec2::254",
            "100.100.100.200",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a9fe:a9fe",
            "::127.0.0.1",
            "::ffff:0:127.0.0.1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            // Teredo, whose client 127.0.0.1 is stored inverted.
            "2001:0:c000:201::80ff:fffe",
            "127.0.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "255.255.255.255",
            "240.0.0.1",
            "224.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(classify(ip(a), &host).is_some(), "{a}");
        }
        for a in [
            "198.18.0.7",
            "10.0.0.1",
            "93.184.215.14",
            "2001:db8::1",
            "64:ff9b::5db8:d70e",
            "2606:4700::1111",
        ] {
            assert_eq!(classify(ip(a), &host), None, "{a}");
        }
        assert_eq!(
            classify(ip("198.18.0.1"), &host),
            Some(Internal::HostInterface)
        );
    }

    #[test]
    fn the_hosts_interfaces_include_its_loopback() {
        // The test runs in the machine's namespace or a test's: loopback is in every one
        // that has brought `lo` up; any address read is classified as the host's own.
        let host = host_addresses();
        for a in &host {
            assert!(classify(*a, &host).is_some(), "{a}");
        }
    }

    fn v4_forms(a: Ipv4Addr) -> Vec<IpAddr> {
        let n = u32::from(a);
        let (hi, lo) = ((n >> 16) as u16, n as u16);
        vec![
            IpAddr::V6(a.to_ipv6_mapped()),
            IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo)),
            IpAddr::V6(Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1)),
            IpAddr::V6(Ipv6Addr::new(0x2001, 0, 0x0102, 0x0304, 0, 0, !hi, !lo)),
        ]
    }

    proptest! {
        /// An IPv4 address is internal exactly when its IPv6 forms are: a form never hides
        /// a host or metadata address, and never blocks a public one (Teredo aside, whose
        /// server may be internal itself).
        #[test]
        fn an_address_and_its_ipv6_forms_classify_alike(n: u32, own: u32) {
            let a = Ipv4Addr::from(n);
            let host = [IpAddr::V4(Ipv4Addr::from(own))];
            let want = classify(IpAddr::V4(a), &host).is_some();
            for form in v4_forms(a) {
                prop_assert_eq!(classify(form, &host).is_some(), want, "{} as {}", a, form);
            }
            prop_assert!(classify(host[0], &host).is_some());
            for form in v4_forms(Ipv4Addr::from(own)) {
                prop_assert!(classify(form, &host).is_some(), "{}", form);
            }
        }

        /// Whatever the bytes, the classifier answers (no panic), and every loopback,
        /// link-local, multicast or unspecified address is internal.
        #[test]
        fn std_non_global_kinds_are_always_internal(bytes: [u8; 16]) {
            let a = Ipv6Addr::from(bytes);
            let std_internal = a.is_loopback() || a.is_unspecified() || a.is_multicast()
                || a.is_unicast_link_local() || a.is_unique_local();
            if std_internal {
                prop_assert!(classify(IpAddr::V6(a), &[]).is_some(), "{}", a);
            }
            let v = Ipv4Addr::from([bytes[0], bytes[1], bytes[2], bytes[3]]);
            if v.is_loopback() || v.is_link_local() || v.is_unspecified() || v.is_multicast()
                || v.is_broadcast() {
                prop_assert!(classify(IpAddr::V4(v), &[]).is_some(), "{}", v);
            }
        }
    }
}
