//! Delivery traces over OTLP: a recording server stands in for the
//! collector, and what it receives on `/v1/traces` is decoded as the OTLP
//! protobuf a real collector would parse. The app is the recording
//! upstream, so the `traceparent` it gets is checked against the spans.

use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

use crate::support::fixture::{Gate, GateFixture};
use crate::support::gate::{SECRET, stripe_event};
use crate::support::upstream::{Received, Upstream};

const SENDER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN: &str = "00f067aa0ba902b7";

fn sender_traceparent(flags: &str) -> String {
    format!("00-{SENDER_TRACE}-{SENDER_SPAN}-{flags}")
}

/// A stripe gate exporting to `collector`, with `extra` telemetry keys.
async fn tracing_gate(collector: &Upstream, extra: &str, fixture: GateFixture) -> Gate {
    fixture
        .section(&format!(
            "[telemetry]\notlp_endpoint = \"{}\"\notlp_timeout = \"2s\"\n{extra}",
            collector.url()
        ))
        .start()
        .await
}

/// Every span the collector received on `/v1/traces`.
fn spans(exports: &[Received]) -> Vec<Span> {
    let mut spans = Vec::new();
    for export in exports.iter().filter(|e| e.uri == "/v1/traces") {
        assert_eq!(
            export.headers[http::header::CONTENT_TYPE],
            "application/x-protobuf"
        );
        let request = ExportTraceServiceRequest::decode(export.body.as_ref())
            .expect("an OTLP protobuf trace export");
        for resource in &request.resource_spans {
            let resource_attributes = &resource.resource.as_ref().unwrap().attributes;
            assert_eq!(text(resource_attributes, "service.name"), Some("hookgate"));
            for scope in &resource.scope_spans {
                spans.extend(scope.spans.iter().cloned());
            }
        }
    }
    spans
}

fn text<'a>(attributes: &'a [KeyValue], name: &str) -> Option<&'a str> {
    attributes.iter().find(|kv| kv.key == name).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        }
    })
}

fn int(attributes: &[KeyValue], name: &str) -> Option<i64> {
    attributes.iter().find(|kv| kv.key == name).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::IntValue(n) => Some(*n),
            _ => None,
        }
    })
}

/// Every attribute value of every span and event, as text.
fn attribute_values(spans: &[Span]) -> Vec<String> {
    let all = spans.iter().flat_map(|s| {
        s.attributes
            .iter()
            .chain(s.events.iter().flat_map(|e| &e.attributes))
    });
    all.map(|kv| format!("{:?}", kv.value)).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// The (trace id, parent span id) of a `traceparent` the app received.
fn parent_of(received: &Received) -> (String, String, String) {
    let value = received.headers["traceparent"].to_str().unwrap();
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!(parts[0], "00");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

#[tokio::test]
async fn a_delivery_continues_the_senders_trace_and_the_app_gets_the_forward_span() {
    let collector = Upstream::start().await;
    let gate = tracing_gate(&collector, "", GateFixture::stripe()).await;
    let body = stripe_event("evt_t1");
    let mut headers = gate.sign(&body);
    let signature = headers[0].1.clone();
    headers.push(("traceparent".into(), sender_traceparent("01")));
    headers.push(("tracestate".into(), "vendor=abc,other=1".into()));
    headers.push(("x-custom".into(), "kept".into()));
    let first = gate.post(&gate.path(), &headers, &body).await;
    assert_eq!(first.result(), "forwarded");
    let again = gate.post(&gate.path(), &headers, &body).await;
    assert_eq!(again.result(), "duplicate");
    let received = gate.upstream().received();
    gate.shutdown().await;

    let spans = spans(&collector.received());
    let trace_id = const_hex::decode(SENDER_TRACE).unwrap();
    assert!(
        spans.iter().all(|s| s.trace_id == trace_id),
        "every span is in the sender's trace: {spans:#?}"
    );
    let deliveries = named(&spans, "delivery");
    assert_eq!(deliveries.len(), 2, "{spans:#?}");
    for d in &deliveries {
        assert_eq!(d.parent_span_id, const_hex::decode(SENDER_SPAN).unwrap());
        assert_eq!(d.kind, SpanKind::Server as i32);
        assert_eq!(text(&d.attributes, "hookgate.provider"), Some("stripe"));
        assert_eq!(text(&d.attributes, "hookgate.verification"), Some("ok"));
        assert_eq!(text(&d.attributes, "hookgate.event_key"), Some("evt_t1"));
        assert_eq!(int(&d.attributes, "hookgate.upstream_status"), Some(200));
        assert_eq!(d.trace_state, "vendor=abc,other=1");
    }
    let outcome = |d: &Span| {
        (
            text(&d.attributes, "hookgate.outcome").unwrap().to_owned(),
            text(&d.attributes, "hookgate.dedupe").unwrap().to_owned(),
        )
    };
    let (fresh, duplicate) = match deliveries.as_slice() {
        [a, b] if outcome(a).0 == "forwarded" => (*a, *b),
        [a, b] => (*b, *a),
        _ => unreachable!(),
    };
    assert_eq!(outcome(fresh), ("forwarded".into(), "fresh".into()));
    assert_eq!(outcome(duplicate), ("duplicate".into(), "duplicate".into()));

    let children = |parent: &Span| {
        let mut names: Vec<&str> = spans
            .iter()
            .filter(|s| s.parent_span_id == parent.span_id)
            .map(|s| s.name.as_str())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        children(fresh),
        ["claim", "finish", "forward", "verify"],
        "a span per stage"
    );
    assert_eq!(
        children(duplicate),
        ["claim", "verify"],
        "a duplicate is answered from the store"
    );
    let forward = spans
        .iter()
        .find(|s| s.name == "forward" && s.parent_span_id == fresh.span_id)
        .unwrap();
    assert_eq!(forward.kind, SpanKind::Client as i32);
    assert_eq!(
        int(&forward.attributes, "http.response.status_code"),
        Some(200)
    );

    // The app: one call, in the sender's trace, whose parent is the
    // forward span; everything else as the sender sent it.
    assert_eq!(received.len(), 1);
    let app = &received[0];
    let (trace, parent, flags) = parent_of(app);
    assert_eq!(trace, SENDER_TRACE);
    assert_eq!(parent, const_hex::encode(&forward.span_id));
    assert_eq!(flags, "01");
    assert_eq!(app.headers.get_all("traceparent").iter().count(), 1);
    assert_eq!(app.headers["tracestate"], "vendor=abc,other=1");
    assert_eq!(app.body.as_ref(), body.as_slice(), "byte for byte");
    assert_eq!(app.headers["stripe-signature"], signature.as_str());
    assert_eq!(app.headers["x-custom"], "kept");

    // Nothing secret, signed or carried in the body.
    let body_text = String::from_utf8_lossy(&body);
    for value in attribute_values(&spans) {
        assert!(!value.contains(SECRET), "{value}");
        assert!(!value.contains(&signature), "{value}");
        assert!(!value.contains("charge.succeeded"), "{value}");
        assert!(!value.contains(body_text.trim()), "{value}");
    }
    for export in collector.received() {
        let raw = String::from_utf8_lossy(&export.body);
        assert!(!raw.contains(SECRET), "an export carries the secret");
        assert!(!raw.contains(&signature), "an export carries the signature");
        assert!(
            !raw.contains("charge.succeeded"),
            "an export carries the body"
        );
    }
}

#[tokio::test]
async fn without_a_sender_trace_a_new_one_starts_and_failures_are_marked() {
    let collector = Upstream::start().await;
    let gate = tracing_gate(&collector, "", GateFixture::stripe()).await;
    gate.upstream()
        .set(crate::support::upstream::Behavior::Status(503));
    let body = stripe_event("evt_t2");
    let headers = gate.sign(&body);
    assert_eq!(
        gate.post(&gate.path(), &headers, &body).await.result(),
        "upstream_error"
    );
    let forged = crate::support::gate::signed(
        &hookgate::provider::Scheme::Stripe,
        "forged",
        &body,
        "",
        None,
    );
    assert_eq!(
        gate.post(&gate.path(), &forged, &body).await.result(),
        "invalid_signature"
    );
    let received = gate.upstream().received();
    gate.shutdown().await;
    let spans = spans(&collector.received());

    let deliveries = named(&spans, "delivery");
    let by_outcome = |o: &str| {
        *deliveries
            .iter()
            .find(|d| text(&d.attributes, "hookgate.outcome") == Some(o))
            .unwrap_or_else(|| panic!("no {o} delivery in {spans:#?}"))
    };
    let failed = by_outcome("upstream_error");
    assert!(failed.parent_span_id.is_empty(), "a root span");
    assert_eq!(
        int(&failed.attributes, "hookgate.upstream_status"),
        Some(503)
    );
    assert_eq!(
        failed.status.as_ref().map(|s| s.code),
        Some(2),
        "the app's 5xx is an error of the delivery"
    );
    let (trace, parent, _) = parent_of(&received[0]);
    assert_eq!(trace, const_hex::encode(&failed.trace_id));
    let forward = spans
        .iter()
        .find(|s| s.name == "forward" && s.trace_id == failed.trace_id)
        .unwrap();
    assert_eq!(parent, const_hex::encode(&forward.span_id));
    assert!(received[0].headers.get("tracestate").is_none());

    let forgery = by_outcome("invalid_signature");
    assert_eq!(
        text(&forgery.attributes, "hookgate.verification"),
        Some("invalid")
    );
    assert_ne!(
        forgery.status.as_ref().map(|s| s.code),
        Some(2),
        "a sender's mistake is not an error of the gate"
    );
    let verify = spans
        .iter()
        .find(|s| s.name == "verify" && s.parent_span_id == forgery.span_id)
        .unwrap();
    assert_eq!(
        text(&verify.attributes, "error.type"),
        Some("invalid_signature")
    );
}

#[tokio::test]
async fn a_ratio_of_zero_exports_nothing_and_leaves_the_traceparent_alone() {
    let collector = Upstream::start().await;
    let gate = tracing_gate(
        &collector,
        "trace_sample_ratio = 0\notlp_interval = \"1h\"",
        GateFixture::stripe(),
    )
    .await;
    let body = stripe_event("evt_t3");
    let mut headers = gate.sign(&body);
    headers.push(("traceparent".into(), sender_traceparent("01")));
    assert_eq!(
        gate.post(&gate.path(), &headers, &body).await.result(),
        "forwarded"
    );
    let received = gate.upstream().received();
    gate.shutdown().await;

    let traces = collector
        .received()
        .iter()
        .filter(|e| e.uri == "/v1/traces")
        .count();
    assert_eq!(traces, 0, "nothing exported");
    assert_eq!(
        received[0].headers["traceparent"],
        sender_traceparent("01").as_str(),
        "untouched when traces are off"
    );
}

#[tokio::test]
async fn an_unsampled_sender_trace_is_followed_but_not_exported() {
    let collector = Upstream::start().await;
    let gate = tracing_gate(&collector, "", GateFixture::stripe()).await;
    let body = stripe_event("evt_t4");
    let mut headers = gate.sign(&body);
    headers.push(("traceparent".into(), sender_traceparent("00")));
    assert_eq!(
        gate.post(&gate.path(), &headers, &body).await.result(),
        "forwarded"
    );
    let received = gate.upstream().received();
    gate.shutdown().await;

    assert!(spans(&collector.received()).is_empty(), "parent-based");
    let (trace, parent, flags) = parent_of(&received[0]);
    assert_eq!(trace, SENDER_TRACE);
    assert_ne!(parent, SENDER_SPAN, "the gate is a hop");
    assert_eq!(flags, "00");
}

#[tokio::test]
async fn in_queue_mode_each_relay_attempt_is_a_span_under_the_accept() {
    let collector = Upstream::start().await;
    let up = Upstream::start().await;
    up.set(crate::support::upstream::Behavior::Status(503));
    let fixture = GateFixture::stripe()
        .provider_extra("mode = \"queue\"")
        .section(
            "[queue]\nretry_initial = \"50ms\"\nretry_max = \"100ms\"\nlease = \"5s\"\njitter = 0.0\n",
        )
        .upstream(&up);
    let gate = tracing_gate(&collector, "", fixture).await;
    let body = stripe_event("evt_t5");
    let mut headers = gate.sign(&body);
    headers.push(("traceparent".into(), sender_traceparent("01")));
    assert_eq!(
        gate.post(&gate.path(), &headers, &body).await.result(),
        "accepted"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while up.count() < 1 {
        assert!(Instant::now() < deadline, "no first attempt");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    up.set(crate::support::upstream::Behavior::Status(200));
    while !up.received().iter().any(|r| r.status == 200) {
        assert!(Instant::now() < deadline, "no delivered attempt");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let received = up.received();
    gate.shutdown().await;

    let spans = spans(&collector.received());
    let trace_id = const_hex::decode(SENDER_TRACE).unwrap();
    assert!(spans.iter().all(|s| s.trace_id == trace_id), "{spans:#?}");
    let delivery = named(&spans, "delivery")[0];
    assert_eq!(
        text(&delivery.attributes, "hookgate.outcome"),
        Some("accepted")
    );
    let accept = named(&spans, "accept")[0];
    assert_eq!(accept.parent_span_id, delivery.span_id);
    let attempts = named(&spans, "relay attempt");
    assert_eq!(attempts.len(), received.len(), "a span per attempt");
    for (n, r) in received.iter().enumerate() {
        let (_, parent, _) = parent_of(r);
        let attempt = attempts
            .iter()
            .find(|a| const_hex::encode(&a.span_id) == parent)
            .expect("the app's parent is an attempt span");
        assert_eq!(attempt.parent_span_id, accept.span_id);
        assert_eq!(
            int(&attempt.attributes, "hookgate.attempt"),
            Some(n as i64 + 1)
        );
        assert_eq!(
            int(&attempt.attributes, "http.response.status_code"),
            Some(r.status as i64)
        );
        let outcome = if r.status == 200 {
            "delivered"
        } else {
            "retry"
        };
        assert_eq!(text(&attempt.attributes, "hookgate.outcome"), Some(outcome));
        assert_eq!(r.body.as_ref(), body.as_slice());
    }
}
