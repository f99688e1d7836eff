//! Slack, Twilio, SendGrid and Shopify through the real gate: each forwarded
//! once, its retries answered as duplicates, forgeries refused, and stale
//! timestamps refused where the scheme signs one. Plus what each sender does
//! differently: Slack's url_verification handshake and retry headers,
//! Twilio's URL forms, repeated parameters and status callbacks, SendGrid's
//! public-key signatures, Shopify's webhook id, Svix's own header names.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use hookgate::provider::{Scheme, TwilioScheme, sendgrid_sign};
use p256::ecdsa::SigningKey;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};

use crate::support::fixture::GateFixture;
use crate::support::gate::{post, signed};
use crate::support::upstream::Upstream;

const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const TWILIO_TOKEN: &str = "twilio_auth_token_do_not_log_91c2";
const SHOPIFY_SECRET: &str = "shpss_client_secret_do_not_log_7d1e";
const SVIX_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn header(name: &str, value: &str) -> (String, String) {
    (name.to_owned(), value.to_owned())
}

// ---- Slack ----------------------------------------------------------------

fn slack_event(event_id: &str) -> Vec<u8> {
    format!(
        r#"{{"token":"t","team_id":"T1","type":"event_callback","event":{{"type":"app_mention","text":"hi"}},"event_id":"{event_id}","event_time":1700000000}}"#
    )
    .into_bytes()
}

#[tokio::test]
async fn slack_events_are_forwarded_once_and_retries_are_duplicates() {
    let gate = GateFixture::provider("slack", Scheme::Slack)
        .secret(SLACK_SECRET)
        .start()
        .await;
    let up = gate.upstream();
    let path = "/webhooks/slack";
    let body = slack_event("Ev01ABCDEF");

    let first = gate
        .post(
            path,
            &signed(&Scheme::Slack, SLACK_SECRET, &body, "", None),
            &body,
        )
        .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.result(), "forwarded");
    assert_eq!(up.received()[0].body.as_ref(), body.as_slice());
    assert_eq!(
        up.received()[0].headers["hookgate-event-key"],
        "slack:ev01abcdef"
    );

    // Slack signs each retry when it sends it, and says it is a retry.
    let mut retry = signed(&Scheme::Slack, SLACK_SECRET, &body, "", Some(now() + 1));
    retry.push(header("X-Slack-Retry-Num", "1"));
    retry.push(header("X-Slack-Retry-Reason", "http_timeout"));
    let second = gate.post(path, &retry, &body).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.result(), "duplicate");
    assert_eq!(second.body, first.body, "the stored answer is replayed");

    let other = slack_event("Ev02FORGED");
    let forged = signed(&Scheme::Slack, "not-the-signing-secret", &other, "", None);
    let a = gate.post(path, &forged, &other).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    let mut tampered = body.clone();
    tampered.extend_from_slice(b" ");
    let good = signed(&Scheme::Slack, SLACK_SECRET, &body, "", None);
    let a = gate.post(path, &good, &tampered).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    let late = slack_event("Ev03STALE");
    let stale = signed(&Scheme::Slack, SLACK_SECRET, &late, "", Some(now() - 400));
    let a = gate.post(path, &stale, &late).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"], "stale_timestamp");

    assert_eq!(
        up.count(),
        1,
        "only the first genuine delivery reached the app"
    );
    gate.shutdown().await;
}

#[tokio::test]
async fn slack_url_verification_reaches_the_app_and_its_answer_comes_back() {
    let gate = GateFixture::provider("slack", Scheme::Slack)
        .secret(SLACK_SECRET)
        .start()
        .await;
    let up = gate.upstream();
    // No event_id: slack's default on_missing_key is `forward`.
    let body = br#"{"token":"t","challenge":"abc","type":"url_verification"}"#;
    let headers = signed(&Scheme::Slack, SLACK_SECRET, body, "", None);

    let a = gate.post("/webhooks/slack", &headers, body).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.result(), "forwarded");
    assert_eq!(a.headers["x-app"], "recorded", "the app's answer");
    assert_eq!(a.json()["call"], 1);
    let got = up.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body.as_ref(), body.as_slice());
    assert!(!got[0].headers.contains_key("hookgate-event-key"));

    // Unkeyed, so not deduplicated: Slack repeats the handshake and the app
    // answers each time.
    let again = gate.post("/webhooks/slack", &headers, body).await;
    assert_eq!(again.json()["call"], 2);

    // Still verified, though.
    let forged = signed(&Scheme::Slack, "guess", body, "", None);
    let a = gate.post("/webhooks/slack", &forged, body).await;
    assert_eq!(a.json()["error"], "invalid_signature");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

// ---- Twilio ---------------------------------------------------------------

fn twilio(public_url: &str) -> Scheme {
    Scheme::Twilio(TwilioScheme {
        public_url: public_url.to_owned(),
    })
}

/// `gate` with another Twilio provider, `name`, whose sender calls
/// `public_url` and signs with `TWILIO_TOKEN`.
fn add_twilio(gate: GateFixture, name: &str, public_url: &str) -> GateFixture {
    gate.add_provider(name, twilio(public_url))
        .secret(TWILIO_TOKEN)
        .provider_extra(&format!("public_url = \"{public_url}\""))
}

/// Twilio's headers (signature, idempotency token, form content type) for a
/// form body posted to `signed_url`, which is what Twilio signs: the URL it
/// called, query included.
fn twilio_signed(signed_url: &str, token: &str, body: &[u8], id: &str) -> Vec<(String, String)> {
    twilio(signed_url).sign(token.as_bytes(), body, id, now())
}

fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
        .into_bytes()
}

#[tokio::test]
async fn twilio_signatures_verify_with_and_without_the_default_port() {
    let both = add_twilio(
        GateFixture::new(),
        "tw443",
        "https://example.com:443/webhooks/tw",
    );
    let gate = add_twilio(both, "tw", "https://example.com/webhooks/tw")
        .start()
        .await;
    let up = gate.upstream();
    let body = form(&[
        ("MessageSid", "SM0001"),
        ("From", "+14158675309"),
        ("Body", "Hello, world!"),
    ]);

    // Configured with `:443`, signed without it, and the other way round.
    let cases = [
        (
            "/webhooks/tw443",
            "https://example.com/webhooks/tw",
            "idem-1",
        ),
        (
            "/webhooks/tw",
            "https://example.com:443/webhooks/tw",
            "idem-2",
        ),
        ("/webhooks/tw", "https://example.com/webhooks/tw", "idem-3"),
    ];
    for (path, signed_url, id) in cases {
        let headers = twilio_signed(signed_url, TWILIO_TOKEN, &body, id);
        let a = gate.post(path, &headers, &body).await;
        assert_eq!(a.result(), "forwarded", "{path} signed over {signed_url}");
        // Twilio's retry carries the same idempotency token.
        let a = gate.post(path, &headers, &body).await;
        assert_eq!(a.result(), "duplicate", "{path} retried");
    }
    assert_eq!(
        up.received()[0].headers["hookgate-event-key"],
        "tw443:idem-1"
    );

    // Another port, another host or another token is not the URL Twilio
    // signed for this gate.
    let forgeries = [
        ("https://example.com:8443/webhooks/tw", TWILIO_TOKEN),
        ("https://example.org/webhooks/tw", TWILIO_TOKEN),
        ("http://example.com/webhooks/tw", TWILIO_TOKEN),
        ("https://example.com/webhooks/tw", "another_account_token"),
    ];
    for (n, (signed_url, token)) in forgeries.into_iter().enumerate() {
        let headers = twilio_signed(signed_url, token, &body, &format!("forged-{n}"));
        let a = gate.post("/webhooks/tw", &headers, &body).await;
        assert_eq!(a.json()["error"], "invalid_signature", "{signed_url}");
    }
    assert_eq!(up.count(), 3);
    gate.shutdown().await;
}

#[tokio::test]
async fn twilio_signs_the_query_and_every_repeated_form_parameter() {
    let gate = add_twilio(GateFixture::new(), "tw", "https://example.com/hooks/voice")
        .start()
        .await;
    let up = gate.upstream();
    // The request's query is appended to public_url: Twilio signed the URL
    // it called, `?foo=1&bar=2` included.
    let called = "https://example.com/hooks/voice?foo=1&bar=2";
    let path = "/webhooks/tw?foo=1&bar=2";
    let body = b"Sid=CA123&Digits=5678&SidAccount=AC123&Digits=1234";
    let headers = twilio_signed(called, TWILIO_TOKEN, body, "idem-repeated");

    let a = gate.post(path, &headers, body).await;
    assert_eq!(a.result(), "forwarded");
    let got = up.received();
    assert_eq!(got[0].uri, path, "the query is forwarded");
    assert_eq!(
        got[0].body.as_ref(),
        body.as_slice(),
        "in the sender's order"
    );

    // Both values of `Digits` are signed: dropping or changing either one,
    // or the query, breaks the signature.
    let tampered: [(&str, &[u8]); 4] = [
        (path, b"Sid=CA123&Digits=5678&SidAccount=AC123"),
        (path, b"Sid=CA123&Digits=5678&SidAccount=AC123&Digits=1235"),
        ("/webhooks/tw?foo=1&bar=3", body),
        ("/webhooks/tw", body),
    ];
    for (path, body) in tampered {
        let a = gate.post(path, &headers, body).await;
        assert_eq!(
            a.json()["error"],
            "invalid_signature",
            "{path} {}",
            String::from_utf8_lossy(body)
        );
    }
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn twilio_official_vectors_verify_through_the_gate() {
    // twilio-python's request validator tests: token 12345, Twilio called
    // https://mycompany.com/myapp.php?foo=1&bar=2.
    let public_url = "https://mycompany.com/myapp.php";
    let gate = GateFixture::provider("tw", twilio(public_url))
        .secret("12345")
        .provider_extra(&format!("public_url = \"{public_url}\""))
        .start()
        .await;
    let up = gate.upstream();
    let call = form(&[
        ("CallSid", "CA1234567890ABCDE"),
        ("Caller", "+14158675309"),
        ("Digits", "1234"),
        ("From", "+14158675309"),
        ("To", "+18005551212"),
    ]);
    let repeated = form(&[
        ("Sid", "CA123"),
        ("SidAccount", "AC123"),
        ("Digits", "5678"),
        ("Digits", "1234"),
    ]);
    let vectors = [
        (call, "RSOYDt4T1cUTdK1PDd93/VVr8B8=", "vector-call"),
        (repeated, "IK+Dwps556ElfBT0I3Rgjkr1wJU=", "vector-repeated"),
    ];
    for (body, signature, id) in &vectors {
        let headers = vec![
            header("X-Twilio-Signature", signature),
            header("I-Twilio-Idempotency-Token", id),
            header("Content-Type", "application/x-www-form-urlencoded"),
        ];
        let a = gate.post("/webhooks/tw?foo=1&bar=2", &headers, body).await;
        assert_eq!(a.result(), "forwarded", "{signature}");
    }
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn twilio_status_callbacks_are_keyed_on_the_sid_and_the_status() {
    let public_url = "https://example.com/twilio/status";
    let gate = add_twilio(GateFixture::new(), "tw", public_url)
        .provider_extra("key = [\"form:MessageSid\", \"form:MessageStatus\"]")
        .start()
        .await;
    let up = gate.upstream();
    let callback = |status: &str| {
        form(&[
            ("AccountSid", "AC0001"),
            ("From", "+14158675309"),
            ("MessageSid", "SM5e4f0c"),
            ("MessageStatus", status),
            ("To", "+18005551212"),
        ])
    };
    let addr = gate.addr;
    let deliver = |status: &str, attempt: &str| {
        let body = callback(status);
        let headers = twilio_signed(public_url, TWILIO_TOKEN, &body, attempt);
        async move { post(addr, "/webhooks/tw", &headers, &body).await }
    };

    assert_eq!(deliver("sent", "a1").await.result(), "forwarded");
    // The same MessageSid with the next status is another event.
    assert_eq!(deliver("delivered", "a2").await.result(), "forwarded");
    // Twilio's retry of `delivered` is a duplicate, whatever its other
    // headers.
    let retry = deliver("delivered", "a3").await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.result(), "duplicate");

    let keys: Vec<_> = up
        .received()
        .iter()
        .map(|r| r.headers["hookgate-event-key"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["tw:sm5e4f0c:sent", "tw:sm5e4f0c:delivered"]);

    let forged = callback("failed");
    let headers = twilio_signed(public_url, "guess", &forged, "a4");
    let a = gate.post("/webhooks/tw", &headers, &forged).await;
    assert_eq!(a.json()["error"], "invalid_signature");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

// ---- SendGrid -------------------------------------------------------------

/// A reproducible P-256 key pair: the private half signs as SendGrid would,
/// the public half (base64 DER SPKI, as SendGrid displays it) is the secret.
fn sendgrid_key(byte: u8) -> (SigningKey, String) {
    use base64::Engine as _;
    let key = SigningKey::from_slice(&[byte; 32]).unwrap();
    let der = key.verifying_key().to_public_key_der().unwrap();
    let public = base64::engine::general_purpose::STANDARD.encode(der.as_bytes());
    (key, public)
}

fn sendgrid_events(sg_event_id: &str) -> Vec<u8> {
    format!(
        "[{{\"email\":\"hello@example.com\",\"event\":\"delivered\",\"sg_event_id\":\"{sg_event_id}\",\"sg_message_id\":\"m1\",\"timestamp\":1700000000}}]\r\n"
    )
    .into_bytes()
}

/// SendGrid's headers for `body` signed at `at`, plus the test's key header.
fn sendgrid_signed(key: &SigningKey, body: &[u8], event: &str, at: i64) -> Vec<(String, String)> {
    let der = key.to_pkcs8_der().unwrap();
    let mut headers = sendgrid_sign(der.as_bytes(), body, at).unwrap();
    headers.push(header("content-type", "application/json"));
    headers.push(header("X-Test-Event-Id", event));
    headers
}

/// Keyed on one header: SendGrid's per-event batch keys are not tested here.
const SENDGRID_KEY: &str = "key = \"header:X-Test-Event-Id\"";

#[tokio::test]
async fn sendgrid_deliveries_verify_with_the_public_key() {
    let (key, public) = sendgrid_key(0x2a);
    let gate = GateFixture::provider("sg", Scheme::Sendgrid)
        .secret(&format!("{public}\n"))
        .provider_extra(SENDGRID_KEY)
        .start()
        .await;
    let up = gate.upstream();
    let path = "/webhooks/sg";
    let body = sendgrid_events("sg-evt-1");

    let first = gate
        .post(path, &sendgrid_signed(&key, &body, "batch-1", now()), &body)
        .await;
    assert_eq!(first.result(), "forwarded");
    let got = up.received();
    assert_eq!(got[0].body.as_ref(), body.as_slice(), "CRLF included");
    assert_eq!(got[0].headers["hookgate-event-key"], "sg:batch-1");

    // SendGrid's retry is signed again, later.
    let retry = sendgrid_signed(&key, &body, "batch-1", now() - 30);
    let second = gate.post(path, &retry, &body).await;
    assert_eq!(second.result(), "duplicate");
    assert_eq!(second.body, first.body);

    let (other_key, _) = sendgrid_key(0x17);
    let other = sendgrid_events("sg-evt-2");
    let forged = sendgrid_signed(&other_key, &other, "batch-2", now());
    let a = gate.post(path, &forged, &other).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    // The timestamp is signed: moving it breaks the signature.
    let mut moved = sendgrid_signed(&key, &other, "batch-2", now() - 400);
    moved[1].1 = now().to_string();
    let a = gate.post(path, &moved, &other).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    let mut tampered = other.clone();
    tampered.truncate(other.len() - 2);
    let good = sendgrid_signed(&key, &other, "batch-2", now());
    let a = gate.post(path, &good, &tampered).await;
    assert_eq!(a.json()["error"], "invalid_signature", "without the CRLF");

    let stale = sendgrid_signed(&key, &other, "batch-2", now() - 400);
    let a = gate.post(path, &stale, &other).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"], "stale_timestamp");

    assert_eq!(up.count(), 1);
    // The genuine batch still gets through after all that.
    let a = gate.post(path, &good, &other).await;
    assert_eq!(a.result(), "forwarded");
    gate.shutdown().await;
}

#[tokio::test]
async fn sign_with_a_private_key_prints_sendgrid_headers_the_gate_accepts() {
    let (key, public) = sendgrid_key(0x2a);
    let up = Upstream::start().await;
    let fixture = GateFixture::provider("sg", Scheme::Sendgrid)
        .secret(&public)
        .provider_extra(SENDGRID_KEY)
        .add_provider("shop", Scheme::Shopify)
        .secret(SHOPIFY_SECRET)
        .upstream(&up);
    let dir = fixture.dir();
    let config_path = fixture.config_file();
    let body = sendgrid_events("sg-cli-1");
    let body_path = dir.join("events.json");
    std::fs::write(&body_path, &body).unwrap();
    let pem = key.to_pkcs8_pem(LineEnding::LF).unwrap();
    let key_path = dir.join("sendgrid.pem");
    std::fs::write(&key_path, pem.as_bytes()).unwrap();
    let sign = |provider: &str, private_key: Option<&std::path::Path>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookgate"));
        cmd.args(["sign", "--provider", provider, "--config"])
            .arg(&config_path)
            .arg("--body")
            .arg(&body_path);
        if let Some(path) = private_key {
            cmd.arg("--private-key").arg(path);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        (out.status.code(), stdout, stderr)
    };

    let (code, stdout, stderr) = sign("sg", Some(&key_path));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.is_empty(),
        "the key matches the configured one: {stderr}"
    );
    let mut headers: Vec<(String, String)> = stdout
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(headers.len(), 2, "{stdout}");
    headers.push(header("X-Test-Event-Id", "cli-batch-1"));
    let gate = fixture.clone().start().await;
    let a = gate.post("/webhooks/sg", &headers, &body).await;
    assert_eq!(a.result(), "forwarded");
    assert_eq!(up.received()[0].body.as_ref(), body.as_slice());
    gate.shutdown().await;

    // Without a private key there is nothing to sign with.
    let (code, stdout, stderr) = sign("sg", None);
    assert_eq!(code, Some(64));
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("--private-key"), "{stderr}");

    // A key that is not the configured one signs, with a warning.
    let (other, _) = sendgrid_key(0x17);
    let other_path = dir.join("other.der");
    std::fs::write(&other_path, other.to_pkcs8_der().unwrap().as_bytes()).unwrap();
    let (code, stdout, stderr) = sign("sg", Some(&other_path));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("X-Twilio-Email-Event-Webhook-Signature: "));
    assert!(stderr.contains("matches none"), "{stderr}");

    // An unusable key file fails without echoing a byte of it.
    let marker = "PRIVATE_KEY_MATERIAL_do_not_print";
    let bad_path = dir.join("bad.pem");
    std::fs::write(
        &bad_path,
        format!("-----BEGIN PRIVATE KEY-----\n{marker}\n-----END PRIVATE KEY-----\n"),
    )
    .unwrap();
    let (code, stdout, stderr) = sign("sg", Some(&bad_path));
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("P-256"), "{stderr}");
    assert!(!stderr.contains(marker), "{stderr}");
    let missing = dir.join("missing.pem");
    let (code, _, stderr) = sign("sg", Some(&missing));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("missing.pem"), "{stderr}");

    // Other schemes sign with their secret and ignore the key, with a note.
    let (code, stdout, stderr) = sign("shop", Some(&key_path));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("--private-key is ignored"), "{stderr}");
    assert!(stdout.contains("X-Shopify-Hmac-Sha256: "), "{stdout}");
    for text in [&stdout, &stderr] {
        assert!(!text.contains("BEGIN PRIVATE KEY") && !text.contains(SHOPIFY_SECRET));
    }
}

// ---- Shopify --------------------------------------------------------------

#[tokio::test]
async fn shopify_deliveries_are_keyed_on_the_webhook_id() {
    let gate = GateFixture::provider("shop", Scheme::Shopify)
        .secret(SHOPIFY_SECRET)
        .start()
        .await;
    let up = gate.upstream();
    let path = "/webhooks/shop";
    let body = br#"{"id":820982911946154508,"email":"jon@example.com","total_price":"10.00"}"#;

    let first = gate
        .post(
            path,
            &signed(
                &Scheme::Shopify,
                SHOPIFY_SECRET,
                body,
                "b54557e4-bdd9-4b37",
                None,
            ),
            body,
        )
        .await;
    assert_eq!(first.result(), "forwarded");
    assert_eq!(
        up.received()[0].headers["hookgate-event-key"],
        "shop:b54557e4-bdd9-4b37"
    );
    let retry = signed(
        &Scheme::Shopify,
        SHOPIFY_SECRET,
        body,
        "B54557E4-BDD9-4B37",
        None,
    );
    let a = gate.post(path, &retry, body).await;
    assert_eq!(a.result(), "duplicate", "the same webhook id, normalized");
    assert_eq!(a.body, first.body);

    // The key is the webhook id, not the payload: the same order sent by
    // another webhook (another topic or subscription) is another event.
    let other = signed(
        &Scheme::Shopify,
        SHOPIFY_SECRET,
        body,
        "0f1e2d3c-other",
        None,
    );
    assert_eq!(gate.post(path, &other, body).await.result(), "forwarded");

    // Newer "Events" deliveries send the same headers without `X-`.
    let unprefixed: Vec<_> = signed(&Scheme::Shopify, SHOPIFY_SECRET, body, "events-1", None)
        .into_iter()
        .map(|(k, v)| (k.strip_prefix("X-").unwrap_or(&k).to_owned(), v))
        .collect();
    assert!(unprefixed.iter().any(|(k, _)| k == "Shopify-Webhook-Id"));
    let a = gate.post(path, &unprefixed, body).await;
    assert_eq!(a.result(), "forwarded");
    assert_eq!(
        up.received()[2].headers["hookgate-event-key"],
        "shop:events-1"
    );

    let forged = signed(&Scheme::Shopify, "shpss_guess", body, "forged-1", None);
    let a = gate.post(path, &forged, body).await;
    assert_eq!(a.json()["error"], "invalid_signature");
    let mut tampered = body.to_vec();
    tampered[10] = b'7';
    let good = signed(&Scheme::Shopify, SHOPIFY_SECRET, body, "forged-2", None);
    let a = gate.post(path, &good, &tampered).await;
    assert_eq!(a.json()["error"], "invalid_signature");

    // Without a webhook id there is nothing to deduplicate on.
    let keyless: Vec<_> = good
        .into_iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("X-Shopify-Webhook-Id"))
        .collect();
    let a = gate.post(path, &keyless, body).await;
    assert_eq!(a.json()["error"], "missing_key");
    assert_eq!(up.count(), 3);
    gate.shutdown().await;
}

// ---- Standard Webhooks, with Svix's names ----------------------------------

/// A Svix delivery signs `svix-id`; the default key reads `webhook-id`
/// first. Replayed with a `webhook-id` of the attacker's choosing, it must
/// not reach the app again under a new key.
#[tokio::test]
async fn a_svix_delivery_replayed_with_a_new_webhook_id_is_refused() {
    let gate = GateFixture::provider("svix", Scheme::Standard)
        .secret(SVIX_SECRET)
        .start()
        .await;
    let up = gate.upstream();
    let path = "/webhooks/svix";
    let body = br#"{"type":"invoice.paid","data":{"id":"in_1"}}"#;
    let svix: Vec<_> = signed(&Scheme::Standard, SVIX_SECRET, body, "msg_2Lx01", None)
        .into_iter()
        .map(|(k, v)| (k.replace("webhook-", "svix-"), v))
        .collect();
    assert!(svix.iter().any(|(k, _)| k == "svix-signature"));

    let first = gate.post(path, &svix, body).await;
    assert_eq!(first.result(), "forwarded");
    assert_eq!(
        up.received()[0].headers["hookgate-event-key"],
        "svix:msg_2lx01",
        "keyed on the id that was signed"
    );
    assert_eq!(gate.post(path, &svix, body).await.result(), "duplicate");

    for n in 1..=3 {
        let mut replay = svix.clone();
        replay.push(header("webhook-id", &format!("msg_replayed_{n}")));
        let a = gate.post(path, &replay, body).await;
        assert_eq!(a.status, 400, "replay {n}: reject_status, 400 by default");
        assert_eq!(a.json()["error"], "invalid_signature");
    }
    // The same id under both names is one delivery, as Svix's own libraries
    // would send it.
    let mut both = svix.clone();
    both.push(header("webhook-id", "msg_2Lx01"));
    assert_eq!(gate.post(path, &both, body).await.result(), "duplicate");
    assert_eq!(up.count(), 1, "only the first delivery reached the app");
    gate.shutdown().await;
}
