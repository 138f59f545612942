//! What a relayed connection's first flight asks for ([`classify`]): the server name of a
//! TLS ClientHello (read by [`super::hello`]), the `Host` of an HTTP/1 request (parsed with
//! `httparse`), or neither. Pure: bytes in, a [`FirstFlight`] out; [`super::relay`] decides.

use super::hello::{self, Hello};

/// Longest first flight read before deciding: a ClientHello (post-quantum key shares make
/// them ~2 KiB; TLS allows one handshake message over several records) or a request head.
pub const FIRST_FLIGHT_MAX: usize = 32 << 10;
/// Most headers of a request head taken.
const MAX_HEADERS: usize = 100;
/// Longest method token waited for before deciding the bytes are not HTTP.
const MAX_METHOD: usize = 32;

/// What the first bytes a client sent ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FirstFlight {
    /// Not complete yet: read more (the caller bounds how much and how long).
    Incomplete,
    /// A TLS ClientHello; its `server_name` (host_name), if it carries one.
    Tls(Option<String>),
    /// An HTTP/1 request head; the name it asks for (its `Host`, or the authority of an
    /// absolute-form or CONNECT target), if it names one.
    Http(Option<String>),
    /// Something TLS or HTTP that cannot be read as asking for one name (why).
    Unreadable(&'static str, Protocol),
    /// Neither TLS nor HTTP: a protocol that names no server.
    Other,
}

/// The protocol an unreadable first flight looked like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    Tls,
    Http,
}

/// Classifies the bytes read so far. `buf` never needs more than [`FIRST_FLIGHT_MAX`]
/// bytes: at that size an incomplete flight is unreadable.
pub(super) fn classify(buf: &[u8]) -> FirstFlight {
    let full = buf.len() >= FIRST_FLIGHT_MAX;
    let Some(&first) = buf.first() else {
        return FirstFlight::Incomplete;
    };
    if first == hello::HANDSHAKE_RECORD {
        return match client_hello(buf) {
            FirstFlight::Incomplete if full => {
                FirstFlight::Unreadable("ClientHello larger than 32 KiB", Protocol::Tls)
            }
            other => other,
        };
    }
    // An SSLv2-compatible hello (record length with the top bit set, then type 1) carries
    // no server name; servers that still take it would pick one themselves.
    if first & 0x80 != 0 && buf.get(2) == Some(&1) {
        return FirstFlight::Unreadable("SSLv2 ClientHello (no server name)", Protocol::Tls);
    }
    match http(buf) {
        FirstFlight::Incomplete if full => {
            FirstFlight::Unreadable("request head larger than 32 KiB", Protocol::Http)
        }
        other => other,
    }
}

/// A ClientHello's server name, as [`super::hello`] reads it.
fn client_hello(buf: &[u8]) -> FirstFlight {
    match hello::server_name(buf, FIRST_FLIGHT_MAX) {
        Hello::Incomplete => FirstFlight::Incomplete,
        Hello::ServerName(name) => FirstFlight::Tls(name),
        Hello::Unreadable(why) => FirstFlight::Unreadable(why, Protocol::Tls),
    }
}

/// Whether `b` may appear in a method (an RFC 9110 token).
fn token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// An HTTP/1 request head. The bytes count as HTTP once they start (after empty lines, which
/// servers skip) with a token and a space or tab, or hold `HTTP/` in their first line: then
/// they must parse, so a lenient server cannot read a name lockbox did not.
fn http(buf: &[u8]) -> FirstFlight {
    let start = buf
        .iter()
        .position(|b| *b != b'\r' && *b != b'\n')
        .unwrap_or(buf.len());
    let line = &buf[start..];
    let method = line.iter().take_while(|b| token(**b)).count();
    let first_line_end = line.iter().position(|b| *b == b'\n');
    let first_line = &line[..first_line_end.unwrap_or(line.len())];
    let says_http = first_line.windows(5).any(|w| w == b"HTTP/");
    let looks_http = method > 0 && matches!(line.get(method), Some(b' ' | b'\t'));
    if !looks_http && !says_http {
        let undecided = method == line.len() && method < MAX_METHOD;
        return if undecided {
            FirstFlight::Incomplete
        } else {
            FirstFlight::Other
        };
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => FirstFlight::Incomplete,
        Ok(httparse::Status::Complete(_)) => request_name(&req),
        Err(httparse::Error::TooManyHeaders) => {
            FirstFlight::Unreadable("more than 100 headers", Protocol::Http)
        }
        Err(_) => FirstFlight::Unreadable("a request head httparse cannot read", Protocol::Http),
    }
}

/// The one name a parsed request asks for: its `Host`, which an absolute-form or CONNECT
/// target must agree with.
fn request_name(req: &httparse::Request) -> FirstFlight {
    let unreadable = |why| FirstFlight::Unreadable(why, Protocol::Http);
    let mut hosts = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"));
    let host = match (hosts.next(), hosts.next()) {
        (Some(h), None) => match std::str::from_utf8(h.value) {
            Ok(v) => Some(strip_port(v.trim())),
            Err(_) => return unreadable("a Host that is not text"),
        },
        (None, _) => None,
        (Some(_), Some(_)) => return unreadable("two Host headers"),
    };
    let path = req.path.unwrap_or("");
    // `user@host`: the relay, the interceptor and servers may each take another part for
    // the host (issue 32), so a name with userinfo is none.
    if host.as_deref().is_some_and(|h| h.contains('@')) {
        return unreadable("userinfo ('@') in the Host");
    }
    let target = if req.method == Some("CONNECT") {
        Some(strip_port(path))
    } else {
        let lower = path.to_ascii_lowercase();
        ["http://", "https://"]
            .iter()
            .find(|s| lower.starts_with(**s))
            .map(|s| {
                let rest = &path[s.len()..];
                let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
                strip_port(&rest[..end])
            })
    };
    if target.as_deref().is_some_and(|t| t.contains('@')) {
        return unreadable("userinfo ('@') in the request target");
    }
    match (host, target) {
        (Some(h), Some(t)) if !h.eq_ignore_ascii_case(&t) => {
            unreadable("a request target and a Host naming different hosts")
        }
        (Some(h), _) => FirstFlight::Http(Some(h)),
        (None, t) => FirstFlight::Http(t),
    }
}

/// `name:port` → `name`; an IPv6 literal keeps its brackets (it names no host anyway).
fn strip_port(v: &str) -> String {
    if v.starts_with('[') {
        return v.split_once(']').map_or(v, |(a, _)| a).to_owned() + "]";
    }
    v.rsplit_once(':').map_or(v, |(h, _)| h).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal TLS 1.2 ClientHello with `sni` (None: no extension), in `records` records.
    fn hello(sni: Option<&str>, records: usize) -> Vec<u8> {
        let mut ext = Vec::new();
        if let Some(name) = sni {
            let n = name.as_bytes();
            let list_len = n.len() + 3;
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&((list_len + 2) as u16).to_be_bytes());
            ext.extend_from_slice(&(list_len as u16).to_be_bytes());
            ext.push(0);
            ext.extend_from_slice(&(n.len() as u16).to_be_bytes());
            ext.extend_from_slice(n);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let chunk = hs.len().div_ceil(records);
        let mut out = Vec::new();
        for part in hs.chunks(chunk) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    #[test]
    fn a_client_hello_gives_its_server_name_whole_or_in_records_and_waits_when_cut() {
        let h = hello(Some("a.example.org"), 1);
        assert_eq!(classify(&h), FirstFlight::Tls(Some("a.example.org".into())));
        assert_eq!(classify(&h[..h.len() - 1]), FirstFlight::Incomplete);
        assert_eq!(classify(&h[..3]), FirstFlight::Incomplete);
        let split = hello(Some("b.example.org"), 3);
        assert_eq!(
            classify(&split),
            FirstFlight::Tls(Some("b.example.org".into()))
        );
        assert_eq!(classify(&hello(None, 1)), FirstFlight::Tls(None));
    }

    #[test]
    fn garbage_after_a_handshake_byte_is_unreadable_tls_not_other() {
        let mut bad = vec![22, 3, 1, 0, 4, 2, 0, 0, 0];
        assert!(matches!(
            classify(&bad),
            FirstFlight::Unreadable(_, Protocol::Tls)
        ));
        bad[5] = 1;
        assert!(matches!(
            classify(&bad),
            FirstFlight::Unreadable(_, Protocol::Tls)
        ));
        let sslv2 = [0x80, 0x2e, 0x01, 0x03, 0x01];
        assert!(matches!(
            classify(&sslv2),
            FirstFlight::Unreadable(_, Protocol::Tls)
        ));
    }

    #[test]
    fn http_requests_give_their_host_and_targets_must_agree() {
        let get = |s: &str| classify(s.as_bytes());
        assert_eq!(
            get("GET / HTTP/1.1\r\nHost: a.test:8080\r\n\r\n"),
            FirstFlight::Http(Some("a.test".into()))
        );
        assert_eq!(
            get("\r\nget /x HTTP/1.0\r\nhOsT: B.test\r\n\r\n"),
            FirstFlight::Http(Some("B.test".into()))
        );
        assert_eq!(get("GET / HTTP/1.0\r\n\r\n"), FirstFlight::Http(None));
        assert_eq!(
            get("GET http://c.test:81/p HTTP/1.1\r\n\r\n"),
            FirstFlight::Http(Some("c.test".into()))
        );
        // issue 32: userinfo is read differently by the relay, the interceptor and servers.
        for head in [
            "GET http://u@c.test:81/p HTTP/1.1\r\n\r\n",
            "GET http://evil.test@c.test/ HTTP/1.1\r\nHost: c.test\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: evil.test@c.test\r\n\r\n",
            "CONNECT evil.test@c.test:443 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(get(head), FirstFlight::Unreadable(_, Protocol::Http)),
                "{head}"
            );
        }
        assert_eq!(
            get("CONNECT d.test:443 HTTP/1.1\r\nHost: d.test:443\r\n\r\n"),
            FirstFlight::Http(Some("d.test".into()))
        );
        assert!(matches!(
            get("GET http://e.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
            FirstFlight::Unreadable(_, Protocol::Http)
        ));
        assert!(matches!(
            get("GET / HTTP/1.1\r\nHost: a.test\r\nHost: e.test\r\n\r\n"),
            FirstFlight::Unreadable(_, Protocol::Http)
        ));
        assert!(matches!(
            get("GET / HTTP/1.1\r\nHost : e.test\r\n\r\n"),
            FirstFlight::Unreadable(_, Protocol::Http)
        ));
        assert!(matches!(
            get("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            FirstFlight::Unreadable(_, Protocol::Http)
        ));
        assert_eq!(get("GET / HTTP/1.1\r\nHost: a"), FirstFlight::Incomplete);
        assert_eq!(get("GE"), FirstFlight::Incomplete);
    }

    #[test]
    fn protocols_that_name_no_server_are_other() {
        for b in [
            &b"SSH-2.0-OpenSSH_9.6\r\n"[..],
            b"PING\r\n",
            b"*1\r\n$4\r\nPING\r\n",
            b"\x00\x00\x00\x08\x04\xd2\x16\x2f",
        ] {
            assert_eq!(classify(b), FirstFlight::Other, "{b:?}");
        }
    }
}
