//! How config values are written: durations and sizes as a user types them
//! (`"5m"`, `"4d"`, `"1MiB"`), read and printed back the same way, and the
//! nearest known key to a misspelt one.

use std::time::Duration;

/// A duration in the style the config accepts, largest units first:
/// `5m`, `4d`, `1h 30m`, `300ms` (humantime would print `4days`).
pub fn duration(d: Duration) -> String {
    const UNITS: [(u128, &str); 5] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ];
    let mut left = d.as_millis();
    if left == 0 {
        return if d.is_zero() {
            "0s".into()
        } else {
            format!("{}us", d.as_micros())
        };
    }
    let mut parts = Vec::new();
    for (size, unit) in UNITS {
        if left >= size {
            parts.push(format!("{}{unit}", left / size));
            left %= size;
        }
    }
    parts.join(" ")
}

/// Parses a size: plain bytes (`"1048576"`), or a number with a unit, SI
/// (`KB`, `MB`, `GB`: powers of 1000) or binary (`KiB`, `MiB`, `GiB`:
/// powers of 1024), case-insensitive, with or without a space.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let number: u64 = text[..digits].parse().ok()?;
    let factor: u64 = match text[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "kib" => 1 << 10,
        "mb" => 1_000_000,
        "mib" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return None,
    };
    number.checked_mul(factor)
}

/// A size as a user would write it: `"1MiB"` when it is a whole number of
/// a binary unit, else plain bytes.
pub fn size(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// The known word closest to `word`, when it is close enough to be what
/// was meant: a typo (`read_timout`), not a different word.
pub fn nearest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    let word = word.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (levenshtein(&word, k), *k))
        .filter(|(d, k)| *d > 0 && (*d <= 2 || *d * 3 <= k.len()))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Edits (insertions, deletions, substitutions) from `a` to `b`.
fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_they_are_written() {
        let s = Duration::from_secs;
        assert_eq!(duration(s(300)), "5m");
        assert_eq!(duration(s(4 * 86_400)), "4d");
        assert_eq!(duration(s(5400)), "1h 30m");
        assert_eq!(duration(Duration::from_millis(300)), "300ms");
        assert_eq!(duration(Duration::ZERO), "0s");
        for text in ["5m", "4d", "1h 30m", "300ms", "1d 1s"] {
            let parsed = humantime::parse_duration(text).unwrap();
            assert_eq!(duration(parsed), text, "round trip");
        }
    }

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("1MiB"), Some(1 << 20));
        assert_eq!(parse_size("512KiB"), Some(512 << 10));
        assert_eq!(parse_size("512 kib"), Some(512 << 10));
        assert_eq!(parse_size("1MB"), Some(1_000_000));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size("64B"), Some(64));
        for bad in ["", "MiB", "1.5MiB", "1 parsec", "-1", "99999999999999GiB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(size(1 << 20), "1MiB");
        assert_eq!(size(65_536), "64KiB");
        assert_eq!(size(1_000_000), "1000000");
    }

    #[test]
    fn the_nearest_key_is_suggested_only_when_close() {
        let known = ["read_timeout", "shutdown_grace", "listen"];
        assert_eq!(nearest("read_timout", &known), Some("read_timeout"));
        assert_eq!(nearest("READ_TIMEOUTS", &known), Some("read_timeout"));
        assert_eq!(nearest("lisen", &known), Some("listen"));
        assert_eq!(nearest("colour", &known), None);
        assert_eq!(nearest("backen", &["backend", "path"]), Some("backend"));
        assert_eq!(levenshtein("kitten", "sitting"), 3);
    }
}
