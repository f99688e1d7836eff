//! SendGrid-style batches: every element keyed on its own (SPEC section 3).

use base64::Engine as _;
use p256::ecdsa::SigningKey;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};

use hookgate::provider::Scheme;

use crate::support::fixture::{Gate, GateFixture};
use crate::support::gate::Answer;
use crate::support::upstream::Behavior;

/// A reproducible P-256 key pair: (private PKCS#8 DER, public base64 DER).
fn key_pair() -> (Vec<u8>, String) {
    let key = SigningKey::from_slice(&[0x17; 32]).unwrap();
    let private = key.to_pkcs8_der().unwrap().as_bytes().to_vec();
    let public = key.verifying_key().to_public_key_der().unwrap();
    (
        private,
        base64::engine::general_purpose::STANDARD.encode(public.as_bytes()),
    )
}

fn signed(private: &[u8], body: &[u8]) -> Vec<(String, String)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut headers = hookgate::provider::sendgrid_sign(private, body, now).unwrap();
    headers.push(("content-type".into(), "application/json".into()));
    headers
}

/// A gate with one SendGrid provider verifying with the public half of
/// `key_pair`; returns it with the private half, to sign with.
async fn sendgrid_gate() -> (Gate, Vec<u8>) {
    let (private, public) = key_pair();
    let gate = GateFixture::provider("sendgrid", Scheme::Sendgrid)
        .secret(&public)
        .start()
        .await;
    (gate, private)
}

/// Posts `body` to the SendGrid provider, signed now with `private`.
async fn deliver(gate: &Gate, private: &[u8], body: &str) -> Answer {
    let headers = signed(private, body.as_bytes());
    gate.post("/webhooks/sendgrid", &headers, body.as_bytes())
        .await
}

fn event(id: &str) -> String {
    format!(
        r#"{{"email":"a@example.com","event":"delivered","sg_event_id":"{id}","timestamp":1600112492}}"#
    )
}

#[tokio::test]
async fn batches_are_deduplicated_element_by_element() {
    let (gate, private) = sendgrid_gate().await;
    let up = gate.upstream();
    let (a, b, c) = (event("evt-A"), event("evt-B"), event("evt-C"));

    // All fresh: the body goes through unchanged, signature and all.
    let first = format!("[{a},\n {b}]\r\n");
    let answer = deliver(&gate, &private, &first).await;
    assert_eq!(answer.result(), "forwarded");
    let got = up.received();
    assert_eq!(got[0].body.as_ref(), first.as_bytes());
    assert!(
        got[0]
            .headers
            .contains_key("x-twilio-email-event-webhook-signature")
    );
    assert!(!got[0].headers.contains_key("hookgate-batch"));

    // The whole batch again: a duplicate, the app is not called.
    let again = deliver(&gate, &private, &first).await;
    assert_eq!(again.result(), "duplicate");
    assert_eq!(up.count(), 1);

    // A mix: only the fresh element, with its exact bytes, and no signature.
    let mixed = format!("[{a}, {c}]");
    let answer = deliver(&gate, &private, &mixed).await;
    assert_eq!(answer.result(), "forwarded");
    let got = up.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].body.as_ref(), format!("[{c}]").as_bytes());
    assert_eq!(got[1].headers["hookgate-batch"], "forwarded=1;duplicates=1");
    assert_eq!(got[1].headers["hookgate-verified"], "sendgrid");
    assert!(
        !got[1]
            .headers
            .contains_key("x-twilio-email-event-webhook-signature")
    );
    assert!(
        !got[1]
            .headers
            .contains_key("x-twilio-email-event-webhook-timestamp")
    );
    assert_eq!(
        got[1].headers["content-length"],
        format!("[{c}]").len().to_string()
    );

    // A later redelivery of the mixed batch is a duplicate as a whole.
    let redelivery = deliver(&gate, &private, &mixed).await;
    assert_eq!(redelivery.result(), "duplicate");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_failed_batch_releases_every_element() {
    let (gate, private) = sendgrid_gate().await;
    let up = gate.upstream();
    let body = format!("[{},{}]", event("f-1"), event("f-2"));
    up.set(Behavior::Status(503));
    let failed = deliver(&gate, &private, &body).await;
    assert_eq!(failed.status, 503);
    up.set(Behavior::Status(200));
    let retried = deliver(&gate, &private, &body).await;
    assert_eq!(retried.result(), "forwarded");
    assert_eq!(
        up.received()[1].body.as_ref(),
        body.as_bytes(),
        "whole batch, both released"
    );

    // An element without its key: the batch has no usable key.
    let keyless = r#"[{"event":"open"}]"#;
    let answer = deliver(&gate, &private, keyless).await;
    assert_eq!(answer.json()["error"], "missing_key");
    gate.shutdown().await;
}
