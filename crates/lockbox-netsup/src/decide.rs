//! The decision on one call: what the socket is ([`inspect`]) and what to do with the call
//! ([`decide`]), on the supervisor's own copies.

use super::audit::Why;
use super::call::{parse_sockaddr, Call};
use super::{Shared, DENIED_LISTED};
use crate::sys as sysnet;
use lockbox_policy::{canonical, route, ListKind, Proto, Route};
use std::net::SocketAddr;
use std::os::fd::{OwnedFd, RawFd};

/// The socket behind the descriptor, as the supervisor's own copy.
pub(super) struct Sock {
    pub(super) file: OwnedFd,
    pub(super) domain: i32,
    pub(super) stream: bool,
    /// TCP or UDP proper (not raw, SCTP, MPTCP...).
    pub(super) plain: bool,
    pub(super) host: bool,
    pub(super) nonblocking: bool,
}

/// What to do with a call.
#[derive(Debug)]
pub(super) enum Action {
    Continue,
    Fail(i32),
    /// Run the call ourselves on the sandbox's own socket.
    Perform,
    /// Connect or send through a new host socket installed in place of the descriptor.
    Replace,
    /// Not listed, and approvals are on: ask (see [`super::ask`]).
    Ask,
    /// Connect through the relay ([`super::relay`]): the destination is allowed by a name
    /// only, so the name the client asks for is checked too.
    Relay,
}

pub(super) fn inspect(shared: &Shared, pidfd: &OwnedFd, fd: RawFd) -> Result<Sock, i32> {
    let file = sysnet::pidfd_getfd(pidfd, fd).map_err(|e| e.0)?;
    let domain = sysnet::sockopt_int(&file, libc::SOL_SOCKET, libc::SO_DOMAIN).map_err(|e| e.0)?;
    let ty = sysnet::sockopt_int(&file, libc::SOL_SOCKET, libc::SO_TYPE).map_err(|e| e.0)?;
    let protocol =
        sysnet::sockopt_int(&file, libc::SOL_SOCKET, libc::SO_PROTOCOL).map_err(|e| e.0)?;
    let host = sysnet::netns_cookie(&file).map_err(|e| e.0)? == shared.host_cookie;
    let nonblocking = sysnet::status_flags(&file).map_err(|e| e.0)? & libc::O_NONBLOCK != 0;
    let stream = ty == libc::SOCK_STREAM;
    let plain = (stream && protocol == libc::IPPROTO_TCP)
        || (ty == libc::SOCK_DGRAM && protocol == libc::IPPROTO_UDP);
    Ok(Sock {
        file,
        domain,
        stream,
        plain,
        host,
        nonblocking,
    })
}

/// What [`decide`] makes of a call: the action, the destination (if the call names one),
/// and, for calls towards the host, the decision to log.
pub(super) struct Decided {
    pub(super) action: Action,
    pub(super) dest: Option<SocketAddr>,
    pub(super) why: Option<Why>,
}

fn denied(reason: &str, dest: Option<SocketAddr>) -> Decided {
    Decided {
        action: Action::Fail(libc::EACCES),
        dest,
        why: Some(Why {
            allowed: false,
            reason: reason.to_owned(),
            name: None,
        }),
    }
}

fn quiet(action: Action, dest: Option<SocketAddr>) -> Decided {
    Decided {
        action,
        dest,
        why: None,
    }
}

/// `stable` says whether the caller's descriptor table cannot change meanwhile (asked only
/// when it matters: it reads `/proc`).
pub(super) fn decide(
    shared: &Shared,
    sock: &Sock,
    call: &Call,
    stable: &dyn Fn() -> bool,
) -> Decided {
    let inet = sock.domain == libc::AF_INET || sock.domain == libc::AF_INET6;
    let local_or_own = |stable: &dyn Fn() -> bool| {
        if stable() {
            Action::Continue
        } else {
            Action::Perform
        }
    };
    if !inet {
        // Unix, netlink...: no route to the host's network, but a unix socket of the host's
        // namespace (an inherited one) would name the host's abstract sockets.
        let named = match call {
            Call::Connect { .. } => true,
            Call::Send { name, .. } => name.is_some(),
        };
        if sock.host && named {
            return denied("not an IP socket, of the host's namespace", None);
        }
        if stable() {
            return quiet(Action::Continue, None);
        }
        // Only the kernel can do a unix call for the caller: addresses are paths in the
        // sandbox's mount namespace, control messages carry its descriptors, and every
        // message carries its sender's pid, uid and gid (SCM_CREDENTIALS, SO_PASSPIDFD)
        // and security label to a receiver that asks — sent by us, lockbox's.
        if sock.domain == libc::AF_UNIX {
            return quiet(Action::Fail(libc::EACCES), None);
        }
        return quiet(Action::Perform, None);
    }
    if !sock.plain {
        // Raw, SCTP, MPTCP...: only inside the sandbox.
        return if sock.host {
            denied("not TCP or UDP, on a host socket", None)
        } else {
            quiet(local_or_own(stable), None)
        };
    }
    let proto = if sock.stream { Proto::Tcp } else { Proto::Udp };
    let addr = match call {
        Call::Connect { addr } => Some(addr.as_slice()),
        // Stream sockets ignore the address (fast open is refused by the filter).
        Call::Send { name, .. } if !sock.stream => name.as_deref(),
        Call::Send { .. } => None,
    };
    let Some(addr) = addr else {
        // A send on a connected socket: wherever it was allowed to connect to.
        return match (sock.host, sock.stream) {
            (false, _) | (true, true) => quiet(local_or_own(stable), None),
            (true, false) => quiet(Action::Perform, None),
        };
    };
    let Some(dest) = parse_sockaddr(addr) else {
        // AF_UNSPEC (disconnect) or garbage: a host socket keeps its allowed peer.
        return if sock.host {
            denied("no address (a host socket keeps its allowed peer)", None)
        } else {
            quiet(local_or_own(stable), None)
        };
    };
    // The list in force, read once: a replacement meanwhile applies from the next call.
    let list = shared.list.get();
    let kind = list.kind;
    let mut routed = route(kind, &list.rules, proto, dest);
    let mut learned_from = None;
    if routed == Route::Denied && kind == ListKind::Allow {
        // An address one of this sandbox's DNS answers gave for a listed name (forgotten
        // when the list is replaced).
        learned_from = shared.list.learned().why(proto, dest);
        if learned_from.is_some() {
            routed = Route::Host;
        }
    }
    let mut approved = false;
    if routed == Route::Denied && kind == ListKind::Allow {
        if let Some(ask) = &shared.ask {
            let protocol = match proto {
                Proto::Udp => super::audit::Protocol::Udp,
                Proto::Tcp => super::audit::Protocol::Tcp,
            };
            if !ask.dest_approved(protocol, dest) {
                return quiet(Action::Ask, Some(dest));
            }
            approved = true;
            routed = Route::Host;
        }
    }
    let matching = || {
        list.rules
            .iter()
            .find(|r| r.matches(proto, SocketAddr::new(canonical(dest.ip()), dest.port())))
            .map_or_else(String::new, ToString::to_string)
    };
    let action = match (routed, sock.host) {
        (Route::Denied, _) => {
            let reason = match kind {
                ListKind::Allow => "not in the allow-list".to_owned(),
                ListKind::Deny => format!("deny rule {}", matching()),
            };
            return denied(&reason, Some(dest));
        }
        (Route::Inside, true) => {
            return denied("the sandbox's loopback, on a host socket", Some(dest));
        }
        (Route::Inside, false) => return quiet(local_or_own(stable), Some(dest)),
        (Route::Host, true) => Action::Perform,
        // A name-allowed TCP connection: the name it asks for is checked by the relay.
        (Route::Host, false) if learned_from.is_some() && sock.stream => Action::Relay,
        (Route::Host, false) => Action::Replace,
    };
    let (reason, name) = match (learned_from, kind) {
        _ if approved => ("approved for the sandbox".to_owned(), None),
        (Some((spec, name)), _) => (format!("name {spec} answered"), Some(name)),
        (None, ListKind::Allow) => (format!("address rule {}", matching()), None),
        (None, ListKind::Deny) => ("not in the deny-list".to_owned(), None),
    };
    Decided {
        action,
        dest: Some(dest),
        why: Some(Why {
            allowed: true,
            reason,
            name,
        }),
    }
}

pub(super) fn record_denied(shared: &Shared, call: &Call, sock: &Sock, dest: Option<SocketAddr>) {
    let Ok(mut r) = shared.report.lock() else {
        return;
    };
    r.denied += 1;
    if r.denied_first.len() < DENIED_LISTED {
        let proto = if sock.stream { "tcp" } else { "udp" };
        let dest = dest.map_or("(no address)".to_owned(), |d| d.to_string());
        r.denied_first
            .push(format!("{} {proto} {dest}", call.name()));
    }
}

/// A refused call, already described (`connect tcp 198.18.0.1:80`).
pub(super) fn record_denied_line(shared: &Shared, line: String) {
    let Ok(mut r) = shared.report.lock() else {
        return;
    };
    r.denied += 1;
    if r.denied_first.len() < DENIED_LISTED {
        r.denied_first.push(line);
    }
}

/// A DNS query for a name the list does not hold (answered `NXDOMAIN`).
pub(super) fn record_denied_name(shared: &Shared, name: &str) {
    let Ok(mut r) = shared.report.lock() else {
        return;
    };
    r.denied += 1;
    if r.denied_first.len() < DENIED_LISTED {
        let shown: String = name.chars().take(80).collect();
        r.denied_first.push(format!("dns {shown}"));
    }
}

/// An address of the host's own that a listed name resolved to, left out of the answer.
pub(super) fn record_rebinding(shared: &Shared, name: &str, ip: std::net::IpAddr) {
    let Ok(mut r) = shared.report.lock() else {
        return;
    };
    r.dns_rebinding_refused += 1;
    if r.denied_first.len() < DENIED_LISTED {
        r.denied_first
            .push(format!("dns {name} -> {ip} (host-internal)"));
    }
}

fn status_field(tid: libc::pid_t, field: &str) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().parse().ok())
}

pub(super) fn tgid(tid: libc::pid_t) -> Option<libc::pid_t> {
    status_field(tid, "Tgid:").map(|v| v as libc::pid_t)
}

/// Whether the caller is its process's only thread: then nothing can change its
/// descriptor table while it waits for us (the filter refuses `CLONE_FILES` without
/// `CLONE_THREAD`).
pub(super) fn single_threaded(tid: libc::pid_t) -> bool {
    status_field(tid, "Threads:") == Some(1)
}

#[cfg(test)]
mod tests {
    use super::super::NetList;
    use super::*;

    fn v4(addr: &str) -> Vec<u8> {
        let a: SocketAddr = addr.parse().unwrap();
        let SocketAddr::V4(a) = a else { panic!() };
        let mut b = vec![0u8; 16];
        b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&a.port().to_be_bytes());
        b[4..8].copy_from_slice(&a.ip().octets());
        b
    }

    /// A real socket; `host` says whether the decision treats it as a host socket.
    fn sock(domain: i32, ty: i32, host: bool) -> Sock {
        let file = sysnet::socket(domain, ty, 0).unwrap();
        Sock {
            file,
            domain,
            stream: ty == libc::SOCK_STREAM,
            plain: domain != libc::AF_UNIX,
            host,
            nonblocking: false,
        }
    }

    /// A supervisor's state whose list allows 127.0.0.2:80 only.
    fn allowing_127_0_0_2_port_80() -> Shared {
        Shared::bare(NetList {
            kind: ListKind::Allow,
            rules: lockbox_policy::NetSpec::parse("127.0.0.2:80")
                .unwrap()
                .rules(&[]),
            names: Vec::new(),
        })
    }

    fn name(a: &Action) -> String {
        format!("{a:?}")
    }

    #[test]
    fn decisions_continue_only_sandbox_sockets_of_single_threaded_callers() {
        let shared = allowing_127_0_0_2_port_80();
        let connect = |a: &str| Call::Connect { addr: v4(a) };
        let send = |a: Option<&str>| Call::Send {
            name: a.map(v4),
            iov: Vec::new(),
            control: Vec::new(),
            flags: 0,
            mmsg_len_at: None,
        };
        let yes = || true;
        let no = || false;
        let tcp = |host| sock(libc::AF_INET, libc::SOCK_STREAM, host);
        let udp = |host| sock(libc::AF_INET, libc::SOCK_DGRAM, host);
        let unix = |host| sock(libc::AF_UNIX, libc::SOCK_STREAM, host);
        let cases: Vec<(Sock, Call, &dyn Fn() -> bool, &str)> = vec![
            (tcp(false), connect("127.0.0.2:80"), &yes, "Replace"),
            (tcp(false), connect("127.0.0.2:80"), &no, "Replace"),
            (tcp(false), connect("127.0.0.3:80"), &yes, "Continue"),
            (tcp(false), connect("127.0.0.3:80"), &no, "Perform"),
            (tcp(false), connect("192.0.2.1:80"), &yes, "Fail(13)"),
            (tcp(true), connect("127.0.0.2:80"), &yes, "Perform"),
            (tcp(true), connect("127.0.0.3:80"), &yes, "Fail(13)"),
            (
                tcp(true),
                Call::Connect { addr: vec![0, 0] },
                &yes,
                "Fail(13)",
            ),
            (tcp(true), send(None), &yes, "Continue"),
            (tcp(true), send(None), &no, "Perform"),
            (udp(true), send(None), &yes, "Perform"),
            (udp(true), send(Some("192.0.2.1:53")), &yes, "Fail(13)"),
            (udp(false), send(Some("127.0.0.2:80")), &yes, "Replace"),
            (unix(false), connect("127.0.0.2:80"), &yes, "Continue"),
            (unix(false), connect("127.0.0.2:80"), &no, "Fail(13)"),
            (unix(false), send(None), &no, "Fail(13)"),
            (unix(true), connect("127.0.0.2:80"), &yes, "Fail(13)"),
        ];
        for (i, (s, c, stable, want)) in cases.iter().enumerate() {
            let decided = decide(&shared, s, c, *stable);
            assert_eq!(name(&decided.action), *want, "case {i}");
        }
    }

    #[test]
    fn a_replaced_list_decides_the_next_call() {
        let shared = allowing_127_0_0_2_port_80();
        let connect = |a: &str| Call::Connect { addr: v4(a) };
        let yes = || true;
        let decide_tcp = |a: &str| {
            let s = sock(libc::AF_INET, libc::SOCK_STREAM, false);
            name(&decide(&shared, &s, &connect(a), &yes).action)
        };
        assert_eq!(decide_tcp("127.0.0.2:80"), "Replace");
        assert_eq!(decide_tcp("192.0.2.1:80"), "Fail(13)");
        shared.list.replace(NetList {
            kind: ListKind::Deny,
            rules: lockbox_policy::NetSpec::parse("192.0.2.1:*")
                .unwrap()
                .rules(&[]),
            names: Vec::new(),
        });
        assert_eq!(decide_tcp("192.0.2.1:80"), "Fail(13)");
        assert_eq!(decide_tcp("198.51.100.1:80"), "Replace");
        // A deny-list's loopback is the sandbox's own.
        assert_eq!(decide_tcp("127.0.0.2:80"), "Continue");
        shared.list.replace(NetList {
            kind: ListKind::Allow,
            rules: Vec::new(),
            names: Vec::new(),
        });
        assert_eq!(decide_tcp("198.51.100.1:80"), "Fail(13)");
    }
}
