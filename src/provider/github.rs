//! The `github` scheme: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 over
//! the raw body. GitHub signs no timestamp, so the dedupe store is the only
//! guard against replays.

use super::crypto::{self, Tag};
use super::descriptor::{DefaultKey, Descriptor};
use super::{Algorithm, Delivery, SignedHeaders, Verified, VerifyError};
use crate::secret::ActiveSecret;
use crate::settings::OnMissingKey;
use std::time::Duration;

/// GitHub: the delivery GUID, scoped by the hook (one GUID can reach many
/// hooks); manual redelivery within 3 days.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: "github",
    signature_headers: &["x-hub-signature-256", "x-hub-signature"],
    key: Some(DefaultKey {
        source: "header:X-GitHub-Delivery",
        aliases: &[],
        scope: Some("x-github-hook-id"),
    }),
    retry_window: Some(Duration::from_secs(3 * 24 * 3600)),
    on_missing_key: OnMissingKey::Reject,
};

const HEADER: &str = "X-Hub-Signature-256";
const PREFIX: &str = "sha256=";

/// Verifies the body's signature against every active secret.
pub fn verify(delivery: &Delivery<'_>, secrets: &[ActiveSecret]) -> Result<Verified, VerifyError> {
    let signature = crypto::header_text(delivery.headers, HEADER, HEADER)?
        .strip_prefix(PREFIX)
        .and_then(crypto::decode_hex)
        .ok_or(VerifyError::Malformed(HEADER))?;
    crypto::verify_sha256(secrets, &[delivery.body], &[signature], None)
}

/// The signature and delivery id headers GitHub would send for `body`.
pub fn sign(secret: &[u8], body: &[u8], id: &str) -> SignedHeaders {
    let tag = Tag::compute(Algorithm::Sha256, secret, &[body]);
    vec![
        (HEADER.to_owned(), format!("{PREFIX}{}", tag.to_hex())),
        ("X-GitHub-Delivery".to_owned(), id.to_owned()),
    ]
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::provider::crypto::tests::{Outcome, run};

    const OFFICIAL: &str =
        "sha256=4864d2759938a15468b5df9ade20bf161da9b4f737ea61794142f3484236bda3";

    fn check(header: Option<&[u8]>, body: &[u8], keys: &[&[u8]]) -> Outcome {
        let pairs: Vec<(&str, &[u8])> = header.map(|h| (HEADER, h)).into_iter().collect();
        run(verify, "/webhooks/github", &pairs, body, keys)
    }

    #[test]
    fn official_vector_verifies() {
        let got = check(
            Some(OFFICIAL.as_bytes()),
            br#"{"foo":"bar"}"#,
            &[b"mysecret"],
        );
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 0,
                timestamp: None
            })
        );
    }

    #[test]
    fn uppercase_hex_is_accepted() {
        let upper = format!("sha256={}", OFFICIAL[7..].to_uppercase());
        let got = check(Some(upper.as_bytes()), br#"{"foo":"bar"}"#, &[b"mysecret"]);
        assert!(got.is_ok());
    }

    #[test]
    fn tampered_body_or_wrong_secret_fails() {
        let header = Some(OFFICIAL.as_bytes());
        assert_eq!(
            check(header, br#"{"foo":"baz"}"#, &[b"mysecret"]),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            check(header, br#"{"foo":"bar"}"#, &[b"notmysecret"]),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn second_secret_matching_reports_its_index() {
        let got = check(
            Some(OFFICIAL.as_bytes()),
            br#"{"foo":"bar"}"#,
            &[b"previous", b"mysecret"],
        );
        assert_eq!(got.map(|v| v.secret_index), Ok(1));
    }

    #[test]
    fn missing_and_malformed_headers() {
        assert_eq!(
            check(None, b"{}", &[b"s"]),
            Err(VerifyError::MissingHeader("X-Hub-Signature-256"))
        );
        let bare_hex = &OFFICIAL[7..];
        let sha1 = "sha1=4864d2759938a15468b5df9ade20bf161da9b4f7";
        for bad in ["", "sha256=", "sha256=xyz", bare_hex, sha1] {
            let got = check(Some(bad.as_bytes()), br#"{"foo":"bar"}"#, &[b"mysecret"]);
            assert_eq!(got, Err(VerifyError::Malformed(HEADER)), "{bad}");
        }
        let got = check(Some(b"sha256=\xff"), b"{}", &[b"s"]);
        assert_eq!(got, Err(VerifyError::Malformed(HEADER)));
    }

    #[test]
    fn sign_round_trips_and_matches_the_official_vector() {
        let headers = sign(
            b"mysecret",
            br#"{"foo":"bar"}"#,
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        );
        assert_eq!(
            headers,
            vec![
                (HEADER.to_owned(), OFFICIAL.to_owned()),
                (
                    "X-GitHub-Delivery".to_owned(),
                    "72d3162e-cc78-11e3-81ab-4c9367dc0958".to_owned()
                ),
            ]
        );
        let body = b"payload=%7B%7D";
        let headers = sign(b"k", body, "id");
        assert!(check(Some(headers[0].1.as_bytes()), body, &[b"k"]).is_ok());
    }
}
