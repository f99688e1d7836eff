//! The `shopify` scheme: `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 over
//! the raw body keyed by the app's client secret. Newer "Events" deliveries
//! send the same headers without the `X-`. `X-Shopify-Triggered-At` is not
//! signed, so there is no timestamp to check: the dedupe store is the guard.

use super::crypto::{self, Tag};
use super::descriptor::{DefaultKey, Descriptor};
use super::{Algorithm, Delivery, SignedHeaders, Verified, VerifyError};
use crate::secret::ActiveSecret;
use crate::settings::OnMissingKey;
use std::time::Duration;

/// Shopify: the webhook id (newer "Events" deliveries drop the `X-`); 8
/// retries over 4 hours.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: "shopify",
    signature_headers: &["x-shopify-hmac-sha256", "shopify-hmac-sha256"],
    key: Some(DefaultKey {
        source: "header:X-Shopify-Webhook-Id",
        aliases: &["shopify-webhook-id"],
        scope: None,
    }),
    retry_window: Some(Duration::from_secs(4 * 3600)),
    on_missing_key: OnMissingKey::Reject,
};

const HEADER: &str = "X-Shopify-Hmac-Sha256";
/// The name on newer "Events" deliveries.
const UNPREFIXED: &str = "Shopify-Hmac-Sha256";

/// Verifies the body's signature against every active secret. A rotated
/// secret takes up to an hour to reach Shopify, so old and new both verify.
pub fn verify(delivery: &Delivery<'_>, secrets: &[ActiveSecret]) -> Result<Verified, VerifyError> {
    let headers = delivery.headers;
    // The classic name wins when both are present; errors name the header
    // that was read.
    let name = [HEADER, UNPREFIXED]
        .into_iter()
        .find(|name| headers.contains_key(*name))
        .unwrap_or(HEADER);
    let signature = crypto::decode_base64(crypto::header_text(headers, name, name)?)
        .ok_or(VerifyError::Malformed(name))?;
    crypto::verify_sha256(secrets, &[delivery.body], &[signature], None)
}

/// The signature, webhook id and topic headers Shopify would send for `body`.
pub fn sign(secret: &[u8], body: &[u8], id: &str) -> SignedHeaders {
    let tag = Tag::compute(Algorithm::Sha256, secret, &[body]);
    vec![
        (HEADER.to_owned(), tag.to_base64()),
        ("X-Shopify-Webhook-Id".to_owned(), id.to_owned()),
        ("X-Shopify-Topic".to_owned(), "orders/create".to_owned()),
    ]
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::provider::crypto::tests::{Outcome, Pairs, run};

    fn check(pairs: Pairs<'_>, body: &[u8], keys: &[&[u8]]) -> Outcome {
        run(verify, "/webhooks/shopify", pairs, body, keys)
    }

    /// Shopify/shopify-api-js webhook validation tests.
    const SECRET: &[u8] = b"test_secret_key";
    const BODY: &[u8] = br#"{"foo": "bar"}"#;
    const OFFICIAL: &str = "B23tXN681gZ0qIWNRrgtzBE9XSDo5yaUu6wfmhu3a7g=";

    #[test]
    fn official_vector_verifies_under_either_header_name() {
        for name in [HEADER, UNPREFIXED] {
            let got = check(&[(name, OFFICIAL.as_bytes())], BODY, &[SECRET]);
            assert_eq!(
                got,
                Ok(Verified {
                    secret_index: 0,
                    timestamp: None
                }),
                "{name}"
            );
        }
    }

    #[test]
    fn unpadded_base64_is_accepted() {
        let got = check(
            &[(HEADER, OFFICIAL.trim_end_matches('=').as_bytes())],
            BODY,
            &[SECRET],
        );
        assert!(got.is_ok());
    }

    #[test]
    fn tampered_body_or_wrong_secret_fails() {
        let pairs = [(HEADER, OFFICIAL.as_bytes())];
        assert_eq!(
            check(&pairs, br#"{"foo":"bar"}"#, &[SECRET]),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            check(&pairs, BODY, &[b"other_secret"]),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn second_secret_matching_reports_its_index() {
        let got = check(
            &[(HEADER, OFFICIAL.as_bytes())],
            BODY,
            &[b"old_secret", SECRET],
        );
        assert_eq!(got.map(|v| v.secret_index), Ok(1));
    }

    #[test]
    fn the_classic_header_wins_when_both_are_present() {
        let pairs: [(&str, &[u8]); 2] =
            [(HEADER, b"not base64!"), (UNPREFIXED, OFFICIAL.as_bytes())];
        assert_eq!(
            check(&pairs, BODY, &[SECRET]),
            Err(VerifyError::Malformed(HEADER))
        );
    }

    #[test]
    fn missing_and_malformed_headers() {
        assert_eq!(
            check(&[], BODY, &[SECRET]),
            Err(VerifyError::MissingHeader("X-Shopify-Hmac-Sha256"))
        );
        for name in [HEADER, UNPREFIXED] {
            for bad in [&b""[..], b"not base64!", b"sha256=AAAA", b"\xff"] {
                let got = check(&[(name, bad)], BODY, &[SECRET]);
                assert_eq!(got, Err(VerifyError::Malformed(name)), "{name} {bad:?}");
            }
        }
        // Hex text is also valid base64: it decodes to other bytes and
        // cannot match.
        let hex = b"076ded5cdebcd606749d45819a82b5cc113d5d20e8e7269a53ac1f9a1bb76bb8";
        assert_eq!(
            check(&[(HEADER, hex)], BODY, &[SECRET]),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn sign_reproduces_the_official_vector_and_round_trips() {
        let headers = sign(SECRET, BODY, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043");
        assert_eq!(
            headers,
            vec![
                (HEADER.to_owned(), OFFICIAL.to_owned()),
                (
                    "X-Shopify-Webhook-Id".to_owned(),
                    "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043".to_owned()
                ),
                ("X-Shopify-Topic".to_owned(), "orders/create".to_owned()),
            ]
        );
        let headers = sign(b"new", b"{\"id\":1}", "id-1");
        let pairs = [(headers[0].0.as_str(), headers[0].1.as_bytes())];
        assert!(check(&pairs, b"{\"id\":1}", &[b"new"]).is_ok());
        assert_eq!(
            check(&pairs, b"{\"id\":2}", &[b"new"]),
            Err(VerifyError::NoMatch)
        );
    }
}
