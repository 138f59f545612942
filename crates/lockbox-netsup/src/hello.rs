//! The server name a TLS ClientHello asks for: just enough of RFC 8446 §4.1.2 (and RFC 5246
//! §7.4.1.2, whose layout it shares) and RFC 6066 §3 to find the `server_name` extension.
//!
//! Hand-written rather than taken from a TLS parsing crate: lockbox reads one field of one
//! message, and the crate it used for that (tls-parser) brought nom, its macros and eight
//! duplicated crates into the build that every other crate waits for. Every length is
//! checked against what is left before it is used; the reader is fuzzed
//! (`fuzz/fuzz_targets/client_hello.rs`).

/// What the first records of a TLS connection say about the server name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// The ClientHello is not complete yet: read more.
    Incomplete,
    /// A ClientHello and its `server_name` host name, if it has one.
    ServerName(Option<String>),
    /// Not a ClientHello that names at most one server (why).
    Unreadable(&'static str),
}

/// Content type of a handshake record (RFC 8446 §5.1).
pub const HANDSHAKE_RECORD: u8 = 22;
/// Handshake message type of a ClientHello.
const CLIENT_HELLO: u8 = 1;
/// Extension number of `server_name` (RFC 6066 §3).
const SERVER_NAME: u16 = 0;
/// `NameType` of a host name.
const HOST_NAME: u8 = 0;
/// Largest plaintext record (RFC 8446 §5.1: "MUST NOT exceed 2^14 bytes").
const MAX_RECORD: usize = 1 << 14;

/// Reassembles the handshake records at the start of `buf` until one handshake message is
/// whole (it may span records) and reads its server name. A message longer than `max`
/// bytes is unreadable.
pub fn server_name(buf: &[u8], max: usize) -> Hello {
    let mut rest = buf;
    let mut handshake = Vec::new();
    let message_len = loop {
        let Some((header, after)) = rest.split_first_chunk::<5>() else {
            return Hello::Incomplete;
        };
        let [kind, _major, _minor, hi, lo] = *header;
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if kind != HANDSHAKE_RECORD {
            return Hello::Unreadable("a TLS record other than a handshake before the ClientHello");
        }
        if len > MAX_RECORD {
            return Hello::Unreadable("not a TLS record (longer than 16 KiB)");
        }
        let Some((data, after)) = after.split_at_checked(len) else {
            return Hello::Incomplete;
        };
        rest = after;
        handshake.extend_from_slice(data);
        if let [_, a, b, c, ..] = handshake[..] {
            let message_len = (usize::from(a) << 16) | (usize::from(b) << 8) | usize::from(c);
            if message_len + 4 > max {
                return Hello::Unreadable("ClientHello larger than 32 KiB");
            }
            if handshake.len() >= message_len + 4 {
                break message_len;
            }
        }
    };
    if handshake[0] != CLIENT_HELLO {
        return Hello::Unreadable("a TLS handshake message other than a ClientHello");
    }
    match client_hello(&handshake[4..4 + message_len]) {
        Ok(name) => Hello::ServerName(name),
        Err(why) => Hello::Unreadable(why),
    }
}

/// A ClientHello's body: its server name.
fn client_hello(body: &[u8]) -> Result<Option<String>, &'static str> {
    const CUT: &str = "a ClientHello cut short";
    let mut r = Reader(body);
    r.take(2 + 32).ok_or(CUT)?; // legacy_version, random
    r.vec8().ok_or(CUT)?; // legacy_session_id
    r.vec16().ok_or(CUT)?; // cipher_suites
    r.vec8().ok_or(CUT)?; // legacy_compression_methods
    if r.0.is_empty() {
        return Ok(None); // TLS 1.2 and older may end here: no extensions
    }
    let mut extensions = Reader(r.vec16().ok_or("ClientHello extensions cut short")?);
    if !r.0.is_empty() {
        return Err("bytes after a ClientHello's extensions");
    }
    let mut found = None;
    while !extensions.0.is_empty() {
        let kind = extensions.u16().ok_or("ClientHello extensions cut short")?;
        let data = extensions
            .vec16()
            .ok_or("ClientHello extensions cut short")?;
        if kind == SERVER_NAME {
            if found.is_some() {
                return Err("two server_name extensions");
            }
            found = Some(data);
        }
    }
    found.map(host_name).transpose()
}

/// A `server_name` extension's one host name (RFC 6066 §3: "MUST NOT contain more than one
/// name of the same name_type").
fn host_name(extension: &[u8]) -> Result<String, &'static str> {
    const BAD: &str = "a server_name extension without exactly one host name";
    let mut outer = Reader(extension);
    let mut list = Reader(outer.vec16().ok_or(BAD)?);
    if !outer.0.is_empty() {
        return Err(BAD);
    }
    let mut hosts = Vec::new();
    while !list.0.is_empty() {
        let kind = list.u8().ok_or(BAD)?;
        let name = list.vec16().ok_or(BAD)?;
        if kind == HOST_NAME {
            hosts.push(name);
        }
    }
    let [name] = hosts[..] else {
        return Err(BAD);
    };
    String::from_utf8(name.to_vec()).map_err(|_| "a server name that is not text")
}

/// Big-endian fields and length-prefixed vectors, each `None` when the bytes run out.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        let (head, rest) = self.0.split_first_chunk::<2>()?;
        self.0 = rest;
        Some(u16::from_be_bytes(*head))
    }

    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello body with these extensions (`None`: the body ends after compression).
    fn body(extensions: Option<&[u8]>) -> Vec<u8> {
        let mut b = vec![3, 3];
        b.extend_from_slice(&[7; 32]);
        b.extend_from_slice(&[1, 9]); // a one-byte session id
        b.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
        b.extend_from_slice(&[1, 0]);
        if let Some(e) = extensions {
            b.extend_from_slice(&(e.len() as u16).to_be_bytes());
            b.extend_from_slice(e);
        }
        b
    }

    fn ext(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut e = kind.to_be_bytes().to_vec();
        e.extend_from_slice(&(data.len() as u16).to_be_bytes());
        e.extend_from_slice(data);
        e
    }

    fn names(entries: &[(u8, &[u8])]) -> Vec<u8> {
        let mut list = Vec::new();
        for (kind, name) in entries {
            list.push(*kind);
            list.extend_from_slice(&(name.len() as u16).to_be_bytes());
            list.extend_from_slice(name);
        }
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        data
    }

    fn record(body: &[u8]) -> Vec<u8> {
        let mut hs = vec![CLIENT_HELLO];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(body);
        let mut out = vec![HANDSHAKE_RECORD, 3, 1];
        out.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        out.extend_from_slice(&hs);
        out
    }

    fn read(body: &[u8]) -> Hello {
        server_name(&record(body), 32 << 10)
    }

    #[test]
    fn the_server_name_is_found_among_other_extensions() {
        let mut e = ext(10, &[0, 2, 0, 29]);
        e.extend(ext(SERVER_NAME, &names(&[(HOST_NAME, b"a.example")])));
        e.extend(ext(43, &[2, 3, 4]));
        assert_eq!(
            read(&body(Some(&e))),
            Hello::ServerName(Some("a.example".into()))
        );
        assert_eq!(read(&body(None)), Hello::ServerName(None));
        assert_eq!(read(&body(Some(&ext(10, &[])))), Hello::ServerName(None));
    }

    #[test]
    fn ambiguous_or_broken_names_are_unreadable() {
        let two_extensions = [
            ext(SERVER_NAME, &names(&[(HOST_NAME, b"a.test")])),
            ext(SERVER_NAME, &names(&[(HOST_NAME, b"b.test")])),
        ]
        .concat();
        let cases: [(&[u8], &str); 6] = [
            (&two_extensions, "two server_name extensions"),
            (
                &ext(
                    SERVER_NAME,
                    &names(&[(HOST_NAME, b"a.test"), (HOST_NAME, b"b.test")]),
                ),
                "exactly one host name",
            ),
            (
                &ext(SERVER_NAME, &names(&[(7, b"a.test")])),
                "exactly one host name",
            ),
            (
                &ext(SERVER_NAME, &names(&[(HOST_NAME, b"\xff.test")])),
                "not text",
            ),
            (&ext(SERVER_NAME, &[0, 9, 0]), "exactly one host name"),
            (&[0, 0, 0, 9], "cut short"),
        ];
        for (extensions, why) in cases {
            match read(&body(Some(extensions))) {
                Hello::Unreadable(got) => assert!(got.contains(why), "{got} / {why}"),
                other => panic!("{other:?} for {extensions:?}"),
            }
        }
        let mut trailing = body(Some(&[]));
        trailing.push(0);
        assert!(matches!(read(&trailing), Hello::Unreadable(_)));
    }

    #[test]
    fn every_cut_of_a_hello_is_incomplete_or_unreadable_never_a_name() {
        let e = ext(SERVER_NAME, &names(&[(HOST_NAME, b"a.example")]));
        let whole = record(&body(Some(&e)));
        for n in 0..whole.len() {
            assert_eq!(server_name(&whole[..n], 32 << 10), Hello::Incomplete, "{n}");
        }
        // A message that says it is longer than its body is cut short inside it.
        let mut lying = whole.clone();
        lying[8] += 1;
        lying[4] += 1;
        lying.push(0);
        assert!(matches!(
            server_name(&lying, 32 << 10),
            Hello::Unreadable(_)
        ));
    }

    #[test]
    fn oversized_records_and_messages_are_unreadable() {
        let mut big = vec![HANDSHAKE_RECORD, 3, 1, 0x40, 1];
        big.extend_from_slice(&[0; 16]);
        assert!(matches!(server_name(&big, 32 << 10), Hello::Unreadable(_)));
        let huge_message = [HANDSHAKE_RECORD, 3, 1, 0, 4, CLIENT_HELLO, 1, 0, 0];
        assert!(matches!(
            server_name(&huge_message, 32 << 10),
            Hello::Unreadable(_)
        ));
    }
}
