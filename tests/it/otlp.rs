//! OTLP export: a recording server stands in for the collector; what it
//! receives is decoded as the OTLP protobuf a real collector would parse.

use std::time::{Duration, Instant};

use hookgate::provider::Scheme;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
use prost::Message;

use crate::support::fixture::{Gate, GateFixture};
use crate::support::gate::{SECRET, signed, stripe_event};
use crate::support::upstream::{Received, Upstream};

fn label<'a>(attributes: &'a [KeyValue], name: &str) -> Option<&'a str> {
    attributes.iter().find(|kv| kv.key == name).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        }
    })
}

/// The newest value of `hookgate_deliveries_total{provider, outcome}` among
/// the exports received (counters are cumulative).
fn deliveries(exports: &[Received], provider: &str, outcome: &str) -> Option<u64> {
    let mut newest = None;
    for export in exports {
        let request = ExportMetricsServiceRequest::decode(export.body.as_ref())
            .expect("an OTLP protobuf export");
        let metrics = request
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics);
        for metric in metrics.filter(|m| m.name == "hookgate_deliveries_total") {
            let Some(Data::Sum(sum)) = &metric.data else {
                panic!("hookgate_deliveries_total is not a sum: {metric:?}");
            };
            assert!(sum.is_monotonic, "a counter exports a monotonic sum");
            for point in &sum.data_points {
                if label(&point.attributes, "provider") == Some(provider)
                    && label(&point.attributes, "outcome") == Some(outcome)
                    && let Some(Value::AsInt(n)) = point.value
                {
                    newest = Some(n as u64);
                }
            }
        }
    }
    newest
}

fn service_name(export: &Received) -> Option<String> {
    let request = ExportMetricsServiceRequest::decode(export.body.as_ref()).ok()?;
    let resource = request.resource_metrics.first()?.resource.as_ref()?;
    label(&resource.attributes, "service.name").map(str::to_owned)
}

async fn send_twice_and_once_forged(gate: &Gate) {
    let forged = stripe_event("evt_o2");
    let headers = signed(&Scheme::Stripe, "forged", &forged, "", None);
    gate.deliver(&stripe_event("evt_o1")).await;
    gate.deliver(&stripe_event("evt_o1")).await;
    gate.post(&gate.path(), &headers, &forged).await;
}

/// What the collector received on the metrics path (traces go there too,
/// on theirs: tests/it/traces.rs).
fn metric_exports(collector: &Upstream) -> Vec<Received> {
    let mut exports = collector.received();
    exports.retain(|e| e.uri != "/v1/traces");
    exports
}

/// A stripe gate exporting to `collector` every `interval`.
async fn exporting_gate(collector: &Upstream, interval: &str) -> Gate {
    GateFixture::stripe()
        .section(&format!(
            "[telemetry]\notlp_endpoint = \"{}\"\notlp_interval = \"{interval}\"\notlp_timeout = \"2s\"",
            collector.url()
        ))
        .start()
        .await
}

#[tokio::test]
async fn metrics_are_pushed_to_the_collector_every_interval() {
    let collector = Upstream::start().await;
    let gate = exporting_gate(&collector, "200ms").await;
    send_twice_and_once_forged(&gate).await;

    let deadline = Instant::now() + Duration::from_secs(10);
    // The forgery is sent last: an export taken between two deliveries
    // has the earlier ones only, so wait for one that has it.
    while deliveries(&metric_exports(&collector), "stripe", "invalid_signature").is_none() {
        assert!(
            Instant::now() < deadline,
            "no export with the deliveries within 10 s; received {} requests",
            collector.count()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exports = metric_exports(&collector);
    let first = &exports[0];
    assert_eq!(first.method, http::Method::POST);
    assert_eq!(first.uri, "/v1/metrics", "a base URL gets the metrics path");
    assert_eq!(
        first.headers.get(http::header::CONTENT_TYPE).unwrap(),
        "application/x-protobuf"
    );
    assert_eq!(service_name(first).as_deref(), Some("hookgate"));
    assert_eq!(deliveries(&exports, "stripe", "forwarded"), Some(1));
    assert_eq!(deliveries(&exports, "stripe", "duplicate"), Some(1));
    assert_eq!(deliveries(&exports, "stripe", "invalid_signature"), Some(1));
    for export in &exports {
        let raw = String::from_utf8_lossy(&export.body);
        assert!(!raw.contains(SECRET), "an export carries the secret");
    }
    gate.shutdown().await;
}

#[tokio::test]
async fn shutdown_pushes_what_the_interval_has_not() {
    let collector = Upstream::start().await;
    let gate = exporting_gate(&collector, "1h").await;
    send_twice_and_once_forged(&gate).await;
    assert_eq!(
        metric_exports(&collector).len(),
        0,
        "nothing is pushed before the interval"
    );

    gate.shutdown().await;
    let exports = metric_exports(&collector);
    assert_eq!(exports.len(), 1, "one last export at shutdown");
    assert_eq!(deliveries(&exports, "stripe", "forwarded"), Some(1));
    assert_eq!(deliveries(&exports, "stripe", "duplicate"), Some(1));
}
