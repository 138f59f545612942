//! Validated identifiers: [`RunId`] (names a run in storage, so it must be safe as a file name),
//! [`StepId`] (a step name plus its occurrence counter) and [`BranchKey`] (a `parallel` branch).
//! Raw strings become these once, at the edge; nothing below passes a bare `String` id.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::JournalError;

/// Longest accepted run id, in bytes.
pub const MAX_RUN_ID_LEN: usize = 128;
/// Longest accepted step name (after branch prefixes), in bytes.
pub const MAX_STEP_NAME_LEN: usize = 512;
/// Longest accepted branch key, in bytes.
pub const MAX_BRANCH_KEY_LEN: usize = 128;

/// The id of a journaled run: 1 to 128 ASCII letters, digits, `.`, `_` or `-`, not starting
/// with `.` (so it is always a safe file name for the file backend).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

impl RunId {
    /// Checks `input` and wraps it.
    pub fn parse(input: &str) -> Result<Self, JournalError> {
        let reason = if input.is_empty() {
            Some("is empty")
        } else if input.len() > MAX_RUN_ID_LEN {
            Some("is longer than 128 bytes")
        } else if input.starts_with('.') {
            Some("starts with '.'")
        } else if !input
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            Some("may only hold ASCII letters, digits, '.', '_' and '-'")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(JournalError::InvalidRunId {
                input: input.to_owned(),
                reason,
            }),
            None => Ok(Self(input.to_owned())),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The default name of a fork of this run made at `unix_ms`: `RUN.fork-<unix_ms>`, with
    /// `RUN` shortened so the result stays within `MAX_RUN_ID_LEN`.
    pub fn fork_name(&self, unix_ms: u64) -> Result<Self, JournalError> {
        let suffix = format!(".fork-{unix_ms}");
        let keep = MAX_RUN_ID_LEN
            .saturating_sub(suffix.len())
            .min(self.0.len());
        Self::parse(&format!("{}{suffix}", &self.0[..keep]))
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for RunId {
    type Error = JournalError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<RunId> for String {
    fn from(value: RunId) -> Self {
        value.0
    }
}

impl std::str::FromStr for RunId {
    type Err = JournalError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The id of one step within a run: the full step name for its first occurrence (`llm`), then
/// `llm#2`, `llm#3`, … for later occurrences in the same run.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StepId(String);

impl StepId {
    /// The id of the `occurrence`-th (1-based) call with `name`.
    pub(crate) fn new(name: &str, occurrence: u32) -> Self {
        if occurrence <= 1 {
            Self(name.to_owned())
        } else {
            Self(format!("{name}#{occurrence}"))
        }
    }

    /// Parses a step id as printed by [`StepId::as_str`] (for `fork --from-step`).
    pub fn parse(input: &str) -> Result<Self, JournalError> {
        let (name, counter) = match input.split_once('#') {
            Some((name, counter)) => (name, Some(counter)),
            None => (input, None),
        };
        validate_step_name(name)?;
        if let Some(counter) = counter {
            match counter.parse::<u32>() {
                Ok(n) if n >= 2 && counter == n.to_string() => {}
                _ => {
                    return Err(JournalError::InvalidStepName {
                        name: input.to_owned(),
                        reason: "occurrence counter after '#' must be a number >= 2",
                    })
                }
            }
        }
        Ok(Self(input.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StepId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for StepId {
    type Err = JournalError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Checks a step name as passed to `record` (before or after branch prefixing).
pub(crate) fn validate_step_name(name: &str) -> Result<(), JournalError> {
    let reason = if name.is_empty() {
        Some("is empty")
    } else if name.contains('#') {
        Some("contains '#', which is reserved as the occurrence-counter separator")
    } else if name.len() > MAX_STEP_NAME_LEN {
        Some("is longer than 512 bytes")
    } else if name.chars().any(char::is_control) {
        Some("contains a control character")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(JournalError::InvalidStepName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// The key of one branch of [`Run::parallel`](crate::Run::parallel). Step names inside the
/// branch become `KEY:name`. A key is 1 to 128 bytes with no `#` (the counter separator), no
/// `:` (the prefix separator: a key `a:b` would collide with branch `b` nested in branch `a`),
/// and no whitespace or control characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BranchKey(String);

impl BranchKey {
    /// Checks `input` and wraps it.
    pub fn parse(input: &str) -> Result<Self, JournalError> {
        let reason = if input.is_empty() {
            Some("is empty")
        } else if input.len() > MAX_BRANCH_KEY_LEN {
            Some("is longer than 128 bytes")
        } else if input.contains('#') {
            Some("contains '#', which is reserved as the occurrence-counter separator")
        } else if input.contains(':') {
            Some("contains ':', which separates nested branch prefixes")
        } else if input.chars().any(|c| c.is_whitespace() || c.is_control()) {
            Some("contains whitespace or a control character")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(JournalError::InvalidBranchKey {
                key: input.to_owned(),
                reason,
            }),
            None => Ok(Self(input.to_owned())),
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BranchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_id_rejects_unsafe_names() {
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a b",
            "ü",
            &"x".repeat(129),
        ] {
            let err = RunId::parse(bad).unwrap_err();
            assert_eq!(err.code(), "INVALID_RUN_ID", "{bad:?}");
        }
        assert_eq!(RunId::parse("run-1.a_b").unwrap().as_str(), "run-1.a_b");
    }

    #[test]
    fn fork_names_stay_valid() {
        let short = RunId::parse("r1").unwrap();
        assert_eq!(short.fork_name(42).unwrap().as_str(), "r1.fork-42");
        let long = RunId::parse(&"x".repeat(MAX_RUN_ID_LEN)).unwrap();
        let fork = long.fork_name(1_700_000_000_000).unwrap();
        assert_eq!(fork.as_str().len(), MAX_RUN_ID_LEN);
        assert!(fork.as_str().ends_with(".fork-1700000000000"));
    }

    #[test]
    fn step_id_counts_from_second_occurrence() {
        assert_eq!(StepId::new("llm", 1).as_str(), "llm");
        assert_eq!(StepId::new("llm", 2).as_str(), "llm#2");
        assert_eq!(StepId::parse("llm#3").unwrap().as_str(), "llm#3");
        assert!(StepId::parse("llm#1").is_err());
        assert!(StepId::parse("llm#02").is_err());
        assert!(StepId::parse("llm#x").is_err());
        assert!(StepId::parse("#2").is_err());
    }

    #[test]
    fn step_names_reject_hash() {
        let err = validate_step_name("a#b").unwrap_err();
        assert_eq!(err.code(), "INVALID_STEP_NAME");
        assert!(validate_step_name("tool:search").is_ok());
    }

    #[test]
    fn branch_keys_reject_separators() {
        for bad in ["", "a:b", "a#b", "a b", "\n"] {
            assert_eq!(
                BranchKey::parse(bad).unwrap_err().code(),
                "INVALID_BRANCH_KEY",
                "{bad:?}"
            );
        }
        assert!(BranchKey::parse("item-42").is_ok());
    }

    proptest::proptest! {
        #[test]
        fn run_id_accepts_exactly_the_documented_set(s in "[a-zA-Z0-9._/ -]{0,130}") {
            let ok = !s.is_empty()
                && s.len() <= MAX_RUN_ID_LEN
                && !s.starts_with('.')
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            proptest::prop_assert_eq!(RunId::parse(&s).is_ok(), ok);
        }

        #[test]
        fn step_ids_parse_back(name in "[a-z][a-z:_ ]{0,20}", n in 1u32..10_000) {
            let id = StepId::new(&name, n);
            proptest::prop_assert_eq!(StepId::parse(id.as_str()).unwrap(), id);
        }
    }
}
