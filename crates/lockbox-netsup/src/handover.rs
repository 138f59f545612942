//! The command child's network filter, handed to the supervisor: fixed-size records on their
//! own socket, in the form of `lockbox-confine`'s reports (four native-endian words, the first
//! a kind; both ends are the same machine).

/// Size of an encoded record (that of `lockbox-confine`'s reports).
pub const RECORD_LEN: usize = 16;
/// Distinct from the kinds of `lockbox-confine`'s records (1 to 6), so that a record read the
/// wrong way round is garbage, not a status.
const KIND_NET_HANDOVER: u32 = 7;
const KIND_NET_TAKEN: u32 = 8;

/// The command child's network filter, handed to the network supervisor on its own socket:
/// the listener's descriptor number in the child, which the supervisor copies with
/// `pidfd_getfd` (the credentials of the message give the pid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetHandover {
    /// The seccomp listener's descriptor in the command child.
    pub listener: i32,
    /// The resolver's UDP socket in the sandbox's namespace (`-1`: none).
    pub dns_udp: i32,
    /// The resolver's TCP listener in the sandbox's namespace (`-1`: none).
    pub dns_tcp: i32,
}

/// The supervisor's answer to a [`NetHandover`]: it holds its copy of the listener, so the
/// child may close its own and execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetTaken;

impl NetHandover {
    /// Encodes to the wire form.
    pub fn encode(self) -> [u8; RECORD_LEN] {
        encode_words([
            KIND_NET_HANDOVER,
            self.listener as u32,
            self.dns_udp as u32,
            self.dns_tcp as u32,
        ])
    }

    /// Decodes the wire form; `None` for garbage.
    pub fn decode(bytes: &[u8; RECORD_LEN]) -> Option<NetHandover> {
        (decode_word(bytes, 0) == KIND_NET_HANDOVER).then(|| NetHandover {
            listener: decode_word(bytes, 1) as i32,
            dns_udp: decode_word(bytes, 2) as i32,
            dns_tcp: decode_word(bytes, 3) as i32,
        })
    }
}

impl NetTaken {
    /// Encodes to the wire form.
    pub fn encode(self) -> [u8; RECORD_LEN] {
        encode_words([KIND_NET_TAKEN, 0, 0, 0])
    }

    /// Decodes the wire form; `None` for garbage. Allocation-free: the child reads it.
    pub fn decode(bytes: &[u8; RECORD_LEN]) -> Option<NetTaken> {
        (decode_word(bytes, 0) == KIND_NET_TAKEN).then_some(NetTaken)
    }
}

fn encode_words(words: [u32; 4]) -> [u8; RECORD_LEN] {
    let mut out = [0u8; RECORD_LEN];
    for (i, word) in words.into_iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
    }
    out
}

fn decode_word(bytes: &[u8; RECORD_LEN], i: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&bytes[i * 4..i * 4 + 4]);
    u32::from_ne_bytes(w)
}
