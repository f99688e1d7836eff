//! The `stripe` scheme: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=..][,v0=..]`,
//! HMAC-SHA256 over `{t}.{body}` keyed by the whole `whsec_...` string.

use super::crypto::{self, Tag};
use super::descriptor::{DefaultKey, Descriptor};
use super::{Algorithm, Delivery, SignedHeaders, Verified, VerifyError};
use crate::secret::ActiveSecret;
use crate::settings::OnMissingKey;
use std::time::Duration;

/// Stripe: the event id is the body's `id`; live mode retries for 3 days.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: "stripe",
    signature_headers: &["stripe-signature"],
    key: Some(DefaultKey::plain("json:/id")),
    retry_window: Some(Duration::from_secs(3 * 24 * 3600)),
    on_missing_key: OnMissingKey::Reject,
};

const HEADER: &str = "Stripe-Signature";

/// Verifies against every active secret. During a secret roll Stripe sends
/// one `v1` per secret, so any `v1` may match any secret. The timestamp is
/// returned unchecked: the window phase judges it.
pub fn verify(delivery: &Delivery<'_>, secrets: &[ActiveSecret]) -> Result<Verified, VerifyError> {
    let text = crypto::header_text(delivery.headers, HEADER, HEADER)?;
    let (t, signatures) = parse(text).ok_or(VerifyError::Malformed(HEADER))?;
    let timestamp = crypto::parse_unix_seconds(t).ok_or(VerifyError::Malformed(HEADER))?;
    let parts: [&[u8]; 3] = [t.as_bytes(), b".", delivery.body];
    crypto::verify_sha256(secrets, &parts, &signatures, Some(timestamp))
}

/// The header Stripe would send for `body` at `timestamp`.
pub fn sign(secret: &[u8], body: &[u8], timestamp: i64) -> SignedHeaders {
    let t = timestamp.to_string();
    let tag = Tag::compute(Algorithm::Sha256, secret, &[t.as_bytes(), b".", body]);
    vec![(HEADER.to_owned(), format!("t={t},v1={}", tag.to_hex()))]
}

/// Splits the header into the `t` text and the decoded `v1` signatures.
///
/// `v0` and unknown schemes are ignored, and so is a `v1` that is not hex: it
/// could never match, and a sender may add entries we do not understand. The
/// header is malformed only when no `t`, two `t`s (which one was signed?) or
/// no decodable `v1` is left.
fn parse(text: &str) -> Option<(&str, Vec<Vec<u8>>)> {
    let mut t = None;
    let mut v1 = Vec::new();
    for part in text.split(',') {
        let Some((name, value)) = part.trim().split_once('=') else {
            continue;
        };
        match name {
            "t" if t.is_some() => return None,
            "t" => t = Some(value),
            "v1" => v1.extend(crypto::decode_hex(value)),
            _ => {}
        }
    }
    if v1.is_empty() {
        return None;
    }
    Some((t?, v1))
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::provider::crypto::tests::{Outcome, run};

    /// stripe-dotnet's `event_test_signature.json`, byte for byte.
    const FIXTURE: &str = r#"{
  "id": "evt_123",
  "object": "event",
  "account": "acct_123",
  "api_version": "2017-05-25",
  "created": 1533204620,
  "data": {
    "object": {
      "id": "cus_123",
      "object": "customer",
      "created": 123456789,
      "email": "test@stripe.com",
      "livemode": false,
      "metadata": {}
    }
  },
  "livemode": false,
  "pending_webhooks": 1,
  "request": {
    "id": "req_123",
    "idempotency_key": "idempotency-key-123"
  },
  "type": "customer.created"
}
"#;
    const OFFICIAL_HEADER: &str = "t=1533204620,\
        v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7,\
        v0=63f3a72374a733066c4be69ed7f8e5ac85c22c9f0a6a612ab9a025a9e4ee7eef";

    fn check(header: Option<&[u8]>, body: &[u8], keys: &[&[u8]]) -> Outcome {
        let pairs: Vec<(&str, &[u8])> = header.map(|h| (HEADER, h)).into_iter().collect();
        run(verify, "/webhooks/stripe", &pairs, body, keys)
    }

    #[test]
    fn fixture_is_the_official_file() {
        assert_eq!(FIXTURE.len(), 484);
        assert_eq!(
            const_hex::encode(Sha256::digest(FIXTURE.as_bytes())),
            "98cc89412549ca7faf118fca984763bdb6f81e13d1ce8c528dbbb5be602ec1be"
        );
    }

    #[test]
    fn official_vector_verifies() {
        let got = check(
            Some(OFFICIAL_HEADER.as_bytes()),
            FIXTURE.as_bytes(),
            &[b"webhook_secret"],
        );
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 0,
                timestamp: Some(1533204620)
            })
        );
    }

    #[test]
    fn official_vector_fails_with_a_tampered_body_or_wrong_secret() {
        let mut body = FIXTURE.as_bytes().to_vec();
        body[10] ^= 1;
        let header = Some(OFFICIAL_HEADER.as_bytes());
        assert_eq!(
            check(header, &body, &[b"webhook_secret"]),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            check(header, FIXTURE.as_bytes(), &[b"whsec_other"]),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn second_secret_matching_reports_its_index() {
        let got = check(
            Some(OFFICIAL_HEADER.as_bytes()),
            FIXTURE.as_bytes(),
            &[b"whsec_old", b"webhook_secret"],
        );
        assert_eq!(got.map(|v| v.secret_index), Ok(1));
    }

    #[test]
    fn any_v1_may_match_and_bad_extra_entries_are_ignored() {
        let good = &sign(b"new", b"{}", 7)[0].1;
        let v1 = good.split_once(",v1=").unwrap().1;
        let header = format!("t=7,v1=00ff,v1=nothex,scheme=x,junk,v1={v1},v0=abcd");
        let got = check(Some(header.as_bytes()), b"{}", &[b"old", b"new"]);
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 1,
                timestamp: Some(7)
            })
        );
    }

    #[test]
    fn v0_alone_does_not_verify() {
        let header = OFFICIAL_HEADER.replace("v1=", "v9=");
        let got = check(
            Some(header.as_bytes()),
            FIXTURE.as_bytes(),
            &[b"webhook_secret"],
        );
        assert_eq!(got, Err(VerifyError::Malformed(HEADER)));
    }

    #[test]
    fn missing_and_malformed_headers() {
        assert_eq!(
            check(None, b"{}", &[b"s"]),
            Err(VerifyError::MissingHeader("Stripe-Signature"))
        );
        let v1 = "v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7";
        let malformed = [
            String::new(),
            ",,,".into(),
            v1.into(),
            format!("t=abc,{v1}"),
            format!("t=-1,{v1}"),
            format!("t=1,t=2,{v1}"),
            "t=1533204620".into(),
            "t=1533204620,v1=zz".into(),
        ];
        for header in malformed {
            assert_eq!(
                check(Some(header.as_bytes()), b"{}", &[b"s"]),
                Err(VerifyError::Malformed(HEADER)),
                "{header}"
            );
        }
        assert_eq!(
            check(Some(b"t=1,v1=\xff\xfe"), b"{}", &[b"s"]),
            Err(VerifyError::Malformed(HEADER))
        );
    }

    #[test]
    fn sign_round_trips() {
        let headers = sign(b"whsec_test", b"{\"id\":\"evt_1\"}", 1_700_000_000);
        assert_eq!(headers.len(), 1);
        assert_eq!(headers[0].0, "Stripe-Signature");
        assert!(headers[0].1.starts_with("t=1700000000,v1="));
        let got = check(
            Some(headers[0].1.as_bytes()),
            b"{\"id\":\"evt_1\"}",
            &[b"whsec_test"],
        );
        assert_eq!(got.map(|v| v.timestamp), Ok(Some(1_700_000_000)));
    }

    #[test]
    fn sign_reproduces_the_official_v1() {
        let headers = sign(b"webhook_secret", FIXTURE.as_bytes(), 1533204620);
        assert!(OFFICIAL_HEADER.starts_with(&headers[0].1));
    }
}
