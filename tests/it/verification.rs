//! Forged, tampered, unsigned, stale and future-dated deliveries are refused;
//! every active secret verifies; rotated secret files take effect live.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hookgate::provider::{Algorithm, Encoding, HmacScheme, Scheme, Template};

use crate::support::gate::{
    self, GateConfig, SECRET, post, provider, secret_file, signed, stripe_event,
};
use crate::support::upstream::Upstream;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test]
async fn forged_tampered_unsigned_stale_and_future_deliveries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "s", SECRET)],
        "tolerance = \"5m\"\nfuture_tolerance = \"1m\"\nreject_status = 401",
    );
    let gate = gate::start(&config).await;
    let path = "/webhooks/stripe";
    let body = stripe_event("evt_forged");

    let forged = signed(&Scheme::Stripe, "whsec_attacker_guess", &body, "", None);
    let a = post(gate.addr, path, &forged, &body).await;
    assert_eq!(a.status, 401, "reject_status applies");
    assert_eq!(a.json()["error"], "invalid_signature");
    assert_eq!(a.result(), "invalid_signature");

    let good = signed(&Scheme::Stripe, SECRET, &body, "", None);
    let mut tampered = body.clone();
    tampered[12] ^= 1;
    let a = post(gate.addr, path, &good, &tampered).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    let a = post(gate.addr, path, &[], &body).await;
    assert_eq!(a.json()["error"], "invalid_signature");
    let garbled = vec![("stripe-signature".to_string(), "t=abc,v1=zz".to_string())];
    let a = post(gate.addr, path, &garbled, &body).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    let stale = signed(&Scheme::Stripe, SECRET, &body, "", Some(now() - 400));
    let a = post(gate.addr, path, &stale, &body).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"], "stale_timestamp");

    let future = signed(&Scheme::Stripe, SECRET, &body, "", Some(now() + 120));
    let a = post(gate.addr, path, &future, &body).await;
    assert_eq!(a.json()["error"], "stale_timestamp");

    let edge = signed(&Scheme::Stripe, SECRET, &body, "", Some(now() - 200));
    let a = post(gate.addr, path, &edge, &body).await;
    assert_eq!(a.result(), "forwarded", "inside the window");
    assert_eq!(up.count(), 1, "only the genuine delivery reached the app");
    // No message leaks the expected signature or the secret.
    assert!(!String::from_utf8_lossy(&a.body).contains(SECRET));
    gate.shutdown().await;
}

#[tokio::test]
async fn every_active_secret_verifies_and_expired_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    let current = secret_file(dir.path(), "current", "secret-current");
    let previous = secret_file(dir.path(), "previous", "secret-previous");
    let retired = secret_file(dir.path(), "retired", "secret-retired");
    config.providers = format!(
        "[providers.github]\nscheme = \"github\"\npath = \"/webhooks/github\"\nsecrets = [\"{current}\", \"{previous}\", {{ source = \"{retired}\", not_after = \"2020-01-01T00:00:00Z\" }}]\n"
    );
    let gate = gate::start(&config).await;
    for (n, secret) in ["secret-current", "secret-previous"].iter().enumerate() {
        let body = format!("{{\"zen\":\"{n}\"}}").into_bytes();
        let headers = signed(&Scheme::Github, secret, &body, &format!("guid-{n}"), None);
        let a = post(gate.addr, "/webhooks/github", &headers, &body).await;
        assert_eq!(a.result(), "forwarded", "secret {n} verifies");
    }
    let body = b"{\"zen\":\"old\"}";
    let headers = signed(&Scheme::Github, "secret-retired", body, "guid-old", None);
    let a = post(gate.addr, "/webhooks/github", &headers, body).await;
    assert_eq!(a.json()["error"], "invalid_signature", "past not_after");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_rotated_secret_file_takes_effect_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    let source = secret_file(dir.path(), "rotating", "before-rotation");
    config.providers = provider("std", "standard", &[source], "");
    let gate = gate::start(&config).await;
    let new_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let body = b"{\"type\":\"ping\"}";
    let headers = signed(&Scheme::Standard, new_secret, body, "msg_rot", None);
    let a = post(gate.addr, "/webhooks/std", &headers, body).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    std::fs::write(dir.path().join("rotating"), new_secret).unwrap();
    let mut result = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let a = post(gate.addr, "/webhooks/std", &headers, body).await;
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
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    let missing = format!("file:{}", dir.path().join("not-there").display());
    config.providers = provider("stripe", "stripe", &[missing], "");
    let gate = gate::start(&config).await;
    let body = stripe_event("evt_nosecret");
    let headers = signed(&Scheme::Stripe, "", &body, "", None);
    let a = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(a.json()["error"], "invalid_signature");
    assert_eq!(up.count(), 0);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_generic_hmac_sender_with_a_signed_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.providers = provider(
        "acme",
        "hmac",
        &[secret_file(dir.path(), "acme", "acme-secret")],
        "signature_header = \"X-Signature\"\nsignature_prefix = \"sha512=\"\nencoding = \"base64\"\nalgorithm = \"sha512\"\ntimestamp_header = \"X-Timestamp\"\nsigned_payload = \"{timestamp}.{body}\"\nkey = \"json:/event/id\"",
    );
    let gate = gate::start(&config).await;
    let scheme = Scheme::Hmac(HmacScheme {
        header: "x-signature".parse().unwrap(),
        prefix: "sha512=".into(),
        encoding: Encoding::Base64,
        algorithm: Algorithm::Sha512,
        timestamp_header: Some("x-timestamp".parse().unwrap()),
        template: Template::parse("{timestamp}.{body}").unwrap(),
    });
    let body = br#"{"event":{"id":"A-1"}}"#;
    let a = post(
        gate.addr,
        "/webhooks/acme",
        &signed(&scheme, "acme-secret", body, "", None),
        body,
    )
    .await;
    assert_eq!(a.result(), "forwarded");
    assert_eq!(up.received()[0].headers["hookgate-event-key"], "acme:a-1");
    let stale = signed(&scheme, "acme-secret", body, "", Some(now() - 3600));
    let a = post(gate.addr, "/webhooks/acme", &stale, body).await;
    assert_eq!(a.json()["error"], "stale_timestamp");
    gate.shutdown().await;
}
