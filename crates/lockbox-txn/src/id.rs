//! [`TxnId`]: the validated name of a transaction (its directory in the store).

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::TxnError;

/// A transaction id: 1 to 64 of `[A-Za-z0-9_-]`, not starting with `-`.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct TxnId(String);

impl TxnId {
    /// Checks `s`.
    pub fn parse(s: &str) -> Result<TxnId, TxnError> {
        let bad = |reason| TxnError::InvalidId {
            id: s.to_owned(),
            reason,
        };
        if s.is_empty() || s.len() > 64 {
            return Err(bad("must be 1 to 64 characters"));
        }
        if s.starts_with('-') {
            return Err(bad("must not start with '-'"));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(bad("only letters, digits, '-' and '_' are allowed"));
        }
        Ok(TxnId(s.to_owned()))
    }

    /// A fresh id: `t` + time in microseconds + pid + a per-process counter (hex), unique
    /// on one machine.
    pub fn generate() -> TxnId {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or_default();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        TxnId(format!("t{micros:x}-{:x}-{n:x}", std::process::id()))
    }

    /// The id of the transaction keyed `key` (any text, e.g. a journal's `run/step#2`):
    /// `k` + 32 hex digits of its SHA-256, the same in every process.
    pub fn for_key(key: &str) -> TxnId {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(key.as_bytes());
        let mut id = String::from("k");
        for b in &digest[..16] {
            id.push_str(&format!("{b:02x}"));
        }
        TxnId(id)
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for TxnId {
    type Error = TxnError;
    fn try_from(s: String) -> Result<TxnId, TxnError> {
        TxnId::parse(&s)
    }
}

impl From<TxnId> for String {
    fn from(id: TxnId) -> String {
        id.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_reject_paths_and_empty() {
        for bad in ["", ".", "..", "a/b", "-x", "a b"] {
            assert!(TxnId::parse(bad).is_err(), "{bad}");
        }
        assert!(TxnId::parse("t12-ab_C").is_ok());
        let (a, b) = (TxnId::generate(), TxnId::generate());
        assert_ne!(a, b);
        assert!(TxnId::parse(a.as_str()).is_ok());
        let k = TxnId::for_key("run/step#2");
        assert_eq!(k, TxnId::for_key("run/step#2"));
        assert_ne!(k, TxnId::for_key("run/step#3"));
        assert!(TxnId::parse(k.as_str()).is_ok());
    }
}
