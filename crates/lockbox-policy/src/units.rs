//! Sizes and durations as users write them (`64M`, `1.5GiB`, `500ms`, `2m`).

use crate::error::PolicyError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A size in bytes. Parses `4096`, `512K`, `64M`, `64MiB`, `1.5G`, `2T`; every multiplier is
/// binary (K = 1024), as for `ulimit` and container runtimes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| PolicyError::BadSize {
            input: s.to_owned(),
            reason: reason.to_owned(),
        };
        let (num, unit) = split_number(s);
        if num.is_empty() {
            return Err(bad("expected a number, e.g. 64M"));
        }
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(bad("unknown unit (use B, K, M, G or T)")),
        };
        let bytes = scale_decimal(num, 1u128 << shift).ok_or_else(|| bad("not a number"))?;
        u64::try_from(bytes)
            .map(ByteSize)
            .map_err(|_| bad("too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u32); 4] = [("T", 40), ("G", 30), ("M", 20), ("K", 10)];
        for (name, shift) in UNITS {
            if self.0 >= 1 << shift && self.0 % (1 << shift) == 0 {
                return write!(f, "{}{name}", self.0 >> shift);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for ByteSize {
    /// A number of bytes; as text (`"10000000T"`) beyond `i64::MAX`, which TOML integers
    /// cannot hold (found by fuzzing `policy_toml`: such a profile parsed but did not
    /// serialise).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match i64::try_from(self.0) {
            Ok(_) => s.serialize_u64(self.0),
            Err(_) => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// What [`ByteSize`]'s `Deserialize` takes: component `ByteSizeValue` of lockbox-server's
/// OpenAPI document.
#[cfg(feature = "openapi")]
#[allow(deprecated)]
impl utoipa::PartialSchema for ByteSize {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{
            KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type,
        };
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                    .minimum(Some(0))
                    .description(Some("Bytes.")),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    // `example` (OpenAPI 3.0's form), as utoipa's derive writes a
                    // field's example: the document keeps one form.
                    .example(Some("512M".into()))
                    .description(Some("Text with a unit (B, K, M, G, T; binary multiples).")),
            )
            .description(Some(
                "A size (`lockbox_policy::ByteSize`): bytes, or text with a unit (`512M`).",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for ByteSize {
    fn name() -> std::borrow::Cow<'static, str> {
        "ByteSizeValue".into()
    }
}

/// Splits `"1.5G"` into the number and the unit (`("1.5", "G")`), ignoring surrounding space.
fn split_number(s: &str) -> (&str, &str) {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    t.split_at(split)
}

/// Most digits after the point that count: beyond them a fraction changes less than a
/// nanosecond or a byte for every unit here, and `10^24 * unit` still fits a `u128`.
const MAX_FRACTION_DIGITS: usize = 24;

/// `num` (ASCII digits with at most one `.`, as [`split_number`] yields) times `unit`,
/// exactly, rounded down; `None` if malformed or beyond `u128`. Exact, unlike `f64`: a value
/// that is printed and parsed again must come back unchanged (found by fuzzing, see
/// docs/fuzzing.md).
fn scale_decimal(num: &str, unit: u128) -> Option<u128> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    let digits = |s: &str| -> Option<u128> {
        s.bytes().try_fold(0u128, |acc, b| {
            acc.checked_mul(10)?
                .checked_add(u128::from(b.checked_sub(b'0').filter(|d| *d < 10)?))
        })
    };
    let frac = &frac[..frac.len().min(MAX_FRACTION_DIGITS)];
    let scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    let whole = digits(int)?.checked_mul(unit)?;
    whole.checked_add(digits(frac)?.checked_mul(unit)? / scale)
}

/// Parses `500ms`, `10s`, `1.5s`, `2m`, `1h`, `250us`; a bare number is seconds. Exact to the
/// nanosecond (finer fractions are rounded down).
pub fn parse_duration(s: &str) -> Result<Duration, PolicyError> {
    let bad = |reason: &str| PolicyError::BadDuration {
        input: s.to_owned(),
        reason: reason.to_owned(),
    };
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return Err(bad("expected a number with a unit, e.g. 500ms, 10s, 2m"));
    }
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let nanos_per_unit: u128 = match unit.trim() {
        "" | "s" | "sec" | "secs" => NANOS_PER_SEC,
        "ms" => 1_000_000,
        "us" | "µs" => 1_000,
        "ns" => 1,
        "m" | "min" | "mins" => 60 * NANOS_PER_SEC,
        "h" | "hr" | "hrs" => 3600 * NANOS_PER_SEC,
        _ => return Err(bad("unknown unit (use ns, us, ms, s, m or h)")),
    };
    let nanos = scale_decimal(num, nanos_per_unit).ok_or_else(|| bad("not a number"))?;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).map_err(|_| bad("out of range"))?;
    // The remainder is below 10^9, so it fits.
    Ok(Duration::new(secs, (nanos % NANOS_PER_SEC) as u32))
}

/// Formats a duration so that [`parse_duration`] reads it back exactly.
pub(crate) fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos % 1_000_000_000 == 0 {
        format!("{}s", d.as_secs())
    } else if nanos % 1_000_000 == 0 {
        format!("{}ms", nanos / 1_000_000)
    } else {
        format!("{nanos}ns")
    }
}

/// A duration for people: `0.4 ms`, `139 ms`, `2.3 s`, `4 min 5 s`. Not for parsing back
/// (that is [`Policy`](crate::Policy)'s serialised form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_secs_f64() * 1e3;
        if ms < 10.0 {
            write!(f, "{ms:.1} ms")
        } else if ms < 1000.0 {
            write!(f, "{} ms", ms.round())
        } else if ms < 60_000.0 {
            write!(f, "{:.1} s", ms / 1e3)
        } else {
            let s = self.0.as_secs();
            write!(f, "{} min {} s", s / 60, s % 60)
        }
    }
}

/// A size for people: `512 B`, `4.0 KiB`, `1.5 MiB`, `2.0 GiB` (binary units, one decimal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut v = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while v >= 1024.0 && unit + 1 < UNITS.len() {
            v /= 1024.0;
            unit += 1;
        }
        write!(f, "{v:.1} {}", UNITS[unit])
    }
}

/// `1 change`, `3 changes`: a count with its noun, plural when it is not one (the noun is
/// made plural with an `s`).
pub fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

pub(crate) mod duration_serde {
    //! `Duration` as a human string ("1500ms"); integers are read as seconds.
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Float(f64),
        Text(String),
    }

    pub(crate) fn parse_raw<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Duration::from_secs(n)),
            Raw::Float(f) => Duration::try_from_secs_f64(f).map_err(serde::de::Error::custom),
            Raw::Text(t) => super::parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        parse_raw(d)
    }
}

pub(crate) mod opt_duration_serde {
    //! `Option<Duration>`, absent when `None`.
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&super::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(serde::Deserialize)]
        struct Wrap(#[serde(deserialize_with = "super::duration_serde::parse_raw")] Duration);
        let wrapped: Option<Wrap> = serde::Deserialize::deserialize(d)?;
        Ok(wrapped.map(|Wrap(d)| d))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn durations_and_sizes_read_as_people_write_them() {
        let ms = |n| HumanDuration(Duration::from_micros(n)).to_string();
        assert_eq!(ms(400), "0.4 ms");
        assert_eq!(ms(139_280), "139 ms");
        assert_eq!(ms(2_340_000), "2.3 s");
        assert_eq!(ms(245_000_000), "4 min 5 s");
        assert_eq!(HumanBytes(512).to_string(), "512 B");
        assert_eq!(HumanBytes(1536 * 1024).to_string(), "1.5 MiB");
        assert_eq!(plural(1, "change"), "1 change");
        assert_eq!(plural(0, "change"), "0 changes");
    }
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("64M".parse::<ByteSize>().unwrap(), ByteSize(64 << 20));
        assert_eq!("64MiB".parse::<ByteSize>().unwrap(), ByteSize(64 << 20));
        assert_eq!("1.5G".parse::<ByteSize>().unwrap(), ByteSize(3 << 29));
        assert_eq!("2k".parse::<ByteSize>().unwrap(), ByteSize(2048));
    }

    #[test]
    fn a_profile_size_beyond_i64_survives_a_toml_round_trip() {
        // fuzz/artifacts: `memory = "10555555555592M"` parsed but did not serialise.
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Limits {
            memory: ByteSize,
        }
        for size in [
            ByteSize(10_555_555_555_592 << 20),
            ByteSize(u64::MAX),
            ByteSize(1 << 20),
        ] {
            let text = toml::to_string(&Limits { memory: size }).unwrap();
            assert_eq!(
                toml::from_str::<Limits>(&text).unwrap().memory,
                size,
                "{text}"
            );
        }
    }

    #[test]
    fn bad_sizes_say_what_is_wrong() {
        let err = "64X".parse::<ByteSize>().unwrap_err().to_string();
        assert!(err.contains("64X") && err.contains("unit"), "{err}");
        assert!("M".parse::<ByteSize>().is_err());
        assert!("99999999T".parse::<ByteSize>().is_err());
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 fortnights").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn values_beyond_float_precision_parse_exactly() {
        // The fuzzer's finding: 2001229505426ms went through f64 and came back as another
        // duration once printed and parsed again.
        let d = parse_duration("00000002001229505426ms").unwrap();
        assert_eq!(d, Duration::from_millis(2_001_229_505_426));
        assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        let max = Duration::new(u64::MAX, 999_999_999);
        assert_eq!(parse_duration(&format_duration(max)).unwrap(), max);
        assert!(parse_duration("18446744073709551616s").is_err());
        assert_eq!(
            parse_duration("0.0000000019s").unwrap(),
            Duration::from_nanos(1)
        );
        assert_eq!(
            "9007199254740993".parse::<ByteSize>().unwrap(),
            ByteSize(9_007_199_254_740_993)
        );
        assert_eq!(
            ByteSize(u64::MAX).to_string().parse::<ByteSize>().unwrap(),
            ByteSize(u64::MAX)
        );
        assert!("16777216T".parse::<ByteSize>().is_err());
        assert!(".".parse::<ByteSize>().is_err());
        assert!("1.2.3K".parse::<ByteSize>().is_err());
        assert_eq!(".5K".parse::<ByteSize>().unwrap(), ByteSize(512));
    }

    proptest::proptest! {
        #[test]
        fn duration_format_round_trips(secs in proptest::num::u64::ANY, nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            proptest::prop_assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }

        #[test]
        fn size_display_round_trips(n in proptest::num::u64::ANY) {
            let s = ByteSize(n);
            proptest::prop_assert_eq!(s.to_string().parse::<ByteSize>().unwrap(), s);
        }
    }
}
