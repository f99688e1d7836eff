//! The `sendgrid` scheme (Twilio SendGrid's signed Event Webhook):
//! `X-Twilio-Email-Event-Webhook-Signature: <base64 DER>` with
//! `X-Twilio-Email-Event-Webhook-Timestamp`, ECDSA P-256 / SHA-256 over
//! `{timestamp}{body}` (no separator).
//!
//! Unlike the HMAC schemes, the configured "secret" is the public
//! verification key SendGrid shows (base64 DER SubjectPublicKeyInfo). Signing
//! needs the matching private key, which only SendGrid holds, so signing for
//! tests goes through [`sign_with_private_key`] with a key of one's own.

use base64::Engine as _;
use p256::ecdsa::signature::{MultipartSigner, MultipartVerifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey};

use super::crypto;
use super::descriptor::{DefaultKey, Descriptor};
use super::{Delivery, SignedHeaders, Verified, VerifyError};
use crate::secret::ActiveSecret;
use crate::settings::OnMissingKey;
use std::time::Duration;

/// SendGrid: a batch key, every event of the array keyed on its own;
/// retries for up to 24 hours.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: "sendgrid",
    signature_headers: &[
        "x-twilio-email-event-webhook-signature",
        "x-twilio-email-event-webhook-timestamp",
    ],
    key: Some(DefaultKey::plain("json:/*/sg_event_id")),
    retry_window: Some(Duration::from_secs(24 * 3600)),
    on_missing_key: OnMissingKey::Reject,
};

const SIGNATURE: &str = "X-Twilio-Email-Event-Webhook-Signature";
const TIMESTAMP: &str = "X-Twilio-Email-Event-Webhook-Timestamp";

/// Verifies against every configured verification key; any match passes. A
/// secret that is not a P-256 public key cannot match; if none is one, the
/// provider has no usable secret. The timestamp is returned unchecked.
pub fn verify(delivery: &Delivery<'_>, secrets: &[ActiveSecret]) -> Result<Verified, VerifyError> {
    let headers = delivery.headers;
    let signature = crypto::decode_base64(crypto::header_text(headers, SIGNATURE, SIGNATURE)?)
        .and_then(|der| Signature::from_der(&der).ok())
        .ok_or(VerifyError::Malformed(SIGNATURE))?;
    let (ts, timestamp) = crypto::signed_timestamp(headers, TIMESTAMP, TIMESTAMP)?;
    let signed: [&[u8]; 2] = [ts.as_bytes(), delivery.body];
    // SendGrid's signatures may have a high `s`; p256 accepts both halves,
    // as SendGrid's own verifiers do.
    let secret_index = crypto::first_secret(secrets, |secret| {
        let key = verifying_key(secret)?;
        Some(key.multipart_verify(&signed, &signature).is_ok())
    })?;
    Ok(Verified {
        secret_index,
        timestamp: Some(timestamp),
    })
}

/// The headers SendGrid would send for `body` at `timestamp`, signed with a
/// P-256 private key given as PKCS#8 (`BEGIN PRIVATE KEY`) or SEC1 (`BEGIN
/// EC PRIVATE KEY`), PEM or DER. For tests and `hookgate sign`-like tooling:
/// the gate itself only ever holds the public key.
///
/// Errors say what the key is not, never what it contains.
pub fn sign_with_private_key(
    private_key: &[u8],
    body: &[u8],
    timestamp: i64,
) -> Result<SignedHeaders, String> {
    let key = signing_key(private_key).ok_or_else(|| {
        "the private key is not a P-256 key in PKCS#8 or SEC1 form (PEM or DER)".to_owned()
    })?;
    let ts = timestamp.to_string();
    let signature: Signature = key.multipart_sign(&[ts.as_bytes(), body]);
    let der = base64::engine::general_purpose::STANDARD.encode(signature.to_der());
    Ok(vec![
        (SIGNATURE.to_owned(), der),
        (TIMESTAMP.to_owned(), ts),
    ])
}

/// The verification key of a secret: base64 DER SubjectPublicKeyInfo, as
/// SendGrid displays it. Whitespace anywhere is ignored, so a key pasted
/// with line breaks or a trailing newline still parses.
fn verifying_key(secret: &[u8]) -> Option<VerifyingKey> {
    let text: Vec<u8> = secret
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    let der = crypto::decode_base64(text)?;
    VerifyingKey::from_public_key_der(&der).ok()
}

fn signing_key(private_key: &[u8]) -> Option<SigningKey> {
    let from_sec1 = |secret: p256::SecretKey| SigningKey::from(&secret);
    let text = std::str::from_utf8(private_key).unwrap_or_default();
    if let Some(pem) = pem_block(text, "PRIVATE KEY") {
        SigningKey::from_pkcs8_pem(pem).ok()
    } else if let Some(pem) = pem_block(text, "EC PRIVATE KEY") {
        p256::SecretKey::from_sec1_pem(pem).ok().map(from_sec1)
    } else {
        SigningKey::from_pkcs8_der(private_key).ok().or_else(|| {
            p256::SecretKey::from_sec1_der(private_key)
                .ok()
                .map(from_sec1)
        })
    }
}

/// The PEM block with this label, wherever it sits in the text: `openssl
/// ecparam -genkey` writes an `EC PARAMETERS` block before the key.
fn pem_block<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin)?;
    let stop = start + text[start..].find(&end)? + end.len();
    Some(&text[start..stop])
}

#[cfg(test)]
mod tests {
    use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};

    use super::*;
    use crate::provider::crypto::tests::{Outcome, Pairs, run, signed_pairs};

    fn check(pairs: Pairs<'_>, body: &[u8], keys: &[&[u8]]) -> Outcome {
        run(verify, "/webhooks/sendgrid", pairs, body, keys)
    }

    /// sendgrid-python's `test/unit/test_eventwebhook.py`.
    const PUBLIC_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g==";
    const TS: &str = "1600112502";
    const OFFICIAL: &str = "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15TluLtEZtM=";
    const PAYLOAD: &str = concat!(
        r#"[{"email":"hello@world.com","event":"dropped","reason":"Bounced Address","#,
        r#""sg_event_id":"ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA","#,
        r#""sg_message_id":"LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0","#,
        r#""smtp-id":"<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>","timestamp":1600112492}]"#,
        "\r\n"
    );

    /// A fixed test scalar: the key pair is reproducible without an RNG.
    fn test_key() -> SigningKey {
        SigningKey::from_slice(&[0x2a; 32]).unwrap()
    }

    fn public_base64(key: &SigningKey) -> String {
        let der = key.verifying_key().to_public_key_der().unwrap();
        base64::engine::general_purpose::STANDARD.encode(der.as_bytes())
    }

    fn official<'a>(signature: &'a [u8], ts: &'a [u8]) -> [(&'static str, &'a [u8]); 2] {
        [(SIGNATURE, signature), (TIMESTAMP, ts)]
    }

    #[test]
    fn official_vector_verifies() {
        let got = check(
            &official(OFFICIAL.as_bytes(), TS.as_bytes()),
            PAYLOAD.as_bytes(),
            &[PUBLIC_KEY.as_bytes()],
        );
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 0,
                timestamp: Some(1600112502)
            })
        );
    }

    #[test]
    fn official_signature_has_a_high_s() {
        // So a low-s-only verifier (as in Bitcoin) would refuse SendGrid;
        // p256 takes both, which `official_vector_verifies` relies on.
        let der = crypto::decode_base64(OFFICIAL).unwrap();
        let signature = Signature::from_der(&der).unwrap();
        assert_ne!(signature.normalize_s(), signature);
    }

    #[test]
    fn official_vector_needs_the_exact_payload_and_timestamp() {
        let key = [PUBLIC_KEY.as_bytes()];
        let pairs = official(OFFICIAL.as_bytes(), TS.as_bytes());
        let trimmed = PAYLOAD.trim_end();
        assert_eq!(
            check(&pairs, trimmed.as_bytes(), &key),
            Err(VerifyError::NoMatch)
        );
        let tampered = PAYLOAD.replace("dropped", "Dropped");
        assert_eq!(
            check(&pairs, tampered.as_bytes(), &key),
            Err(VerifyError::NoMatch)
        );
        let moved = official(OFFICIAL.as_bytes(), b"1600112503");
        assert_eq!(
            check(&moved, PAYLOAD.as_bytes(), &key),
            Err(VerifyError::NoMatch)
        );
    }

    #[test]
    fn keys_with_whitespace_are_accepted_and_the_matching_index_is_reported() {
        let wrapped = format!("  {}\n{}\n", &PUBLIC_KEY[..64], &PUBLIC_KEY[64..]);
        let other = public_base64(&test_key());
        let got = check(
            &official(OFFICIAL.as_bytes(), TS.as_bytes()),
            PAYLOAD.as_bytes(),
            &[other.as_bytes(), wrapped.as_bytes()],
        );
        assert_eq!(got.map(|v| v.secret_index), Ok(1));
    }

    #[test]
    fn garbage_keys_are_skipped_and_none_usable_is_reported() {
        let pairs = official(OFFICIAL.as_bytes(), TS.as_bytes());
        let off_curve = format!("{}{}==", &PUBLIC_KEY[..36], "A".repeat(86));
        let garbage: [&[u8]; 6] = [
            b"not base64!",
            b"AAAA",
            b"\xff\xfe",
            // A valid SubjectPublicKeyInfo cut short.
            &PUBLIC_KEY.as_bytes()[..60],
            // A point that is not on the curve.
            off_curve.as_bytes(),
            b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        ];
        assert_eq!(
            check(&pairs, PAYLOAD.as_bytes(), &garbage),
            Err(VerifyError::NoUsableSecret)
        );
        let mut with_real = garbage.to_vec();
        with_real.push(PUBLIC_KEY.as_bytes());
        assert_eq!(
            check(&pairs, PAYLOAD.as_bytes(), &with_real).map(|v| v.secret_index),
            Ok(6)
        );
    }

    #[test]
    fn missing_and_malformed_headers() {
        let key = [PUBLIC_KEY.as_bytes()];
        let got = check(&[(TIMESTAMP, TS.as_bytes())], PAYLOAD.as_bytes(), &key);
        assert_eq!(got, Err(VerifyError::MissingHeader(SIGNATURE)));
        let got = check(
            &[(SIGNATURE, OFFICIAL.as_bytes())],
            PAYLOAD.as_bytes(),
            &key,
        );
        assert_eq!(got, Err(VerifyError::MissingHeader(TIMESTAMP)));

        // Base64 that is not a DER signature, DER with trailing bytes, a raw
        // 64-byte r||s signature, a zero r: all malformed, none panics.
        let trailing = format!("{}AA==", OFFICIAL.trim_end_matches('='));
        let raw = base64::engine::general_purpose::STANDARD.encode([7u8; 64]);
        let zero_r = base64::engine::general_purpose::STANDARD.encode([0x30, 6, 2, 1, 0, 2, 1, 1]);
        let bad_signatures: [&[u8]; 7] = [
            b"",
            b"not base64!",
            b"\xff",
            b"AAAA",
            trailing.as_bytes(),
            raw.as_bytes(),
            zero_r.as_bytes(),
        ];
        for bad in bad_signatures {
            let got = check(&official(bad, TS.as_bytes()), PAYLOAD.as_bytes(), &key);
            assert_eq!(got, Err(VerifyError::Malformed(SIGNATURE)), "{bad:?}");
        }
        for bad in [&b""[..], b"soon", b"-1", b"1600112502.0", b"\xff"] {
            let got = check(
                &official(OFFICIAL.as_bytes(), bad),
                PAYLOAD.as_bytes(),
                &key,
            );
            assert_eq!(got, Err(VerifyError::Malformed(TIMESTAMP)), "{bad:?}");
        }
    }

    #[test]
    fn pkcs8_pem_signing_round_trips() {
        let key = test_key();
        let pem = key.to_pkcs8_pem(LineEnding::LF).unwrap();
        let body = br#"[{"sg_event_id":"e1","event":"delivered"}]"#;
        let headers = sign_with_private_key(pem.as_bytes(), body, 1_700_000_000).unwrap();
        assert_eq!(headers[0].0, SIGNATURE);
        assert_eq!(headers[1], (TIMESTAMP.to_owned(), "1700000000".to_owned()));
        let public = public_base64(&key);
        let got = check(
            &signed_pairs(&headers),
            body,
            &[PUBLIC_KEY.as_bytes(), public.as_bytes()],
        );
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 1,
                timestamp: Some(1_700_000_000)
            })
        );
        let got = check(
            &signed_pairs(&headers),
            br#"[{"sg_event_id":"e2","event":"delivered"}]"#,
            &[public.as_bytes()],
        );
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn sec1_pem_and_der_keys_sign_too() {
        let key = test_key();
        let public = public_base64(&key);
        let secret = p256::SecretKey::from(key.as_nonzero_scalar());
        let sec1_pem = secret.to_sec1_pem(LineEnding::CRLF).unwrap();
        let sec1_der = secret.to_sec1_der().unwrap();
        let pkcs8_der = key.to_pkcs8_der().unwrap();
        // As `openssl ecparam -name prime256v1 -genkey` writes it.
        let with_params = format!(
            "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{}",
            sec1_pem.as_str()
        );
        let forms: [&[u8]; 4] = [
            sec1_pem.as_bytes(),
            with_params.as_bytes(),
            &sec1_der,
            pkcs8_der.as_bytes(),
        ];
        for form in forms {
            let headers = sign_with_private_key(form, b"[]\r\n", 42).unwrap();
            let got = check(&signed_pairs(&headers), b"[]\r\n", &[public.as_bytes()]);
            assert_eq!(got.map(|v| v.timestamp), Ok(Some(42)));
        }
    }

    #[test]
    fn unusable_private_keys_are_errors_that_do_not_echo_the_key() {
        let public_pem = test_key()
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap();
        let inputs: [&[u8]; 5] = [
            b"",
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            b"-----BEGIN EC PRIVATE KEY-----\nsecretstuff\n-----END EC PRIVATE KEY-----\n",
            public_pem.as_bytes(),
            b"\x30\x03\x02\x01\x00",
        ];
        for input in inputs {
            let err = sign_with_private_key(input, b"[]", 1).unwrap_err();
            assert!(!err.contains("secretstuff"), "{err}");
            assert!(err.contains("P-256"), "{err}");
        }
    }
}
