//! The `slack` scheme: `X-Slack-Signature: v0=<hex>` with
//! `X-Slack-Request-Timestamp`, HMAC-SHA256 over `v0:{ts}:{body}` keyed by
//! the app's signing secret.

use super::crypto::{self, Tag};
use super::descriptor::{DefaultKey, Descriptor, HOUR};
use super::{Algorithm, Delivery, SignedHeaders, Verified, VerifyError};
use crate::secret::ActiveSecret;
use crate::settings::OnMissingKey;

/// Slack: Events API deliveries carry `event_id`; url_verification, slash
/// commands and interactivity carry none (and are not retried), so they
/// pass without dedupe. Retries at once, +1 min and +5 min: an hour covers
/// them.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: "slack",
    signature_headers: &["x-slack-signature", "x-slack-request-timestamp"],
    key: Some(DefaultKey::plain("json:/event_id")),
    retry_window: Some(HOUR),
    on_missing_key: OnMissingKey::Forward,
};

const SIGNATURE: &str = "X-Slack-Signature";
const TIMESTAMP: &str = "X-Slack-Request-Timestamp";
const PREFIX: &str = "v0=";

/// Verifies against every active secret. The timestamp is returned
/// unchecked: the window phase judges it.
pub fn verify(delivery: &Delivery<'_>, secrets: &[ActiveSecret]) -> Result<Verified, VerifyError> {
    let headers = delivery.headers;
    let signature = crypto::header_text(headers, SIGNATURE, SIGNATURE)?
        .strip_prefix(PREFIX)
        .and_then(crypto::decode_hex)
        .ok_or(VerifyError::Malformed(SIGNATURE))?;
    let (ts, timestamp) = crypto::signed_timestamp(headers, TIMESTAMP, TIMESTAMP)?;
    let parts: [&[u8]; 4] = [b"v0:", ts.as_bytes(), b":", delivery.body];
    crypto::verify_sha256(secrets, &parts, &[signature], Some(timestamp))
}

/// The signature and timestamp headers Slack would send for `body`.
pub fn sign(secret: &[u8], body: &[u8], timestamp: i64) -> SignedHeaders {
    let ts = timestamp.to_string();
    let tag = Tag::compute(
        Algorithm::Sha256,
        secret,
        &[b"v0:", ts.as_bytes(), b":", body],
    );
    vec![
        (SIGNATURE.to_owned(), format!("{PREFIX}{}", tag.to_hex())),
        (TIMESTAMP.to_owned(), ts),
    ]
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::provider::crypto::tests::{Outcome, Pairs, run, signed_pairs};

    fn check(pairs: Pairs<'_>, body: &[u8], keys: &[&[u8]]) -> Outcome {
        run(verify, "/webhooks/slack", pairs, body, keys)
    }

    /// python-slack-sdk's `test_signature_verifier.py`.
    const SECRET: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
    const TS: &str = "1531420618";
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&\
        team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&\
        user_name=roadrunner&command=%2Fwebhook-collect&text=&\
        response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&\
        trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const OFFICIAL: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    fn official<'a>(signature: &'a [u8], ts: &'a [u8]) -> [(&'static str, &'a [u8]); 2] {
        [(SIGNATURE, signature), (TIMESTAMP, ts)]
    }

    #[test]
    fn official_vector_verifies() {
        let got = check(
            &official(OFFICIAL.as_bytes(), TS.as_bytes()),
            BODY.as_bytes(),
            &[SECRET],
        );
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 0,
                timestamp: Some(1531420618)
            })
        );
    }

    #[test]
    fn tampered_body_timestamp_or_wrong_secret_fails() {
        let pairs = official(OFFICIAL.as_bytes(), TS.as_bytes());
        let mut body = BODY.as_bytes().to_vec();
        body[0] ^= 1;
        assert_eq!(check(&pairs, &body, &[SECRET]), Err(VerifyError::NoMatch));
        assert_eq!(
            check(&pairs, BODY.as_bytes(), &[b"another-secret"]),
            Err(VerifyError::NoMatch)
        );
        let moved = official(OFFICIAL.as_bytes(), b"1531420619");
        assert_eq!(
            check(&moved, BODY.as_bytes(), &[SECRET]),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn second_secret_matching_reports_its_index() {
        let pairs = official(OFFICIAL.as_bytes(), TS.as_bytes());
        let got = check(&pairs, BODY.as_bytes(), &[b"rotated-out", SECRET]);
        assert_eq!(got.map(|v| v.secret_index), Ok(1));
    }

    #[test]
    fn missing_and_malformed_headers() {
        let got = check(&[(TIMESTAMP, TS.as_bytes())], b"{}", &[SECRET]);
        assert_eq!(got, Err(VerifyError::MissingHeader(SIGNATURE)));
        let got = check(&[(SIGNATURE, OFFICIAL.as_bytes())], b"{}", &[SECRET]);
        assert_eq!(got, Err(VerifyError::MissingHeader(TIMESTAMP)));

        let bare_hex = &OFFICIAL.as_bytes()[3..];
        for bad in [
            &b""[..],
            b"v0=",
            b"v0=xyz",
            b"v1=abcd",
            bare_hex,
            b"v0=\xff",
        ] {
            let got = check(&official(bad, TS.as_bytes()), BODY.as_bytes(), &[SECRET]);
            assert_eq!(got, Err(VerifyError::Malformed(SIGNATURE)), "{bad:?}");
        }
        for bad in [&b""[..], b"soon", b"-1", b"1531420618.5", b"\xff"] {
            let got = check(
                &official(OFFICIAL.as_bytes(), bad),
                BODY.as_bytes(),
                &[SECRET],
            );
            assert_eq!(got, Err(VerifyError::Malformed(TIMESTAMP)), "{bad:?}");
        }
    }

    #[test]
    fn sign_reproduces_the_official_vector_and_round_trips() {
        let headers = sign(SECRET, BODY.as_bytes(), 1531420618);
        assert_eq!(
            headers,
            vec![
                (SIGNATURE.to_owned(), OFFICIAL.to_owned()),
                (TIMESTAMP.to_owned(), TS.to_owned()),
            ]
        );

        let body = br#"{"type":"event_callback","event_id":"Ev01"}"#;
        let headers = sign(b"new", body, 1_700_000_000);
        let pairs = signed_pairs(&headers);
        let got = check(&pairs, body, &[b"old", b"new"]);
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 1,
                timestamp: Some(1_700_000_000)
            })
        );
        let got = check(
            &pairs,
            br#"{"type":"event_callback","event_id":"Ev02"}"#,
            &[b"new"],
        );
        assert_eq!(got, Err(VerifyError::NoMatch));
    }
}
