//! The `standard` scheme (Standard Webhooks, as sent by Svix, Resend, Clerk
//! and others): `webhook-signature: v1,<base64>[ v1,<base64>..]` with
//! `webhook-id` and `webhook-timestamp`, HMAC-SHA256 over `{id}.{ts}.{body}`.
//! The key is the base64 text after the secret's `whsec_` prefix.

use std::borrow::Cow;

use http::HeaderMap;

use super::crypto::{self, Tag};
use super::descriptor::{DefaultKey, Descriptor};
use super::{Algorithm, Delivery, SignedHeaders, Verified, VerifyError};
use crate::secret::ActiveSecret;
use crate::settings::OnMissingKey;
use std::time::Duration;

/// The names of one family of headers.
struct Names {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
}

/// Standard Webhooks: `webhook-id` (`svix-id` on Svix deliveries); Svix
/// retries 8 times over about 27.6 hours.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: "standard",
    signature_headers: &[
        "webhook-signature",
        "webhook-timestamp",
        "svix-signature",
        "svix-timestamp",
    ],
    key: Some(DefaultKey {
        source: "header:webhook-id",
        aliases: &["svix-id"],
        scope: None,
    }),
    retry_window: Some(Duration::from_secs(28 * 3600)),
    on_missing_key: OnMissingKey::Reject,
};

const WEBHOOK: Names = Names {
    id: "webhook-id",
    timestamp: "webhook-timestamp",
    signature: "webhook-signature",
};

/// Svix's own names, which its senders still use.
const SVIX: Names = Names {
    id: "svix-id",
    timestamp: "svix-timestamp",
    signature: "svix-signature",
};

/// Verifies against every active secret; any `v1` entry may match any secret.
/// A secret that is not valid base64 cannot match; if none is valid the
/// provider has no usable secret. The timestamp is returned unchecked.
pub fn verify(delivery: &Delivery<'_>, secrets: &[ActiveSecret]) -> Result<Verified, VerifyError> {
    let headers = delivery.headers;
    // The family is chosen as a whole, as the official libraries do, so a
    // delivery cannot mix an id from one with a signature from the other.
    let (names, other) = if headers.contains_key(WEBHOOK.signature) {
        (&WEBHOOK, &SVIX)
    } else if headers.contains_key(SVIX.signature) {
        (&SVIX, &WEBHOOK)
    } else {
        return Err(VerifyError::MissingHeader(WEBHOOK.signature));
    };
    let id = text(headers, names.id)?;
    // The key is read from `webhook-id`, else `svix-id` (`DESCRIPTOR`),
    // whichever family was signed: a Svix delivery with a `webhook-id` of
    // the sender's choosing added would otherwise verify and be claimed
    // under a new key each time it is replayed. Both present must agree.
    if let Some(unsigned) = headers.get(other.id)
        && unsigned.as_bytes() != id.as_bytes()
    {
        return Err(VerifyError::Conflict(names.id, other.id));
    }
    let ts = text(headers, names.timestamp)?;
    let timestamp =
        crypto::parse_unix_seconds(ts).ok_or(VerifyError::Malformed(names.timestamp))?;
    let signatures = parse_signatures(text(headers, names.signature)?)
        .ok_or(VerifyError::Malformed(names.signature))?;
    let parts: [&[u8]; 5] = [id.as_bytes(), b".", ts.as_bytes(), b".", delivery.body];
    let secret_index = crypto::first_match(Algorithm::Sha256, secrets, key, &parts, &signatures)?;
    Ok(Verified {
        secret_index,
        timestamp: Some(timestamp),
    })
}

/// The three headers a Standard Webhooks sender would attach. A secret that is
/// not valid base64 cannot sign, so `webhook-signature` is then left out and
/// verification reports it missing rather than a signature that lies.
pub fn sign(secret: &[u8], body: &[u8], id: &str, timestamp: i64) -> SignedHeaders {
    let ts = timestamp.to_string();
    let mut headers = vec![
        (WEBHOOK.id.to_owned(), id.to_owned()),
        (WEBHOOK.timestamp.to_owned(), ts.clone()),
    ];
    if let Some(key) = key(secret) {
        let parts: [&[u8]; 5] = [id.as_bytes(), b".", ts.as_bytes(), b".", body];
        let tag = Tag::compute(Algorithm::Sha256, &key, &parts);
        headers.push((
            WEBHOOK.signature.to_owned(),
            format!("v1,{}", tag.to_base64()),
        ));
    }
    headers
}

/// A header's value as text; absent is missing, non-ASCII or empty is malformed.
fn text<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, VerifyError> {
    let value = headers.get(name).ok_or(VerifyError::MissingHeader(name))?;
    match value.to_str() {
        Ok(text) if !text.is_empty() => Ok(text),
        _ => Err(VerifyError::Malformed(name)),
    }
}

/// The decoded `v1` signatures. Other versions (`v1a` is ed25519) and entries
/// that do not decode are skipped; None when no `v1` signature is left.
fn parse_signatures(text: &str) -> Option<Vec<Vec<u8>>> {
    let signatures: Vec<_> = text
        .split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(|(_, signature)| crypto::decode_base64(signature))
        .collect();
    (!signatures.is_empty()).then_some(signatures)
}

/// The HMAC key of a `whsec_<base64>` secret (the prefix is optional).
fn key(secret: &[u8]) -> Option<Cow<'_, [u8]>> {
    let encoded = secret.strip_prefix(b"whsec_").unwrap_or(secret);
    crypto::decode_base64(encoded).map(Cow::Owned)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::provider::crypto::tests::{Outcome, Pairs, run, signed_pairs};

    fn check(pairs: Pairs<'_>, body: &[u8], keys: &[&[u8]]) -> Outcome {
        run(verify, "/webhooks/standard", pairs, body, keys)
    }

    const SECRET: &[u8] = b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: &str = "1614265330";
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn official(signature: &str) -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("webhook-id", ID.into()),
            ("webhook-timestamp", TS.into()),
            ("webhook-signature", signature.as_bytes().to_vec()),
        ]
    }

    fn as_pairs<'a>(owned: &'a [(&'static str, Vec<u8>)]) -> Vec<(&'static str, &'a [u8])> {
        owned.iter().map(|(n, v)| (*n, v.as_slice())).collect()
    }

    #[test]
    fn official_vector_verifies() {
        let got = check(&as_pairs(&official(SIGNATURE)), BODY, &[SECRET]);
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 0,
                timestamp: Some(1614265330)
            })
        );
    }

    #[test]
    fn official_vector_with_last_character_changed_fails() {
        let tampered = SIGNATURE.replace("J1OE=", "J1OA=");
        assert_ne!(tampered, SIGNATURE);
        let got = check(&as_pairs(&official(&tampered)), BODY, &[SECRET]);
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn tampered_body_fails() {
        let got = check(
            &as_pairs(&official(SIGNATURE)),
            br#"{"test": 2432232315}"#,
            &[SECRET],
        );
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn svix_names_and_unprefixed_secrets_are_accepted() {
        let pairs: Vec<_> = official(SIGNATURE)
            .into_iter()
            .map(|(n, v)| (n.replace("webhook-", "svix-"), v))
            .collect();
        let pairs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect();
        let got = check(&pairs, BODY, &[&SECRET[6..]]);
        assert_eq!(got.map(|v| v.timestamp), Ok(Some(1614265330)));
    }

    /// The key is read from `webhook-id`, else `svix-id`: an id header of
    /// the other family must name the signed delivery, or a replay with a
    /// new unsigned id would be claimed as a new event.
    #[test]
    fn an_unsigned_id_that_differs_from_the_signed_one_is_refused() {
        let svix: Vec<(String, Vec<u8>)> = official(SIGNATURE)
            .into_iter()
            .map(|(n, v)| (n.replace("webhook-", "svix-"), v))
            .collect();
        let with = |extra: (&'static str, &'static [u8])| {
            let mut pairs: Vec<(&str, &[u8])> = svix
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_slice()))
                .collect();
            pairs.push(extra);
            check(&pairs, BODY, &[SECRET])
        };
        assert_eq!(
            with(("webhook-id", b"msg_replayed_1")),
            Err(VerifyError::Conflict("svix-id", "webhook-id"))
        );
        assert!(with(("webhook-id", ID.as_bytes())).is_ok(), "the same id");

        let mut webhook = official(SIGNATURE);
        webhook.push(("svix-id", b"msg_other".to_vec()));
        let got = check(&as_pairs(&webhook), BODY, &[SECRET]);
        assert_eq!(got, Err(VerifyError::Conflict("webhook-id", "svix-id")));
    }

    #[test]
    fn second_secret_matching_reports_its_index_and_bad_secrets_are_skipped() {
        let pairs = official(SIGNATURE);
        let got = check(
            &as_pairs(&pairs),
            BODY,
            &[b"whsec_!!not base64!!", b"whsec_AAAA", SECRET],
        );
        assert_eq!(got.map(|v| v.secret_index), Ok(2));
        let got = check(&as_pairs(&pairs), BODY, &[b"whsec_%%%", b"whsec_", b"\xff"]);
        assert_eq!(got, Err(VerifyError::NoUsableSecret));
    }

    #[test]
    fn any_v1_entry_may_match_and_other_versions_are_ignored() {
        let header = format!(
            "v1a,AAAA v2,AAAA v1,*** v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= {SIGNATURE}"
        );
        let got = check(&as_pairs(&official(&header)), BODY, &[SECRET]);
        assert!(got.is_ok());
        let only_v1a = "v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        let got = check(&as_pairs(&official(only_v1a)), BODY, &[SECRET]);
        assert_eq!(got, Err(VerifyError::Malformed("webhook-signature")));
    }

    #[test]
    fn missing_and_malformed_headers() {
        let full = official(SIGNATURE);
        let got = check(&as_pairs(&full[..2]), BODY, &[SECRET]);
        assert_eq!(got, Err(VerifyError::MissingHeader("webhook-signature")));
        let got = check(&as_pairs(&full[1..]), BODY, &[SECRET]);
        assert_eq!(got, Err(VerifyError::MissingHeader("webhook-id")));
        let no_ts = [full[0].clone(), full[2].clone()];
        let got = check(&as_pairs(&no_ts), BODY, &[SECRET]);
        assert_eq!(got, Err(VerifyError::MissingHeader("webhook-timestamp")));

        let cases: [(&str, &[u8]); 6] = [
            ("webhook-timestamp", b"soon"),
            ("webhook-timestamp", b""),
            ("webhook-id", b""),
            ("webhook-id", b"msg_\xff"),
            ("webhook-signature", b"v1,"),
            (
                "webhook-signature",
                b"g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            ),
        ];
        for (name, value) in cases {
            let mut pairs = full.clone();
            pairs.iter_mut().find(|(n, _)| *n == name).unwrap().1 = value.to_vec();
            let got = check(&as_pairs(&pairs), BODY, &[SECRET]);
            assert_eq!(got, Err(VerifyError::Malformed(name)), "{name}");
        }
    }

    #[test]
    fn sign_reproduces_the_official_vector_and_round_trips() {
        let headers = sign(SECRET, BODY, ID, 1614265330);
        let expected: Vec<(String, String)> = official(SIGNATURE)
            .into_iter()
            .map(|(n, v)| (n.to_owned(), String::from_utf8(v).unwrap()))
            .collect();
        assert_eq!(headers, expected);

        let headers = sign(b"whsec_c2VjcmV0LWtleS1ieXRlcw==", b"{}", "msg_1", 42);
        let pairs = signed_pairs(&headers);
        let got = check(&pairs, b"{}", &[b"whsec_c2VjcmV0LWtleS1ieXRlcw=="]);
        assert_eq!(got.map(|v| v.timestamp), Ok(Some(42)));
    }

    #[test]
    fn sign_with_an_undecodable_secret_emits_no_signature() {
        let headers = sign(b"whsec_%%%", b"{}", "msg_1", 42);
        assert!(headers.iter().all(|(n, _)| n != "webhook-signature"));
    }
}
