//! [`BranchId`]: the validated name of a branch, also its directory name in the state dir.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::CowError;

/// The id of a branch: 1–64 bytes of `[A-Za-z0-9._-]`, not starting with `.` (so never `.`,
/// `..` or a hidden temp name) and never containing `/`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct BranchId(String);

impl BranchId {
    /// Checks `s` and wraps it.
    pub fn parse(s: &str) -> Result<BranchId, CowError> {
        check_id(s).map_err(|reason| CowError::InvalidBranchId {
            id: s.to_owned(),
            reason,
        })?;
        Ok(BranchId(s.to_owned()))
    }

    /// A fresh id: `b<unix seconds, hex>-<pid, hex>-<counter and nanos, hex>`, unique within
    /// one host as long as the clock does not step back into the same second in the same pid.
    pub fn generate() -> BranchId {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        BranchId(format!(
            "b{:x}-{:x}-{:x}{:08x}",
            now.as_secs(),
            std::process::id(),
            n,
            now.subsec_nanos()
        ))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why `s` is not a valid id (of a branch, a snapshot, a hold), if it is not.
pub(crate) fn check_id(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("empty");
    }
    if s.len() > 64 {
        return Err("longer than 64 bytes");
    }
    if s.starts_with('.') {
        return Err("starts with '.'");
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("only A-Z a-z 0-9 . _ - are allowed");
    }
    Ok(())
}

impl fmt::Display for BranchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for BranchId {
    type Err = CowError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BranchId::parse(s)
    }
}

impl<'de> serde::Deserialize<'de> for BranchId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        BranchId::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_dangerous_ids() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            ".hidden",
            "a b",
            "x\0",
            &"a".repeat(65),
        ] {
            assert!(BranchId::parse(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "b1-2_3.x", "ABC"] {
            assert_eq!(BranchId::parse(good).unwrap().as_str(), good);
        }
    }

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let a = BranchId::generate();
        let b = BranchId::generate();
        assert_ne!(a, b);
        assert_eq!(BranchId::parse(a.as_str()).unwrap(), a);
    }
}
