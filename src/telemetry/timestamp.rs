//! The log line's timestamp, RFC 3339 in UTC with microseconds
//! (`2026-12-02T22:31:11.123456Z`), as humantime writes it.
//!
//! humantime turns the seconds since 1970 into a calendar date and writes
//! it through `fmt::write` for every line: 1.8k instructions of the 7k a
//! delivery's line cost (callgrind, docs/BENCHMARKS.md). Lines come many
//! to a second, so each thread keeps the second it wrote last, spelled
//! out, and writes only the microseconds itself.

use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last second RFC 3339 (and humantime) can write: 9999-12-31T23:59:59Z.
const LAST_WRITABLE: Duration = Duration::from_secs(253_402_300_799);

/// `YYYY-MM-DDTHH:MM:SS`: what a line shares with the others of its second.
const SECOND_LEN: usize = 19;

thread_local! {
    /// The second this thread wrote last (seconds since 1970), spelled out.
    static LAST_SECOND: Cell<(u64, [u8; SECOND_LEN])> = const { Cell::new((u64::MAX, [0; SECOND_LEN])) };
}

/// Appends `now` as RFC 3339 with microseconds. humantime panics on a
/// time before 1970 and fails on one after 9999: a clock set that far off
/// writes the nearest time it can.
pub(super) fn push(line: &mut Vec<u8>, now: SystemTime) {
    let since_epoch = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .min(LAST_WRITABLE);
    let secs = since_epoch.as_secs();
    let spelled = LAST_SECOND
        .try_with(|last| {
            let (at, spelled) = last.get();
            if at == secs {
                return spelled;
            }
            let spelled = spell_second(secs);
            last.set((secs, spelled));
            spelled
        })
        // The thread is ending: spell it without the cache.
        .unwrap_or_else(|_| spell_second(secs));
    line.extend_from_slice(&spelled);
    line.push(b'.');
    let micros = since_epoch.subsec_micros();
    let mut digits = [b'0'; 6];
    let mut rest = micros;
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    line.extend_from_slice(&digits);
    line.push(b'Z');
}

/// `secs` after 1970 as `YYYY-MM-DDTHH:MM:SS`, by humantime.
#[cold]
fn spell_second(secs: u64) -> [u8; SECOND_LEN] {
    // Within 1970..=9999 humantime writes `YYYY-MM-DDTHH:MM:SSZ`.
    let text =
        humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string();
    let mut spelled = [0; SECOND_LEN];
    spelled.copy_from_slice(&text.as_bytes()[..SECOND_LEN]);
    spelled
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(now: SystemTime) -> String {
        let mut line = Vec::new();
        push(&mut line, now);
        String::from_utf8(line).unwrap()
    }

    #[test]
    fn writes_what_humantime_writes_within_and_across_seconds() {
        let start = UNIX_EPOCH + Duration::from_secs(1_796_250_000);
        // Steps that stay within a second, cross one, and cross days and
        // years, on one thread so that the cached second is reused.
        let steps = [
            0,
            1,
            999_999,
            1_000_000,
            1_000_001,
            86_399_999_999,
            86_400_000_000,
            31_622_400_123_456,
        ];
        for micros in steps {
            let now = start + Duration::from_micros(micros);
            assert_eq!(
                written(now),
                humantime::format_rfc3339_micros(now).to_string(),
                "{micros}"
            );
        }
        // A clock set back writes the earlier second, not the cached one.
        for back in [start + Duration::from_micros(1_500_000), start] {
            assert_eq!(
                written(back),
                humantime::format_rfc3339_micros(back).to_string()
            );
        }
        let now = SystemTime::now();
        assert_eq!(
            written(now),
            humantime::format_rfc3339_micros(now).to_string()
        );
        let sub_micro = start + Duration::from_nanos(999);
        assert_eq!(written(sub_micro), "2026-12-02T22:20:00.000000Z");
    }

    #[test]
    fn a_clock_outside_1970_to_9999_writes_the_nearest_time() {
        let far = UNIX_EPOCH + LAST_WRITABLE + Duration::from_secs(86_400);
        assert_eq!(written(far), "9999-12-31T23:59:59.000000Z");
        let before = UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(written(before), "1970-01-01T00:00:00.000000Z");
    }
}
