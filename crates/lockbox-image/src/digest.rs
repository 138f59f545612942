//! [`Digest`]: a validated `sha256:<hex>` content address, and hashing while copying.

use crate::error::ImageError;
use sha2::{Digest as _, Sha256};
use std::fmt;

/// A sha256 content digest (`sha256:` and 64 lower-case hex digits). Other algorithms are
/// refused: every registry serves sha256, and a digest is used as a file name in the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses and validates a digest.
    pub fn parse(text: &str) -> Result<Digest, ImageError> {
        let hex = text
            .strip_prefix("sha256:")
            .ok_or_else(|| ImageError::BadDigest(text.to_owned()))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(ImageError::BadDigest(text.to_owned()));
        }
        Ok(Digest(text.to_owned()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest a finished hasher holds.
    pub fn from_hasher(h: Sha256) -> Digest {
        let out = h.finalize();
        let mut s = String::with_capacity(71);
        s.push_str("sha256:");
        for b in out.iter() {
            s.push_str(&format!("{b:02x}"));
        }
        Digest(s)
    }

    /// The 64 hex digits (the store's file name for it).
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

    /// The whole `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, as `docker images` shows ids.
    pub fn short(&self) -> &str {
        &self.0[7..19]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A reader that hashes (and counts) what passes through it.
pub(crate) struct HashingReader<R> {
    pub inner: R,
    pub hasher: Sha256,
    pub count: u64,
}

impl<R> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }
}

impl<R: std::io::Read> std::io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}
