//! Shared HMAC and encoding helpers for the signature schemes.
//!
//! Each scheme parses its headers into the presented signatures and the
//! pieces of the signed payload, then asks [`first_match`] which active secret
//! produced one of them.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT;
use hmac::{Hmac, KeyInit, Mac};
use subtle::ConstantTimeEq;

use http::HeaderMap;
use http::header::AsHeaderName;

use super::{Algorithm, Verified, VerifyError};
use crate::secret::ActiveSecret;

/// An HMAC computed for one secret. It has no `Debug`: it is the signature an
/// attacker would need, so it must never reach an error or a log line.
pub(super) struct Tag(Vec<u8>);

impl Tag {
    /// Computes the HMAC of `parts` as if they were concatenated, so a
    /// template such as `{t}.{body}` costs no copy of the body.
    pub(super) fn compute(algorithm: Algorithm, key: &[u8], parts: &[&[u8]]) -> Self {
        fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut mac =
                <M as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length");
            for part in parts {
                mac.update(part);
            }
            mac.finalize().into_bytes().to_vec()
        }
        Self(match algorithm {
            Algorithm::Sha1 => run::<Hmac<sha1::Sha1>>(key, parts),
            Algorithm::Sha256 => run::<Hmac<sha2::Sha256>>(key, parts),
            Algorithm::Sha512 => run::<Hmac<sha2::Sha512>>(key, parts),
        })
    }

    /// Compares in constant time. A length mismatch returns early, which
    /// reveals only the length of the algorithm's output, a public fact.
    pub(super) fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_slice().ct_eq(presented).into()
    }

    pub(super) fn to_hex(&self) -> String {
        const_hex::encode(&self.0)
    }

    pub(super) fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.0)
    }
}

/// Decodes a presented hex signature (either case). Empty text is refused
/// like garbage: it is a missing signature, not one that failed to match.
pub(super) fn decode_hex(text: impl AsRef<[u8]>) -> Option<Vec<u8>> {
    // Into a buffer of the text's half: `const_hex` takes a leading `0x`
    // as a prefix, which then leaves the text two characters short of the
    // buffer, an error; so only bare hex decodes, as the providers send it.
    let text = text.as_ref();
    if text.is_empty() || text.len() % 2 != 0 {
        return None;
    }
    let mut bytes = vec![0; text.len() / 2];
    const_hex::decode_to_slice(text, &mut bytes).ok()?;
    Some(bytes)
}

/// Decodes standard base64; empty text is refused as with hex. Padding is
/// optional because some senders strip it; that leniency cannot make a wrong
/// signature match.
pub(super) fn decode_base64(text: impl AsRef<[u8]>) -> Option<Vec<u8>> {
    STANDARD_PAD_INDIFFERENT
        .decode(text)
        .ok()
        .filter(|bytes| !bytes.is_empty())
}

/// Finds the first active secret whose HMAC over `parts` equals one of the
/// `presented` signatures, and returns that secret's configured index.
///
/// `key` turns a secret's bytes into the HMAC key; a secret it refuses (None)
/// is skipped, and if every secret is refused the provider has none usable.
pub(super) fn first_match(
    algorithm: Algorithm,
    secrets: &[ActiveSecret],
    key: impl Fn(&[u8]) -> Option<Cow<'_, [u8]>>,
    parts: &[&[u8]],
    presented: &[Vec<u8>],
) -> Result<usize, VerifyError> {
    first_secret(secrets, |secret| {
        let tag = Tag::compute(algorithm, &key(secret)?, parts);
        Some(presented.iter().any(|p| tag.matches(p)))
    })
}

/// The configured index of the first active secret that `matches` accepts.
/// `matches` answers None for a secret it cannot use (not a key of its
/// kind); when no secret is usable the provider has none, which is another
/// error than a signature that matches none.
pub(super) fn first_secret(
    secrets: &[ActiveSecret],
    matches: impl Fn(&[u8]) -> Option<bool>,
) -> Result<usize, VerifyError> {
    let mut usable = false;
    for secret in secrets {
        match matches(secret.value.expose()) {
            Some(true) => return Ok(secret.index),
            Some(false) => usable = true,
            None => {}
        }
    }
    Err(if usable {
        VerifyError::NoMatch
    } else {
        VerifyError::NoUsableSecret
    })
}

/// [`first_match`] for the schemes that key HMAC-SHA256 with the secret as
/// it is, as the [`Verified`] that carries the signed timestamp, if any.
pub(super) fn verify_sha256(
    secrets: &[ActiveSecret],
    parts: &[&[u8]],
    presented: &[Vec<u8>],
    timestamp: Option<i64>,
) -> Result<Verified, VerifyError> {
    let secret_index = first_match(Algorithm::Sha256, secrets, raw_key, parts, presented)?;
    Ok(Verified {
        secret_index,
        timestamp,
    })
}

/// A signature header's value as text: absent is missing, not visible ASCII
/// is malformed. Errors carry `label`, the header's name in messages.
pub(super) fn header_text<'a>(
    headers: &'a HeaderMap,
    name: impl AsHeaderName,
    label: &'static str,
) -> Result<&'a str, VerifyError> {
    headers
        .get(name)
        .ok_or(VerifyError::MissingHeader(label))?
        .to_str()
        .map_err(|_| VerifyError::Malformed(label))
}

/// A signed timestamp header: its text, signed as presented, and its Unix
/// seconds, returned unchecked for the window phase to judge.
pub(super) fn signed_timestamp<'a>(
    headers: &'a HeaderMap,
    name: impl AsHeaderName,
    label: &'static str,
) -> Result<(&'a str, i64), VerifyError> {
    let text = header_text(headers, name, label)?;
    let seconds = parse_unix_seconds(text).ok_or(VerifyError::Malformed(label))?;
    Ok((text, seconds))
}

/// The key for schemes that use the secret's bytes as they are.
pub(super) fn raw_key(secret: &[u8]) -> Option<Cow<'_, [u8]>> {
    Some(Cow::Borrowed(secret))
}

/// Parses a header's Unix-seconds timestamp. Only ASCII digits are accepted,
/// since the text is signed as presented and must mean what it says.
pub(super) fn parse_unix_seconds(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::provider::{Delivery, SignedHeaders, Verified};
    use crate::secret::SecretValue;

    /// Headers of a test delivery, as (name, value) pairs.
    pub(in crate::provider) type Pairs<'a> = &'a [(&'a str, &'a [u8])];

    /// What a scheme's `verify` answered.
    pub(in crate::provider) type Outcome = Result<Verified, VerifyError>;

    /// Runs a scheme's `verify` on a delivery to `uri` with these headers
    /// and body, against active secrets of these values.
    pub(in crate::provider) fn run(
        verify: impl Fn(&Delivery<'_>, &[ActiveSecret]) -> Outcome,
        uri: &str,
        pairs: Pairs<'_>,
        body: &[u8],
        keys: &[&[u8]],
    ) -> Outcome {
        let mut headers = http::HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        let uri: http::Uri = uri.parse().unwrap();
        let delivery = Delivery {
            headers: &headers,
            body,
            uri: &uri,
        };
        verify(&delivery, &secrets(keys))
    }

    /// The pairs of the headers a scheme's `sign` produced.
    pub(in crate::provider) fn signed_pairs(headers: &SignedHeaders) -> Vec<(&str, &[u8])> {
        headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect()
    }

    /// Active secrets with consecutive indexes starting at 0.
    pub(in crate::provider) fn secrets(values: &[&[u8]]) -> Vec<ActiveSecret> {
        values
            .iter()
            .enumerate()
            .map(|(index, v)| ActiveSecret {
                index,
                value: Arc::new(SecretValue::new(v.to_vec())),
            })
            .collect()
    }

    #[test]
    fn split_parts_give_the_same_tag_as_one_buffer() {
        for alg in [Algorithm::Sha1, Algorithm::Sha256, Algorithm::Sha512] {
            let whole = Tag::compute(alg, b"k", &[b"12.hello"]);
            let split = Tag::compute(alg, b"k", &[b"12", b".", b"hello"]);
            assert_eq!(whole.to_hex(), split.to_hex());
        }
    }

    #[test]
    fn known_answers_per_algorithm() {
        // RFC 4231 test case 2 (SHA-256, SHA-512) and RFC 2202 test case 2 (SHA-1).
        let parts: &[&[u8]] = &[b"what do ya want ", b"for nothing?"];
        assert_eq!(
            Tag::compute(Algorithm::Sha1, b"Jefe", parts).to_hex(),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert_eq!(
            Tag::compute(Algorithm::Sha256, b"Jefe", parts).to_hex(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            Tag::compute(Algorithm::Sha512, b"Jefe", parts).to_hex(),
            "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea250554\
             9758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
    }

    #[test]
    fn matches_rejects_other_lengths_and_bytes() {
        let tag = Tag::compute(Algorithm::Sha256, b"k", &[b"x"]);
        let good = decode_hex(tag.to_hex()).unwrap();
        assert!(tag.matches(&good));
        assert!(!tag.matches(&good[..31]));
        assert!(!tag.matches(&[]));
        let mut bad = good.clone();
        bad[31] ^= 1;
        assert!(!tag.matches(&bad));
    }

    #[test]
    fn first_match_reports_the_matching_index_or_why_not() {
        // Secrets 0, 2 and 3 retired: the index is the configured position,
        // not the position among the active ones.
        let mut list = secrets(&[b"old", b"new"]);
        list[0].index = 1;
        list[1].index = 4;
        let tag = Tag::compute(Algorithm::Sha256, b"new", &[b"body"]);
        let presented = vec![vec![0; 32], decode_base64(tag.to_base64()).unwrap()];
        let found = first_match(Algorithm::Sha256, &list, raw_key, &[b"body"], &presented);
        assert_eq!(found, Ok(4));
        let none = first_match(Algorithm::Sha256, &list, raw_key, &[b"other"], &presented);
        assert_eq!(none, Err(VerifyError::NoMatch));
        let refused = first_match(Algorithm::Sha256, &list, |_| None, &[b"body"], &presented);
        assert_eq!(refused, Err(VerifyError::NoUsableSecret));
    }

    #[test]
    fn decoders_refuse_garbage_and_accept_unpadded_base64() {
        assert_eq!(decode_hex("zz"), None);
        assert_eq!(decode_hex(""), None);
        assert_eq!(decode_base64(""), None);
        assert_eq!(decode_hex("abc"), None);
        assert_eq!(decode_hex("ABcd"), Some(vec![0xab, 0xcd]));
        // No prefix is taken off: `0x` is not hex.
        assert_eq!(decode_hex("0xab"), None);
        assert_eq!(decode_hex("0x"), None);
        assert_eq!(decode_base64("AQI="), Some(vec![1, 2]));
        assert_eq!(decode_base64("AQI"), Some(vec![1, 2]));
        assert_eq!(decode_base64("A?=="), None);
    }

    #[test]
    fn timestamps_are_plain_digits() {
        assert_eq!(parse_unix_seconds("1533204620"), Some(1533204620));
        for bad in ["", "-5", "+5", " 5", "1e9", "99999999999999999999"] {
            assert_eq!(parse_unix_seconds(bad), None, "{bad:?}");
        }
    }
}
