//! What the supervisor forwards when it performs a send for the caller: the control
//! messages and flags that need no privilege and keep the packet going where the policy
//! decided. Anything else is refused, as the kernel would refuse it to the caller.
//!
//! The kernel checks privileged control messages (`SO_MARK`, `SO_PRIORITY` above 6, IP
//! source routes and hop-by-hop options...) against the *sender's* capabilities: sent by
//! the supervisor, they would be checked against lockbox's (root's, for a root caller)
//! instead of the capability-less command's. The supervisor thread also runs with its
//! capabilities dropped (see `super::start`), so the kernel would refuse most of these
//! anyway; this list is the first wall, and the one that also covers control messages that
//! need no privilege but choose a source address or a route.

/// The control messages the supervisor was audited for: the ones it forwards, with why each
/// is harmless, and the ones it refuses, with why. Any other is refused with `EPERM`. The
/// table is `docs/security.md`'s ("Network policy"); a test keeps the two in step.
pub(super) const CMSGS: &[Cmsg] = &[
    forwarded(libc::SOL_SOCKET, libc::SO_PRIORITY, "SO_PRIORITY", "values 0-6, the range any process may set; higher ones need CAP_NET_ADMIN and get `EPERM`, as from the kernel"),
    forwarded(libc::SOL_SOCKET, SO_TIMESTAMPING_OLD, "SO_TIMESTAMPING", "asks for transmit timestamps on the socket's own error queue"),
    forwarded(libc::SOL_SOCKET, SO_TIMESTAMPING_NEW, "SO_TIMESTAMPING_NEW", "the same, with 64-bit times"),
    forwarded(libc::SOL_SOCKET, SCM_TS_OPT_ID, "SCM_TS_OPT_ID", "names this packet's timestamp"),
    forwarded(libc::SOL_SOCKET, SCM_TXTIME, "SCM_TXTIME", "when to transmit, on a socket the caller set up for it (`SO_TXTIME`)"),
    forwarded(libc::IPPROTO_IP, libc::IP_TTL, "IP_TTL", "hop limit of this packet"),
    forwarded(libc::IPPROTO_IP, libc::IP_TOS, "IP_TOS", "DSCP/ECN bits of this packet (the queueing priority they imply is in the unprivileged range)"),
    forwarded(libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, "IPV6_HOPLIMIT", "hop limit of this packet"),
    forwarded(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, "IPV6_TCLASS", "traffic class (DSCP/ECN) of this packet"),
    forwarded(libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, "IPV6_DONTFRAG", "do not fragment this packet"),
    forwarded(libc::IPPROTO_UDP, UDP_SEGMENT, "UDP_SEGMENT", "cut the datagram into segments of this size (GSO), all to the same destination"),
    refused(libc::SOL_SOCKET, libc::SO_MARK, "SO_MARK", "needs CAP_NET_RAW or CAP_NET_ADMIN: a mark selects routing tables and firewall rules (fwmark routing, VPN kill-switches)"),
    refused(libc::SOL_SOCKET, libc::SCM_RIGHTS, "SCM_RIGHTS", "descriptors, meaningful on unix sockets only, which the supervisor never sends on"),
    refused(libc::SOL_SOCKET, libc::SCM_CREDENTIALS, "SCM_CREDENTIALS", "a pid, uid and gid the kernel checks against the *sender's* privilege"),
    refused(libc::SOL_SOCKET, SCM_SECURITY, "SCM_SECURITY", "a security label; unix sockets only"),
    refused(libc::SOL_SOCKET, SCM_PIDFD, "SCM_PIDFD", "a pidfd; unix sockets only"),
    refused(libc::IPPROTO_IP, libc::IP_PKTINFO, "IP_PKTINFO", "chooses the source address and the outgoing interface, which are the host's routing's to decide"),
    refused(libc::IPPROTO_IP, libc::IP_RETOPTS, "IP_RETOPTS", "IP options: a source route sends the packet to its first hop, not to the destination the policy checked (the kernel allows it to a sender with CAP_NET_RAW), and security options need CAP_NET_RAW"),
    refused(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, "IPV6_PKTINFO", "chooses the source address and the outgoing interface"),
    refused(libc::IPPROTO_IPV6, IPV6_2292PKTINFO, "IPV6_2292PKTINFO", "the same (RFC 2292 name)"),
    refused(libc::IPPROTO_IPV6, IPV6_NEXTHOP, "IPV6_NEXTHOP", "chooses the next hop"),
    refused(libc::IPPROTO_IPV6, libc::IPV6_RTHDR, "IPV6_RTHDR", "a routing header sends the packet to its first segment, not to the destination the policy checked — and needs no privilege"),
    refused(libc::IPPROTO_IPV6, IPV6_2292RTHDR, "IPV6_2292RTHDR", "the same (RFC 2292 name)"),
    refused(libc::IPPROTO_IPV6, libc::IPV6_HOPOPTS, "IPV6_HOPOPTS", "needs CAP_NET_RAW"),
    refused(libc::IPPROTO_IPV6, IPV6_2292HOPOPTS, "IPV6_2292HOPOPTS", "needs CAP_NET_RAW"),
    refused(libc::IPPROTO_IPV6, libc::IPV6_DSTOPTS, "IPV6_DSTOPTS", "needs CAP_NET_RAW"),
    refused(libc::IPPROTO_IPV6, IPV6_2292DSTOPTS, "IPV6_2292DSTOPTS", "needs CAP_NET_RAW"),
    refused(libc::IPPROTO_IPV6, libc::IPV6_RTHDRDSTOPTS, "IPV6_RTHDRDSTOPTS", "needs CAP_NET_RAW"),
];

/// A control message type (`cmsg_level`, `cmsg_type`) and whether it is forwarded.
#[derive(Debug)]
pub(super) struct Cmsg {
    level: i32,
    ty: i32,
    name: &'static str,
    forwarded: bool,
    #[cfg_attr(not(test), allow(dead_code))]
    why: &'static str,
}

const fn forwarded(level: i32, ty: i32, name: &'static str, why: &'static str) -> Cmsg {
    Cmsg {
        level,
        ty,
        name,
        forwarded: true,
        why,
    }
}

const fn refused(level: i32, ty: i32, name: &'static str, why: &'static str) -> Cmsg {
    Cmsg {
        level,
        ty,
        name,
        forwarded: false,
        why,
    }
}

// asm-generic values (x86_64 and aarch64), not all in the libc crate.
const SO_TIMESTAMPING_OLD: i32 = 37;
const SO_TIMESTAMPING_NEW: i32 = 65;
const SCM_TXTIME: i32 = 61;
const SCM_TS_OPT_ID: i32 = 78;
const SCM_SECURITY: i32 = 3;
const SCM_PIDFD: i32 = 4;
const UDP_SEGMENT: i32 = 103;
const IPV6_2292PKTINFO: i32 = 2;
const IPV6_2292HOPOPTS: i32 = 3;
const IPV6_2292DSTOPTS: i32 = 4;
const IPV6_2292RTHDR: i32 = 5;
const IPV6_NEXTHOP: i32 = 9;
/// The unprivileged range of `SO_PRIORITY` (`TC_PRIO_BESTEFFORT..=TC_PRIO_INTERACTIVE`).
const PRIORITY_UNPRIVILEGED: std::ops::RangeInclusive<i32> = 0..=6;

/// `struct cmsghdr` on 64-bit: `cmsg_len` (size_t), `cmsg_level`, `cmsg_type`; data aligned
/// to 8.
const HEADER: usize = 16;
const ALIGN: usize = 8;

/// Checks every control message of `control` (the supervisor's copy): `Err(errno)` for the
/// first one not forwarded — `EINVAL` for a malformed header, as the kernel answers,
/// `EPERM` otherwise (what the kernel gives an unprivileged caller for the privileged ones;
/// the others are lockbox's choice, see `docs/security.md`).
pub(super) fn audit_control(control: &[u8]) -> Result<(), i32> {
    let mut at = 0;
    // The kernel walks headers while a whole one fits (CMSG_FIRSTHDR / CMSG_NXTHDR).
    while control.len().saturating_sub(at) >= HEADER {
        let word = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&control[at + o..at + o + 8]);
            u64::from_ne_bytes(b)
        };
        let int = |o: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&control[at + o..at + o + 4]);
            i32::from_ne_bytes(b)
        };
        let len = usize::try_from(word(0)).unwrap_or(usize::MAX);
        if len < HEADER || len > control.len() - at {
            return Err(libc::EINVAL);
        }
        let (level, ty) = (int(8), int(12));
        let data = &control[at + HEADER..at + len];
        let known = CMSGS.iter().find(|c| c.level == level && c.ty == ty);
        if !known.is_some_and(|c| c.forwarded) {
            tracing::debug!(
                level,
                ty,
                name = known.map(|c| c.name),
                "control message refused"
            );
            return Err(libc::EPERM);
        }
        if level == libc::SOL_SOCKET && ty == libc::SO_PRIORITY {
            let value = data
                .get(..4)
                .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
            match value {
                Some(v) if PRIORITY_UNPRIVILEGED.contains(&v) => {}
                Some(_) => return Err(libc::EPERM),
                None => return Err(libc::EINVAL),
            }
        }
        at += len.div_ceil(ALIGN) * ALIGN;
    }
    Ok(())
}

/// Send flags forwarded: none needs privilege or changes where the data goes.
const FORWARDED_FLAGS: i32 = libc::MSG_OOB
    | libc::MSG_DONTROUTE
    | libc::MSG_DONTWAIT
    | libc::MSG_EOR
    | libc::MSG_CONFIRM
    | libc::MSG_MORE
    | libc::MSG_NOSIGNAL
    | MSG_PROBE;
/// `MSG_PROBE`: find the path (MTU) without sending.
const MSG_PROBE: i32 = 0x10;

/// The flags to send with, or the errno to answer. `MSG_FASTOPEN` (a connect hidden in a
/// send) is refused by the filter already. `MSG_ZEROCOPY` is decided by the caller
/// (`perform::Send::new`), which knows the socket. Other bits are ignored by TCP and UDP
/// and are dropped.
pub(super) fn audit_flags(flags: i32) -> Result<i32, i32> {
    const MSG_FASTOPEN: i32 = 0x2000_0000;
    if flags & MSG_FASTOPEN != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(flags & FORWARDED_FLAGS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, ty: i32, data: &[u8]) -> Vec<u8> {
        let len = HEADER + data.len();
        let mut b = Vec::new();
        b.extend_from_slice(&(len as u64).to_ne_bytes());
        b.extend_from_slice(&level.to_ne_bytes());
        b.extend_from_slice(&ty.to_ne_bytes());
        b.extend_from_slice(data);
        b.resize(len.div_ceil(ALIGN) * ALIGN, 0);
        b
    }

    fn int(v: i32) -> Vec<u8> {
        v.to_ne_bytes().to_vec()
    }

    #[test]
    fn privileged_and_routing_control_messages_are_refused() {
        let mut refused: Vec<(i32, i32, Vec<u8>)> = CMSGS
            .iter()
            .filter(|c| !c.forwarded)
            .map(|c| (c.level, c.ty, vec![0; 24]))
            .collect();
        refused.extend([
            (libc::SOL_SOCKET, libc::SO_PRIORITY, int(7)),
            (libc::SOL_SOCKET, libc::SO_PRIORITY, int(-1)),
            (
                libc::IPPROTO_IP,
                libc::IP_RETOPTS,
                vec![0x83, 7, 4, 1, 2, 3, 4, 0],
            ),
            (libc::IPPROTO_TCP, 1, int(1)),
            (libc::SOL_SOCKET, 1234, int(1)),
        ]);
        for (level, ty, data) in refused {
            assert_eq!(
                audit_control(&cmsg(level, ty, &data)),
                Err(libc::EPERM),
                "{level}/{ty}"
            );
            // Hidden behind a harmless one.
            let mut two = cmsg(libc::IPPROTO_IP, libc::IP_TTL, &int(9));
            two.extend(cmsg(level, ty, &data));
            assert_eq!(audit_control(&two), Err(libc::EPERM), "{level}/{ty} second");
        }
    }

    #[test]
    fn harmless_control_messages_pass_and_malformed_ones_are_einval() {
        let mut all = Vec::new();
        for c in CMSGS.iter().filter(|c| c.forwarded) {
            let one = cmsg(c.level, c.ty, &int(3));
            assert_eq!(audit_control(&one), Ok(()), "{}", c.name);
            all.extend(one);
        }
        assert_eq!(audit_control(&all), Ok(()));
        assert_eq!(audit_control(&[]), Ok(()));
        // A trailing fragment shorter than a header is ignored, as the kernel does.
        assert_eq!(audit_control(&[0u8; 8]), Ok(()));
        let mut short = cmsg(libc::IPPROTO_IP, libc::IP_TTL, &int(9));
        short[..8].copy_from_slice(&8u64.to_ne_bytes());
        assert_eq!(audit_control(&short), Err(libc::EINVAL));
        let mut long = cmsg(libc::IPPROTO_IP, libc::IP_TTL, &int(9));
        long[..8].copy_from_slice(&4096u64.to_ne_bytes());
        assert_eq!(audit_control(&long), Err(libc::EINVAL));
        assert_eq!(
            audit_control(&cmsg(libc::SOL_SOCKET, libc::SO_PRIORITY, &[1])),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn fastopen_is_refused_and_unknown_flags_dropped() {
        assert_eq!(audit_flags(libc::MSG_ZEROCOPY), Ok(0));
        assert_eq!(audit_flags(0x2000_0000), Err(libc::EOPNOTSUPP));
        assert_eq!(
            audit_flags(libc::MSG_MORE | libc::MSG_PEEK | libc::MSG_DONTWAIT),
            Ok(libc::MSG_MORE | libc::MSG_DONTWAIT)
        );
    }
}

#[cfg(test)]
mod doc_tests {
    #[test]
    fn security_doc_lists_every_audited_control_message() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/security.md"
        ))
        .unwrap();
        for c in super::CMSGS {
            let answer = if c.forwarded { "forwarded" } else { "`EPERM`" };
            let row = format!("| `{}` | {answer} | {} |", c.name, c.why);
            assert!(doc.contains(&row), "docs/security.md lacks the row\n{row}");
        }
    }
}
