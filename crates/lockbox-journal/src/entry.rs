//! The journal entry and its one canonical encoding, shared by every backend.
//!
//! An entry is stored as one line of JSON (no newline inside):
//!
//! ```text
//! {"crc32":"1c291ca3","entry":{"format":1,"run":"r1","offset":3,"session":2,"at_ms":1700000000000,"kind":"step","step_id":"llm#2","name":"llm","outcome":{"ok":"hi"}}}
//! ```
//!
//! `crc32` is CRC-32 (IEEE) of the exact bytes of the `entry` value as stored, so a reader
//! checks them without re-serialising. `format` is [`FORMAT_VERSION`]; a reader refuses other
//! versions rather than guess.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::id::{RunId, StepId};

/// The entry format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// One journal entry, as decoded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Entry format version ([`FORMAT_VERSION`]).
    pub format: u32,
    /// The run it belongs to.
    pub run: RunId,
    /// Position in the run, from 0, without gaps.
    pub offset: u64,
    /// The session that wrote it.
    pub session: u64,
    /// Wall-clock time of the append, in milliseconds since the Unix epoch (informational).
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub body: EntryBody,
}

/// What an entry records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum EntryBody {
    /// A session started. The first start of a run fixes its version and metadata.
    Start {
        /// The code version the caller declared.
        version: Option<String>,
        /// Caller metadata (JSON).
        metadata: serde_json::Value,
    },
    /// A step finished (successfully or with a journaled error).
    Step {
        /// Deterministic id (`name`, `name#2`, …).
        step_id: StepId,
        /// The full name passed to `record` (with branch prefixes).
        name: String,
        /// The journaled result.
        outcome: StepOutcome,
    },
    /// The run waits for an outside event.
    Suspend {
        /// Id of the suspension point (from the same counters as steps).
        step_id: StepId,
        /// The event name passed to `suspend`.
        event: String,
        /// What the run told the outside world.
        payload: serde_json::Value,
    },
    /// The outside event arrived.
    Resume {
        /// The suspension this answers.
        step_id: StepId,
        /// The value delivered to the run.
        value: serde_json::Value,
    },
    /// The run finished successfully.
    Complete {
        /// The run's result.
        value: serde_json::Value,
    },
    /// The run finished with an error.
    Error {
        /// The run's error.
        error: serde_json::Value,
    },
    /// The run was cancelled.
    Cancel {
        /// Why.
        reason: String,
    },
}

impl EntryBody {
    /// The lifecycle word of the entry (`start`, `step`, …).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Start { .. } => "start",
            Self::Step { .. } => "step",
            Self::Suspend { .. } => "suspend",
            Self::Resume { .. } => "resume",
            Self::Complete { .. } => "complete",
            Self::Error { .. } => "error",
            Self::Cancel { .. } => "cancel",
        }
    }
}

/// A journaled step result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepOutcome {
    /// The step's value.
    Ok(serde_json::Value),
    /// The step's (non-retryable) error.
    Err(serde_json::Value),
}

/// An entry as a backend stores it: position, writer session and the checksummed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntry {
    /// Position in the run.
    pub offset: u64,
    /// The session that wrote it (backends fence on it).
    pub session: u64,
    /// The encoded line, without a trailing newline.
    pub line: String,
}

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    crc32: String,
    entry: &'a RawValue,
}

#[derive(Deserialize)]
struct EnvelopeIn<'a> {
    crc32: &'a str,
    #[serde(borrow)]
    entry: &'a RawValue,
}

/// Encodes an entry into its stored line.
pub fn encode(entry: &Entry) -> Result<RawEntry, serde_json::Error> {
    let body = serde_json::value::to_raw_value(entry)?;
    let crc = crc32fast::hash(body.get().as_bytes());
    let line = serde_json::to_string(&EnvelopeOut {
        crc32: format!("{crc:08x}"),
        entry: &body,
    })?;
    Ok(RawEntry {
        offset: entry.offset,
        session: entry.session,
        line,
    })
}

/// Why a stored line does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeFailure {
    /// The line is not valid JSON of the envelope shape.
    Malformed(String),
    /// The checksum does not match.
    Checksum {
        /// Checksum in the line.
        stored: String,
        /// Checksum of the bytes.
        computed: String,
    },
    /// Written by another format version.
    Format(u32),
}

impl std::fmt::Display for DecodeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Malformed(e) => write!(f, "malformed entry: {e}"),
            Self::Checksum { stored, computed } => {
                write!(f, "checksum mismatch: stored {stored}, computed {computed}")
            }
            Self::Format(v) => write!(f, "unsupported format version {v}"),
        }
    }
}

/// Decodes and checks a stored line.
pub fn decode(line: &str) -> Result<Entry, DecodeFailure> {
    let env: EnvelopeIn<'_> =
        serde_json::from_str(line).map_err(|e| DecodeFailure::Malformed(e.to_string()))?;
    let computed = format!("{:08x}", crc32fast::hash(env.entry.get().as_bytes()));
    if computed != env.crc32 {
        return Err(DecodeFailure::Checksum {
            stored: env.crc32.to_owned(),
            computed,
        });
    }
    #[derive(Deserialize)]
    struct Format {
        format: u32,
    }
    let format: Format = serde_json::from_str(env.entry.get())
        .map_err(|e| DecodeFailure::Malformed(e.to_string()))?;
    if format.format != FORMAT_VERSION {
        return Err(DecodeFailure::Format(format.format));
    }
    serde_json::from_str(env.entry.get()).map_err(|e| DecodeFailure::Malformed(e.to_string()))
}

/// Milliseconds since the Unix epoch, for `at_ms`.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Entry {
        Entry {
            format: FORMAT_VERSION,
            run: RunId::parse("r1").unwrap(),
            offset: 3,
            session: 2,
            at_ms: 5,
            body: EntryBody::Step {
                step_id: StepId::new("llm", 2),
                name: "llm".into(),
                outcome: StepOutcome::Ok(serde_json::json!({"text": "hi"})),
            },
        }
    }

    #[test]
    fn round_trips_and_is_one_line() {
        let raw = encode(&sample()).unwrap();
        assert!(!raw.line.contains('\n'));
        assert!(raw.line.contains(r#""kind":"step""#), "{}", raw.line);
        assert_eq!((raw.offset, raw.session), (3, 2));
        assert_eq!(decode(&raw.line).unwrap(), sample());
    }

    #[test]
    fn flipped_byte_fails_checksum() {
        let raw = encode(&sample()).unwrap();
        let bad = raw.line.replace("\"hi\"", "\"ho\"");
        assert!(matches!(decode(&bad), Err(DecodeFailure::Checksum { .. })));
        assert!(matches!(
            decode(&raw.line[..raw.line.len() - 3]),
            Err(DecodeFailure::Malformed(_))
        ));
    }

    #[test]
    fn other_format_version_is_refused() {
        let mut e = sample();
        e.format = 2;
        let raw = encode(&e).unwrap();
        assert_eq!(decode(&raw.line), Err(DecodeFailure::Format(2)));
    }

    proptest::proptest! {
        #[test]
        fn any_step_value_round_trips(text in ".*", n in proptest::num::i64::ANY, offset in 0u64..1_000_000) {
            let mut e = sample();
            e.offset = offset;
            e.body = EntryBody::Step {
                step_id: StepId::new("s", 1),
                name: "s".into(),
                outcome: StepOutcome::Ok(serde_json::json!({"text": text, "n": n})),
            };
            let raw = encode(&e).unwrap();
            proptest::prop_assert!(!raw.line.contains('\n'));
            proptest::prop_assert_eq!(decode(&raw.line).unwrap(), e);
        }

        /// Changing any one byte of a stored line never yields another valid entry.
        #[test]
        fn any_single_byte_change_is_detected(pos in 0usize..10_000, byte in 0x20u8..0x7f) {
            let raw = encode(&sample()).unwrap();
            let mut bytes = raw.line.clone().into_bytes();
            let pos = pos % bytes.len();
            proptest::prop_assume!(bytes[pos] != byte);
            bytes[pos] = byte;
            let line = String::from_utf8(bytes).unwrap();
            match decode(&line) {
                Err(_) => {}
                Ok(e) => proptest::prop_assert_eq!(e, sample()),
            }
        }
    }
}
