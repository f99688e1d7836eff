//! What the app receives, and what the sender gets back.

use hookgate::provider::Scheme;
use http::Method;

use crate::support::gate::{
    self, GateConfig, SECRET, post, provider, secret_file, signed, stripe_event,
};
use crate::support::upstream::{Behavior, Upstream};

async fn stripe_gate(
    extra_provider: &str,
    dir: &std::path::Path,
    up: &Upstream,
) -> hookgate::Running {
    let mut config = GateConfig::new(&up.url(), dir);
    let secret = secret_file(dir, "stripe", SECRET);
    config.providers = provider("stripe", "stripe", &[secret], extra_provider);
    gate::start(&config).await
}

#[tokio::test]
async fn first_delivery_is_forwarded_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate("", dir.path(), &up).await;
    // Odd whitespace, a non-ASCII character and a trailing newline: all must
    // reach the app exactly as sent.
    let body = "{\"id\":\"evt_Byte1\",  \"note\":\"caf\u{e9}\"}\n"
        .as_bytes()
        .to_vec();
    let mut headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
    headers.push(("x-custom".into(), "kept".into()));
    headers.push(("connection".into(), "keep-alive, x-hop".into()));
    headers.push(("x-hop".into(), "dropped".into()));
    headers.push(("hookgate-provider".into(), "spoofed".into()));
    headers.push((
        "traceparent".into(),
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
    ));
    let answer = post(gate.addr, "/webhooks/stripe?attempt=1", &headers, &body).await;

    assert_eq!(answer.status, 200);
    assert_eq!(answer.result(), "forwarded");
    assert_eq!(answer.headers["x-app"], "recorded");
    let got = up.received();
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.body.as_ref(), body.as_slice());
    assert_eq!(r.method, Method::POST);
    assert_eq!(r.uri, "/webhooks/stripe?attempt=1");
    assert_eq!(r.headers["stripe-signature"], headers[0].1.as_str());
    assert_eq!(r.headers["x-custom"], "kept");
    assert_eq!(r.headers["traceparent"], headers.last().unwrap().1.as_str());
    assert!(!r.headers.contains_key("x-hop"));
    assert_eq!(r.headers["hookgate-provider"], "stripe");
    assert_eq!(r.headers["hookgate-event-key"], "stripe:evt_byte1");
    assert_eq!(r.headers["x-forwarded-for"], "127.0.0.1");
    assert_eq!(r.headers["x-forwarded-proto"], "http");
    gate.shutdown().await;
}

#[tokio::test]
async fn a_duplicate_replays_the_stored_answer_without_calling_the_app() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate("", dir.path(), &up).await;
    let body = stripe_event("evt_dup");
    let first = post(
        gate.addr,
        "/webhooks/stripe",
        &signed(&Scheme::Stripe, SECRET, &body, "", None),
        &body,
    )
    .await;
    // A retry is signed again, later, by the sender.
    let second = post(
        gate.addr,
        "/webhooks/stripe",
        &signed(&Scheme::Stripe, SECRET, &body, "", None),
        &body,
    )
    .await;

    assert_eq!(first.result(), "forwarded");
    assert_eq!(second.status, 200);
    assert_eq!(second.result(), "duplicate");
    assert_eq!(second.body, first.body, "the stored answer is replayed");
    assert_eq!(second.headers["content-type"], "application/json");
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn upstream_failure_releases_the_key_so_the_retry_gets_through() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate("", dir.path(), &up).await;
    let body = stripe_event("evt_retry");
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);

    up.set(Behavior::Status(500));
    let failed = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(failed.status, 500, "the app's answer is passed back");
    assert_eq!(failed.result(), "upstream_error");
    assert_eq!(failed.json()["status"], 500);

    up.set(Behavior::Status(200));
    let retried = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(retried.status, 200);
    assert_eq!(retried.result(), "forwarded");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn upstream_timeout_is_504_and_releases_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate("", dir.path(), &up).await;
    let body = stripe_event("evt_slow");
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);

    up.set(Behavior::Stall(std::time::Duration::from_secs(4)));
    let slow = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(slow.status, 504);
    assert_eq!(slow.json()["error"], "upstream_timeout");

    up.set(Behavior::Status(200));
    let retried = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(retried.result(), "forwarded");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_releases_the_key() {
    let dir = tempfile::tempdir().unwrap();
    // A port that was free a moment ago: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut config = GateConfig::new(&format!("http://{closed}"), dir.path());
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "s", SECRET)],
        "",
    );
    let gate = gate::start(&config).await;
    let body = stripe_event("evt_unreach");
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
    let answer = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.json()["error"], "upstream_unreachable");
    assert_eq!(answer.headers["content-type"], "application/json");
    let again = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(again.status, 502, "released, so not in_flight");
    gate.shutdown().await;
}

#[tokio::test]
async fn other_paths_pass_through_and_methods_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate("passthrough_methods = [\"GET\"]", dir.path(), &up).await;

    let other = gate::send(gate.addr, Method::PUT, "/api/things?x=1", &[], "payload").await;
    assert_eq!(other.status, 200);
    assert_eq!(up.received()[0].uri, "/api/things?x=1");
    assert_eq!(up.received()[0].body.as_ref(), b"payload");

    let handshake = gate::send(gate.addr, Method::GET, "/webhooks/stripe", &[], "").await;
    assert_eq!(handshake.status, 200);
    let delete = gate::send(gate.addr, Method::DELETE, "/webhooks/stripe", &[], "").await;
    assert_eq!(delete.status, 405);
    assert_eq!(delete.json()["error"], "method_not_allowed");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn unknown_routes_are_404_when_passthrough_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.upstream.push_str("passthrough = false\n");
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "s", SECRET)],
        "",
    );
    let gate = gate::start(&config).await;
    let answer = gate::send(gate.addr, Method::POST, "/elsewhere", &[], "x").await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.result(), "unknown_route");
    assert_eq!(up.count(), 0);
    gate.shutdown().await;
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.extra = "max_body_bytes = 1024\n".into();
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "s", SECRET)],
        "",
    );
    let gate = gate::start(&config).await;
    let body = vec![b'x'; 4096];
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
    let answer = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.json()["error"], "payload_too_large");
    assert_eq!(up.count(), 0);
    gate.shutdown().await;
}

#[tokio::test]
async fn missing_keys_are_rejected_or_forwarded_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    let s = secret_file(dir.path(), "s", SECRET);
    config.providers = provider("strict", "stripe", std::slice::from_ref(&s), "")
        + &provider("lenient", "stripe", &[s], "on_missing_key = \"forward\"");
    let gate = gate::start(&config).await;
    let body = br#"{"object":"event"}"#;
    let headers = signed(&Scheme::Stripe, SECRET, body, "", None);

    let strict = post(gate.addr, "/webhooks/strict", &headers, body).await;
    assert_eq!(strict.status, 400);
    assert_eq!(strict.json()["error"], "missing_key");
    let lenient = post(gate.addr, "/webhooks/lenient", &headers, body).await;
    assert_eq!(lenient.result(), "forwarded");
    let again = post(gate.addr, "/webhooks/lenient", &headers, body).await;
    assert_eq!(again.result(), "forwarded", "no key, no dedupe");
    assert_eq!(up.count(), 2);
    assert!(!up.received()[0].headers.contains_key("hookgate-event-key"));

    let garbage = b"not json at all";
    let h = signed(&Scheme::Stripe, SECRET, garbage, "", None);
    let bad = post(gate.addr, "/webhooks/strict", &h, garbage).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"], "bad_payload");
    gate.shutdown().await;
}

#[tokio::test]
async fn http2_deliveries_are_served_and_forwarded_over_http1() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate("", dir.path(), &up).await;
    let body = stripe_event("evt_h2");
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut req = http::Request::post(format!("http://{}/webhooks/stripe", gate.addr));
    for (k, v) in signed(&Scheme::Stripe, SECRET, &body, "", None) {
        req = req.header(k, v);
    }
    let response = client
        .request(req.body(Full::new(Bytes::from(body.clone()))).unwrap())
        .await
        .unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.headers()["hookgate-result"], "forwarded");
    let _ = response.into_body().collect().await.unwrap();
    let got = up.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body.as_ref(), body.as_slice());
    assert!(
        got[0].headers.contains_key("host"),
        "the authority became Host"
    );
    gate.shutdown().await;
}

#[tokio::test]
async fn upstream_max_connections_caps_the_calls_the_app_sees_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    up.set(Behavior::Stall(std::time::Duration::from_millis(200)));
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.upstream.push_str("max_connections = 2\n");
    let secret = secret_file(dir.path(), "stripe", SECRET);
    config.providers = provider("stripe", "stripe", &[secret], "");
    let gate = gate::start(&config).await;

    // Six deliveries at once against a 2-slot cap and a 200 ms app: they
    // queue for a slot (600 ms in all, inside the 2 s upstream timeout).
    let addr = gate.addr;
    let sends: Vec<_> = (0..6)
        .map(|i| {
            let body = stripe_event(&format!("evt_cap{i}"));
            let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
            tokio::spawn(async move { post(addr, "/webhooks/stripe", &headers, &body).await })
        })
        .collect();
    for send in sends {
        let a = send.await.unwrap();
        assert_eq!((a.status.as_u16(), a.result()), (200, "forwarded"));
    }
    assert_eq!(up.count(), 6);
    let peak = up.peak_in_flight();
    assert!((1..=2).contains(&peak), "the app saw {peak} calls at once");
    gate.shutdown().await;
}
