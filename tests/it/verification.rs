//! Forged, tampered, unsigned, stale and future-dated deliveries are refused;
//! every active secret verifies; rotated secret files take effect live.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hookgate::provider::{Algorithm, Encoding, HmacScheme, Scheme, Template};

use crate::support::fixture::GateFixture;
use crate::support::gate::{SECRET, signed, stripe_event};

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test]
async fn forged_tampered_unsigned_stale_and_future_deliveries_are_refused() {
    let gate = GateFixture::stripe()
        .provider_extra("tolerance = \"5m\"\nfuture_tolerance = \"1m\"\nreject_status = 401")
        .start()
        .await;
    let path = "/webhooks/stripe";
    let body = stripe_event("evt_forged");

    let forged = signed(&Scheme::Stripe, "whsec_attacker_guess", &body, "", None);
    let a = gate.post(path, &forged, &body).await;
    assert_eq!(a.status, 401, "reject_status applies");
    assert_eq!(a.json()["error"], "invalid_signature");
    assert_eq!(a.result(), "invalid_signature");

    let good = signed(&Scheme::Stripe, SECRET, &body, "", None);
    let mut tampered = body.clone();
    tampered[12] ^= 1;
    let a = gate.post(path, &good, &tampered).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    let a = gate.post(path, &[], &body).await;
    assert_eq!(a.json()["error"], "invalid_signature");
    let garbled = vec![("stripe-signature".to_string(), "t=abc,v1=zz".to_string())];
    let a = gate.post(path, &garbled, &body).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    let stale = signed(&Scheme::Stripe, SECRET, &body, "", Some(now() - 400));
    let a = gate.post(path, &stale, &body).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"], "stale_timestamp");

    let future = signed(&Scheme::Stripe, SECRET, &body, "", Some(now() + 120));
    let a = gate.post(path, &future, &body).await;
    assert_eq!(a.json()["error"], "stale_timestamp");

    let edge = signed(&Scheme::Stripe, SECRET, &body, "", Some(now() - 200));
    let a = gate.post(path, &edge, &body).await;
    assert_eq!(a.result(), "forwarded", "inside the window");
    assert_eq!(
        gate.upstream().count(),
        1,
        "only the genuine delivery reached the app"
    );
    // No message leaks the expected signature or the secret.
    assert!(!String::from_utf8_lossy(&a.body).contains(SECRET));
    gate.shutdown().await;
}

#[tokio::test]
async fn every_active_secret_verifies_and_expired_ones_do_not() {
    let gate = GateFixture::provider("github", Scheme::Github)
        .secret("secret-current")
        .secret("secret-previous")
        .secret_until("secret-retired", "2020-01-01T00:00:00Z")
        .start()
        .await;
    for (n, secret) in ["secret-current", "secret-previous"].iter().enumerate() {
        let body = format!("{{\"zen\":\"{n}\"}}").into_bytes();
        let headers = signed(&Scheme::Github, secret, &body, &format!("guid-{n}"), None);
        let a = gate.post("/webhooks/github", &headers, &body).await;
        assert_eq!(a.result(), "forwarded", "secret {n} verifies");
    }
    let body = b"{\"zen\":\"old\"}";
    let headers = signed(&Scheme::Github, "secret-retired", body, "guid-old", None);
    let a = gate.post("/webhooks/github", &headers, body).await;
    assert_eq!(a.json()["error"], "invalid_signature", "past not_after");
    assert_eq!(gate.upstream().count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_rotated_secret_file_takes_effect_without_a_restart() {
    let gate = GateFixture::provider("std", Scheme::Standard)
        .secret("before-rotation")
        .start()
        .await;
    let new_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let body = b"{\"type\":\"ping\"}";
    let headers = signed(&Scheme::Standard, new_secret, body, "msg_rot", None);
    let a = gate.post("/webhooks/std", &headers, body).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    std::fs::write(gate.fixture().secret_path("std", 0), new_secret).unwrap();
    let mut result = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let a = gate.post("/webhooks/std", &headers, body).await;
        result = a.result().to_owned();
        if result == "forwarded" {
            break;
        }
    }
    assert_eq!(result, "forwarded");
    gate.shutdown().await;
}

#[tokio::test]
async fn a_provider_without_a_usable_secret_refuses_everything() {
    let fixture = GateFixture::provider("stripe", Scheme::Stripe);
    let missing = format!("file:{}", fixture.dir().join("not-there").display());
    let gate = fixture.secret_source(&missing).start().await;
    let body = stripe_event("evt_nosecret");
    let headers = signed(&Scheme::Stripe, "", &body, "", None);
    let a = gate.post("/webhooks/stripe", &headers, &body).await;
    assert_eq!(a.json()["error"], "invalid_signature");
    assert_eq!(gate.upstream().count(), 0);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_generic_hmac_sender_with_a_signed_timestamp() {
    let scheme = Scheme::Hmac(HmacScheme {
        header: "x-signature".parse().unwrap(),
        prefix: "sha512=".into(),
        encoding: Encoding::Base64,
        algorithm: Algorithm::Sha512,
        timestamp_header: Some("x-timestamp".parse().unwrap()),
        template: Template::parse("{timestamp}.{body}").unwrap(),
    });
    let gate = GateFixture::provider("acme", scheme.clone())
        .secret("acme-secret")
        .provider_extra("signature_header = \"X-Signature\"\nsignature_prefix = \"sha512=\"\nencoding = \"base64\"\nalgorithm = \"sha512\"\ntimestamp_header = \"X-Timestamp\"\nsigned_payload = \"{timestamp}.{body}\"\nkey = \"json:/event/id\"")
        .start()
        .await;
    let body = br#"{"event":{"id":"A-1"}}"#;
    let a = gate.deliver(body).await;
    assert_eq!(a.result(), "forwarded");
    assert_eq!(
        gate.upstream().received()[0].headers["hookgate-event-key"],
        "acme:a-1"
    );
    let stale = signed(&scheme, "acme-secret", body, "", Some(now() - 3600));
    let a = gate.post("/webhooks/acme", &stale, body).await;
    assert_eq!(a.json()["error"], "stale_timestamp");
    gate.shutdown().await;
}
