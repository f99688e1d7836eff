//! A forward-mode key's value: one redis string, so that a claim is one
//! plain `SET NX PX GET` (no script) and a duplicate is answered by it.
//!
//! ```text
//! in flight:  i<token>:<lease end, unix ms>:<fingerprint>
//! completed:  c<status, 3 digits><truncated 0|1>:<fingerprint>:<content type length or ->:<content type><body>
//! ```
//!
//! Tokens and fingerprints are hex (or empty), so `:` separates them; the
//! content type is length-prefixed and the body runs to the end, so both
//! may hold any byte. The complete script builds the completed value from
//! [`completed_head`], the fingerprint it reads from the in-flight value,
//! and [`completed_tail`]: the fingerprint is written once, by the claim.

use std::time::Duration;

use super::super::clock::{after, now_ms};
use super::super::{Existing, LeaseToken, Result, Snapshot, StoreError};

// The values are joined from their parts rather than `format!`ted: every
// claim and mark builds them, and the formatting machinery cost more than
// the copies (docs/BENCHMARKS.md, The overhead work).

/// The in-flight value a claim writes.
pub fn in_flight(token: &LeaseToken, fingerprint: &str, lease: Duration) -> String {
    let end = after(now_ms(), lease).unsigned_abs();
    let mut digits = itoa::Buffer::new();
    ["i", &token.0, ":", digits.format(end), ":", fingerprint].concat()
}

/// What an in-flight value starts with while `token` holds it.
pub fn owner(token: &LeaseToken) -> String {
    ["i", &token.0, ":"].concat()
}

/// The completed value's start, up to its fingerprint.
pub fn completed_head(snapshot: &Snapshot) -> String {
    let mut digits = itoa::Buffer::new();
    let status = digits.format(snapshot.status);
    let pad = &"000"[status.len().min(3)..];
    let truncated = if snapshot.truncated { "1" } else { "0" };
    ["c", pad, status, truncated, ":"].concat()
}

/// The completed value's end, after its fingerprint.
pub fn completed_tail(snapshot: &Snapshot) -> Vec<u8> {
    let content_type = snapshot.content_type.as_deref();
    let mut digits = itoa::Buffer::new();
    let length = content_type.map_or("-", |c| digits.format(c.len()));
    let mut tail = Vec::with_capacity(length.len() + 2 + snapshot.body.len() + 64);
    tail.push(b':');
    tail.extend_from_slice(length.as_bytes());
    tail.push(b':');
    tail.extend_from_slice(content_type.unwrap_or("").as_bytes());
    tail.extend_from_slice(&snapshot.body);
    tail
}

/// Reads a value back as (fingerprint, state).
pub fn decode(value: &[u8]) -> Result<(String, Existing)> {
    match value.split_first() {
        Some((b'i', rest)) => {
            let mut parts = rest.splitn(3, |&b| b == b':');
            let (_token, end, fingerprint) = (parts.next(), parts.next(), parts.next());
            let end: u64 = text(end, "lease end")?
                .parse()
                .map_err(|_| corrupt("lease end"))?;
            let left = Duration::from_millis(end.saturating_sub(now_ms().unsigned_abs()));
            // Retry-After has a one-second resolution: never say zero.
            let retry_after = left.max(Duration::from_secs(1));
            Ok((
                text(fingerprint, "fingerprint")?.to_owned(),
                Existing::InFlight { retry_after },
            ))
        }
        Some((b'c', rest)) => completed(rest),
        _ => Err(corrupt("state")),
    }
}

fn completed(rest: &[u8]) -> Result<(String, Existing)> {
    let (status, rest) = rest.split_at_checked(4).ok_or_else(|| corrupt("status"))?;
    let truncated = status[3] == b'1';
    let status: u16 = text(Some(&status[..3]), "status")?
        .parse()
        .map_err(|_| corrupt("status"))?;
    let mut parts = rest.splitn(4, |&b| b == b':');
    let (_, fingerprint, length, rest) = (parts.next(), parts.next(), parts.next(), parts.next());
    let fingerprint = text(fingerprint, "fingerprint")?.to_owned();
    let rest = rest.ok_or_else(|| corrupt("content type"))?;
    let (content_type, body) = match text(length, "content type length")? {
        "-" => (None, rest),
        n => {
            let n: usize = n.parse().map_err(|_| corrupt("content type length"))?;
            let (content_type, body) = rest
                .split_at_checked(n)
                .ok_or_else(|| corrupt("content type"))?;
            (
                Some(text(Some(content_type), "content type")?.to_owned()),
                body,
            )
        }
    };
    let snapshot = Snapshot {
        status,
        content_type,
        body: body.to_vec().into(),
        truncated,
    };
    Ok((fingerprint, Existing::Completed(snapshot)))
}

fn text<'a>(field: Option<&'a [u8]>, name: &str) -> Result<&'a str> {
    std::str::from_utf8(field.ok_or_else(|| corrupt(name))?).map_err(|_| corrupt(name))
}

fn corrupt(name: &str) -> StoreError {
    StoreError::Corrupt(format!("redis: invalid {name} in a key's value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed_value(snapshot: &Snapshot, fingerprint: &str) -> Vec<u8> {
        let mut value = completed_head(snapshot).into_bytes();
        value.extend_from_slice(fingerprint.as_bytes());
        value.extend_from_slice(&completed_tail(snapshot));
        value
    }

    #[test]
    fn completed_values_round_trip_any_bytes() {
        for snapshot in [
            Snapshot {
                status: 201,
                content_type: Some("application/json; a=\"x:y\"".into()),
                body: b"{\"ok\":true}:\xff\x00".to_vec().into(),
                truncated: true,
            },
            Snapshot {
                status: 200,
                content_type: None,
                body: Vec::new().into(),
                truncated: false,
            },
        ] {
            for fingerprint in ["", "ab12"] {
                let value = completed_value(&snapshot, fingerprint);
                let (fp, state) = decode(&value).unwrap();
                assert_eq!(fp, fingerprint);
                assert_eq!(state, Existing::Completed(snapshot.clone()));
            }
        }
    }

    /// Values written by one version are read, and their owner prefix
    /// compared byte for byte by the scripts, by another: the joined
    /// spellings are `format!`'s.
    #[test]
    fn values_are_spelled_as_format_spelled_them() {
        let token = LeaseToken("0123abcd".into());
        assert_eq!(owner(&token), format!("i{}:", token.0));
        let value = in_flight(&token, "ab12", Duration::from_secs(30));
        let end: u64 = value.split(':').nth(1).unwrap().parse().unwrap();
        assert_eq!(value, format!("i{}:{end}:ab12", token.0));
        for status in [0, 7, 42, 100, 200, 599, 999, 1000, u16::MAX] {
            for truncated in [false, true] {
                let snapshot = Snapshot {
                    status,
                    content_type: None,
                    body: bytes::Bytes::new(),
                    truncated,
                };
                let before = format!("c{status:03}{}:", u8::from(truncated));
                assert_eq!(completed_head(&snapshot), before);
            }
        }
        let long = "x".repeat(1234);
        for content_type in [None, Some(""), Some("text/plain"), Some(long.as_str())] {
            let snapshot = Snapshot {
                status: 200,
                content_type: content_type.map(str::to_owned),
                body: bytes::Bytes::from_static(b"{}"),
                truncated: false,
            };
            let length = content_type.map_or_else(|| "-".to_owned(), |c| c.len().to_string());
            let before = format!(":{length}:{}{{}}", content_type.unwrap_or(""));
            assert_eq!(completed_tail(&snapshot), before.into_bytes());
        }
    }

    #[test]
    fn in_flight_values_say_when_to_retry() {
        let token = LeaseToken::generate();
        let value = in_flight(&token, "ab12", Duration::from_secs(30));
        assert!(value.starts_with(&owner(&token)));
        let (fp, state) = decode(value.as_bytes()).unwrap();
        assert_eq!(fp, "ab12");
        let Existing::InFlight { retry_after } = state else {
            panic!("in flight: {state:?}");
        };
        assert!(retry_after > Duration::from_secs(28) && retry_after <= Duration::from_secs(30));
        // A lease already over still asks for at least a second.
        let value = in_flight(&token, "", Duration::ZERO);
        let (_, state) = decode(value.as_bytes()).unwrap();
        assert_eq!(
            state,
            Existing::InFlight {
                retry_after: Duration::from_secs(1)
            }
        );
    }

    #[test]
    fn damaged_values_are_corrupt_not_panics() {
        for value in [
            &b""[..],
            b"x",
            b"i",
            b"iabc",
            b"iabc:notanumber:fp",
            b"c20",
            b"c2001",
            b"cabc0:fp:-:",
            b"c2000:fp",
            b"c2000:fp:9:short",
            b"c2000:fp:x:",
            b"c2000:fp:1:\xff",
        ] {
            assert!(
                matches!(decode(value), Err(StoreError::Corrupt(_))),
                "{value:?}"
            );
        }
    }
}
