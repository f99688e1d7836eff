//! Unix milliseconds, as the sqlite and redis stores write lease ends,
//! expiries and outbox times (SQLite integers, Redis values and scores).
//! Out-of-range values saturate rather than wrap: a clock before 1970 reads
//! as 0, and a span past `i64::MAX` milliseconds as `i64::MAX`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wall clock in unix milliseconds.
pub(crate) fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

/// `t` in unix milliseconds.
pub(crate) fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, span_ms)
}

/// The time `ms` unix milliseconds name (the epoch for a negative one).
pub(crate) fn from_unix_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A span in whole milliseconds.
pub(crate) fn span_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `now + span` in unix milliseconds: a lease's end, an expiry.
pub(crate) fn after(now: i64, span: Duration) -> i64 {
    now.saturating_add(span_ms(span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_and_saturate() {
        let t = UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
        assert_eq!(unix_ms(t), 1_800_000_000_123);
        assert_eq!(from_unix_ms(unix_ms(t)), t);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_secs(5)), 0);
        assert_eq!(from_unix_ms(-5), UNIX_EPOCH);
        assert_eq!(span_ms(Duration::MAX), i64::MAX);
        assert_eq!(span_ms(Duration::from_micros(2_999)), 2);
        assert_eq!(after(1_000, Duration::from_secs(2)), 3_000);
        assert_eq!(after(1_000, Duration::MAX), i64::MAX);
    }
}
