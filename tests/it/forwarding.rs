//! What the app receives, and what the sender gets back.

use hookgate::provider::Scheme;
use http::Method;
use http_body_util::BodyExt;

use crate::support::fixture::GateFixture;
use crate::support::gate::{SECRET, stripe_event};
use crate::support::http2::{forward_all_at_once, http2_client, signed_request};
use crate::support::upstream::Behavior;

#[tokio::test]
async fn first_delivery_is_forwarded_byte_for_byte() {
    let gate = GateFixture::stripe().start().await;
    // Odd whitespace, a non-ASCII character and a trailing newline: all must
    // reach the app exactly as sent.
    let body = "{\"id\":\"evt_Byte1\",  \"note\":\"caf\u{e9}\"}\n"
        .as_bytes()
        .to_vec();
    let mut headers = gate.sign(&body);
    headers.push(("x-custom".into(), "kept".into()));
    headers.push(("connection".into(), "keep-alive, x-hop".into()));
    headers.push(("x-hop".into(), "dropped".into()));
    headers.push(("hookgate-provider".into(), "spoofed".into()));
    headers.push((
        "traceparent".into(),
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
    ));
    let answer = gate
        .post("/webhooks/stripe?attempt=1", &headers, &body)
        .await;

    assert_eq!(answer.status, 200);
    assert_eq!(answer.result(), "forwarded");
    assert_eq!(answer.headers["x-app"], "recorded");
    let got = gate.upstream().received();
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
    let gate = GateFixture::stripe().start().await;
    let body = stripe_event("evt_dup");
    let first = gate.deliver(&body).await;
    // A retry is signed again, later, by the sender.
    let second = gate.deliver(&body).await;

    assert_eq!(first.result(), "forwarded");
    assert_eq!(second.status, 200);
    assert_eq!(second.result(), "duplicate");
    assert_eq!(second.body, first.body, "the stored answer is replayed");
    assert_eq!(second.headers["content-type"], "application/json");
    assert_eq!(gate.upstream().count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn upstream_failure_releases_the_key_so_the_retry_gets_through() {
    let gate = GateFixture::stripe().start().await;
    let up = gate.upstream();
    let body = stripe_event("evt_retry");

    up.set(Behavior::Status(500));
    let failed = gate.deliver(&body).await;
    assert_eq!(failed.status, 500, "the app's answer is passed back");
    assert_eq!(failed.result(), "upstream_error");
    assert_eq!(failed.json()["status"], 500);

    up.set(Behavior::Status(200));
    let retried = gate.deliver(&body).await;
    assert_eq!(retried.status, 200);
    assert_eq!(retried.result(), "forwarded");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn upstream_timeout_is_504_and_releases_the_key() {
    let gate = GateFixture::stripe().start().await;
    let up = gate.upstream();
    let body = stripe_event("evt_slow");

    up.set(Behavior::Stall(std::time::Duration::from_secs(4)));
    let slow = gate.deliver(&body).await;
    assert_eq!(slow.status, 504);
    assert_eq!(slow.json()["error"], "upstream_timeout");

    up.set(Behavior::Status(200));
    let retried = gate.deliver(&body).await;
    assert_eq!(retried.result(), "forwarded");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_releases_the_key() {
    // A port that was free a moment ago: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let gate = GateFixture::stripe()
        .upstream_url(&format!("http://{closed}"))
        .start()
        .await;
    let body = stripe_event("evt_unreach");
    let answer = gate.deliver(&body).await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.json()["error"], "upstream_unreachable");
    assert_eq!(answer.headers["content-type"], "application/json");
    let again = gate.deliver(&body).await;
    assert_eq!(again.status, 502, "released, so not in_flight");
    gate.shutdown().await;
}

#[tokio::test]
async fn other_paths_pass_through_and_methods_are_checked() {
    let gate = GateFixture::stripe()
        .provider_extra("passthrough_methods = [\"GET\"]")
        .start()
        .await;
    let up = gate.upstream();

    let other = gate
        .send(Method::PUT, "/api/things?x=1", &[], "payload")
        .await;
    assert_eq!(other.status, 200);
    assert_eq!(up.received()[0].uri, "/api/things?x=1");
    assert_eq!(up.received()[0].body.as_ref(), b"payload");

    let handshake = gate.send(Method::GET, "/webhooks/stripe", &[], "").await;
    assert_eq!(handshake.status, 200);
    let delete = gate.send(Method::DELETE, "/webhooks/stripe", &[], "").await;
    assert_eq!(delete.status, 405);
    assert_eq!(delete.json()["error"], "method_not_allowed");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

#[tokio::test]
async fn unknown_routes_are_404_when_passthrough_is_off() {
    let gate = GateFixture::stripe()
        .upstream_extra("passthrough = false")
        .start()
        .await;
    let answer = gate.send(Method::POST, "/elsewhere", &[], "x").await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.result(), "unknown_route");
    assert_eq!(gate.upstream().count(), 0);
    gate.shutdown().await;
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let gate = GateFixture::stripe()
        .server_extra("max_body_bytes = 1024")
        .start()
        .await;
    let body = vec![b'x'; 4096];
    let answer = gate.deliver(&body).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.json()["error"], "payload_too_large");
    assert_eq!(gate.upstream().count(), 0);
    gate.shutdown().await;
}

#[tokio::test]
async fn missing_keys_are_rejected_or_forwarded_as_configured() {
    let gate = GateFixture::provider("strict", Scheme::Stripe)
        .secret(SECRET)
        .add_provider("lenient", Scheme::Stripe)
        .secret(SECRET)
        .provider_extra("on_missing_key = \"forward\"")
        .start()
        .await;
    let up = gate.upstream();
    let body = br#"{"object":"event"}"#;
    let headers = gate.sign(body);

    let strict = gate.post("/webhooks/strict", &headers, body).await;
    assert_eq!(strict.status, 400);
    assert_eq!(strict.json()["error"], "missing_key");
    let lenient = gate.post("/webhooks/lenient", &headers, body).await;
    assert_eq!(lenient.result(), "forwarded");
    let again = gate.post("/webhooks/lenient", &headers, body).await;
    assert_eq!(again.result(), "forwarded", "no key, no dedupe");
    assert_eq!(up.count(), 2);
    assert!(!up.received()[0].headers.contains_key("hookgate-event-key"));

    let garbage = b"not json at all";
    let bad = gate.deliver_to("/webhooks/strict", garbage).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"], "bad_payload");
    gate.shutdown().await;
}

#[tokio::test]
async fn http2_deliveries_are_served_and_forwarded_over_http1() {
    let gate = GateFixture::stripe().start().await;
    let body = stripe_event("evt_h2");
    let response = http2_client()
        .request(signed_request(&gate, &body))
        .await
        .unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.headers()["hookgate-result"], "forwarded");
    let _ = response.into_body().collect().await.unwrap();
    let got = gate.upstream().received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body.as_ref(), body.as_slice());
    assert!(
        got[0].headers.contains_key("host"),
        "the authority became Host"
    );
    gate.shutdown().await;
}

/// Each open HTTP/2 stream may hold a body up to `max_body_bytes`: one
/// connection carries at most 32 at once (README, `server.max_connections`).
#[tokio::test]
async fn an_http2_connection_carries_at_most_32_requests_at_once() {
    // Each core's share of the app's slots above 40, so that only the
    // stream limit can hold the calls below 40.
    let cores = hookgate::cores::available();
    let gate = GateFixture::stripe()
        .upstream_extra(&format!("max_connections = {}", 40 * cores))
        .upstream_timeout("4s")
        .start()
        .await;
    let up = gate.upstream();
    let client = http2_client();
    // The connection and its settings first: a client that opens streams
    // before it has the gate's limit gets the ones over it refused
    // (REFUSED_STREAM, which RFC 9113 lets it retry).
    let first = client
        .request(signed_request(&gate, &stripe_event("evt_streams_first")))
        .await
        .unwrap();
    let _ = first.into_body().collect().await.unwrap();
    up.set(Behavior::Stall(std::time::Duration::from_millis(300)));
    forward_all_at_once(&client, &gate, "evt_streams", 40).await;
    assert_eq!(up.count(), 41);
    let peak = up.peak_in_flight();
    assert!(
        (2..=32).contains(&peak),
        "the app saw {peak} calls at once from one connection"
    );
    gate.shutdown().await;
}

#[tokio::test]
async fn upstream_max_connections_caps_the_calls_the_app_sees_at_once() {
    let gate = GateFixture::stripe()
        .upstream_extra("max_connections = 2")
        .upstream_timeout("4s")
        .start()
        .await;
    let up = gate.upstream();
    up.set(Behavior::Stall(std::time::Duration::from_millis(200)));

    // Six deliveries at once against a 2-slot cap and a 200 ms app: they
    // queue for a slot (600 ms in all, 1.2 s if one core serves all six
    // with its share of one slot; the timeout counts the wait).
    let bodies = (0..6).map(|i| stripe_event(&format!("evt_cap{i}")));
    for a in gate.deliver_all_at_once(bodies.collect(), &[]).await {
        assert_eq!((a.status.as_u16(), a.result()), (200, "forwarded"));
    }
    assert_eq!(up.count(), 6);
    let peak = up.peak_in_flight();
    assert!((1..=2).contains(&peak), "the app saw {peak} calls at once");
    gate.shutdown().await;
}

#[tokio::test]
async fn one_connection_takes_at_most_its_cores_share_of_the_upstream_slots() {
    // A connection is served by one core, and each core has an even share
    // of `upstream.max_connections` (README): six deliveries at once on one
    // HTTP/2 connection reach the app at most two at a time. (On one core
    // the share is the whole cap, which the test above holds.)
    let cores = hookgate::cores::available();
    let gate = GateFixture::stripe()
        .upstream_extra(&format!("max_connections = {}", 2 * cores))
        .start()
        .await;
    let up = gate.upstream();
    up.set(Behavior::Stall(std::time::Duration::from_millis(200)));
    let client = http2_client();
    forward_all_at_once(&client, &gate, "evt_share", 6).await;
    assert_eq!(up.count(), 6);
    let peak = up.peak_in_flight();
    assert!(
        (1..=2).contains(&peak),
        "the app saw {peak} calls at once from one connection, one core's share of {} slots on {cores} cores",
        2 * cores
    );
    gate.shutdown().await;
}

#[tokio::test]
async fn server_max_connections_holds_over_every_core_serving_the_listener() {
    // The public listener is served by one thread per core, each with its
    // own listener; the limit is the gate's, not each core's.
    let gate = GateFixture::stripe()
        .server_extra("max_connections = 2")
        .start()
        .await;
    let up = gate.upstream();
    up.set(Behavior::Stall(std::time::Duration::from_millis(150)));

    // Eight senders at once, a connection each (closed after the answer):
    // two are served at a time, the rest wait in the kernel's backlog.
    let bodies = (0..8).map(|i| stripe_event(&format!("evt_conns{i}")));
    let close = [("connection", "close")];
    for a in gate.deliver_all_at_once(bodies.collect(), &close).await {
        assert_eq!((a.status.as_u16(), a.result()), (200, "forwarded"));
    }
    assert_eq!(up.count(), 8);
    let peak = up.peak_in_flight();
    assert!(
        (1..=2).contains(&peak),
        "the app saw {peak} deliveries at once through 2 connections"
    );
    gate.shutdown().await;
}
