//! Times as lockbox writes them everywhere (records, events, the API): RFC 3339, UTC,
//! milliseconds. Inside the crates a time is a [`SystemTime`]; [`format()`] makes the text
//! at the edges and [`parse`] reads back what [`format()`] wrote (the runtime's SQLite rows).
//!
//! Hand-written rather than `humantime` (whose `format_rfc3339*` panics before 1970, and a
//! file's mtime may be) or `jiff`/`chrono` (a large dependency for two functions): the
//! format is one fixed shape, tested below against known instants and round trips.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `secs` since the epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        nanos / 1_000_000
    )
}

/// Now, as [`rfc3339`] writes it.
pub fn now_rfc3339() -> String {
    format(SystemTime::now())
}

/// `t` as RFC 3339 UTC with milliseconds (`2026-11-18T11:06:40.000Z`), before 1970 too.
pub fn format(t: SystemTime) -> String {
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            // Before the epoch: whole seconds down, then the fraction up from there.
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => (-secs, 0),
                n => (-secs - 1, 1_000_000_000 - n),
            }
        }
    };
    rfc3339(secs, nanos)
}

/// The instant `secs` seconds and `nanos` nanoseconds after the epoch (`secs` may be
/// negative, as `stat(2)`'s `st_mtime` may; `nanos` counts forwards from `secs`).
pub fn from_unix(secs: i64, nanos: u32) -> SystemTime {
    let whole = Duration::from_secs(secs.unsigned_abs());
    let base = if secs >= 0 {
        UNIX_EPOCH.checked_add(whole)
    } else {
        UNIX_EPOCH.checked_sub(whole)
    };
    base.and_then(|t| t.checked_add(Duration::from_nanos(u64::from(nanos))))
        .unwrap_or(UNIX_EPOCH)
}

/// A time as [`format()`] writes it (`YYYY-MM-DDTHH:MM:SS.mmmZ`; the fraction may have any
/// number of digits or be left out). `None` for anything else.
pub fn parse(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' || b.last() != Some(&b'Z') {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let nanos = match text.get(19..text.len() - 1)? {
        "" => 0,
        frac => {
            let digits = frac.strip_prefix('.')?;
            if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|c| c.is_ascii_digit())
            {
                return None;
            }
            let n: u32 = digits.parse().ok()?;
            n * 10u32.pow(9 - u32::try_from(digits.len()).ok()?)
        }
    };
    // Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm, the inverse of
    // the one in `rfc3339`).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(from_unix(
        days * 86_400 + hour * 3600 + minute * 60 + second,
        nanos,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_825_600, 5_000_000), "2000-02-29T12:00:00.005Z");
        assert_eq!(rfc3339(1_795_000_000, 0), "2026-11-18T11:06:40.000Z");
        assert_eq!(rfc3339(-1, 0), "1969-12-31T23:59:59.000Z");
    }

    #[test]
    fn system_times_format_as_their_unix_seconds_do() {
        assert_eq!(format(from_unix(0, 0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format(from_unix(951_825_600, 5_000_000)),
            "2000-02-29T12:00:00.005Z"
        );
        assert_eq!(format(from_unix(-1, 0)), "1969-12-31T23:59:59.000Z");
        assert_eq!(
            format(from_unix(-2, 500_000_000)),
            "1969-12-31T23:59:58.500Z"
        );
    }

    #[test]
    fn parse_reads_back_what_format_writes() {
        for (secs, nanos) in [
            (0, 0),
            (951_825_600, 5_000_000),
            (1_795_000_000, 123_000_000),
            (-1, 0),
            (-86_401, 250_000_000),
            (4_102_444_800, 999_000_000),
        ] {
            let t = from_unix(secs, nanos);
            assert_eq!(parse(&format(t)), Some(t), "{secs}.{nanos}");
        }
        assert_eq!(
            parse("2026-11-18T11:06:40Z"),
            Some(from_unix(1_795_000_000, 0))
        );
        for bad in [
            "",
            "2026-11-18",
            "2026-13-18T11:06:40.000Z",
            "2026-11-18T11:06:40.000",
            "2026-11-18T11:06:40.Z",
            "2026-11-18 11:06:40.000Z",
            "+026-11-18T11:06:40.000Z",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
