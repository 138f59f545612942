//! Times as lockbox writes them everywhere (records, events, the API): RFC 3339, UTC,
//! milliseconds.

use std::time::{SystemTime, UNIX_EPOCH};

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
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(i64::try_from(d.as_secs()).unwrap_or(0), d.subsec_nanos())
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
}
