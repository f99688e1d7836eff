//! The Prometheus text exposition on the admin listener's `/metrics`.
//!
//! Built on `prometheus-client`, the Prometheus project's own Rust client:
//! OpenTelemetry's Prometheus exporter is deprecated (its releases depend on
//! the unmaintained `prometheus` crate and its maintainers recommend OTLP
//! instead), so OTLP export (`otlp.rs`) uses the OpenTelemetry SDK and the
//! scrape endpoint uses this.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{LATENCY_BUCKETS, Recorder};
use crate::store::PartitionHealth;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    provider: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabels {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    backend: &'static str,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnomalyLabels {
    provider: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SecretLabels {
    provider: String,
    secret: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The instruments behind `/metrics`.
pub struct Prometheus {
    registry: Registry,
    deliveries: Family<DeliveryLabels, Counter>,
    request_duration: Histograms<DeliveryLabels>,
    upstream_duration: Histograms<ProviderLabels>,
    store_duration: Histograms<StoreLabels>,
    secret_matches: Family<SecretLabels, Counter>,
    mark_retries: Family<ProviderLabels, Counter>,
    anomalies: Family<AnomalyLabels, Counter>,
    partitions: PartitionGauges,
}

/// The postgres store's partition maintenance, as gauges (set only on that
/// backend). Claim latency is `hookgate_store_operation_duration_seconds`.
#[derive(Default)]
struct PartitionGauges {
    estimated_rows: Gauge,
    oldest_age_seconds: Gauge,
    ahead: Gauge,
    last_maintenance: Gauge,
}

fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS.iter().copied())
}

impl Default for Prometheus {
    fn default() -> Self {
        Self::new()
    }
}

impl Prometheus {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let deliveries = Family::default();
        let request_duration = Histograms::new_with_constructor(latency as fn() -> Histogram);
        let upstream_duration = Histograms::new_with_constructor(latency as fn() -> Histogram);
        let store_duration = Histograms::new_with_constructor(latency as fn() -> Histogram);
        let secret_matches = Family::default();
        let mark_retries = Family::default();
        let anomalies = Family::default();
        // prometheus-client appends `_total` to counters.
        registry.register(
            "hookgate_deliveries",
            "Deliveries by provider and outcome",
            deliveries.clone(),
        );
        registry.register(
            "hookgate_request_duration_seconds",
            "Time from the request head to the answer, by provider and outcome",
            request_duration.clone(),
        );
        registry.register(
            "hookgate_upstream_duration_seconds",
            "Time the application took to answer a delivery",
            upstream_duration.clone(),
        );
        registry.register(
            "hookgate_store_operation_duration_seconds",
            "Dedupe store operations by backend and operation",
            store_duration.clone(),
        );
        registry.register(
            "hookgate_secret_matches",
            "Verified deliveries by the index of the secret that matched",
            secret_matches.clone(),
        );
        registry.register(
            "hookgate_mark_retries",
            "Background retries of a failed completion mark",
            mark_retries.clone(),
        );
        registry.register(
            "hookgate_anomalies",
            "Deliveries a sender should never make, by kind (payload_mismatch)",
            anomalies.clone(),
        );
        let partitions = PartitionGauges::default();
        registry.register(
            "hookgate_postgres_estimated_rows",
            "Rows in processed_events, from the planner's statistics",
            partitions.estimated_rows.clone(),
        );
        registry.register(
            "hookgate_postgres_oldest_partition_age_seconds",
            "Age of the oldest processed_events partition's first day",
            partitions.oldest_age_seconds.clone(),
        );
        registry.register(
            "hookgate_postgres_partitions_ahead",
            "Daily partitions provisioned after today",
            partitions.ahead.clone(),
        );
        registry.register(
            "hookgate_postgres_last_maintenance_timestamp_seconds",
            "When partition maintenance last succeeded (Unix time; 0: never)",
            partitions.last_maintenance.clone(),
        );
        Self {
            partitions,
            registry,
            deliveries,
            request_duration,
            upstream_duration,
            store_duration,
            secret_matches,
            mark_retries,
            anomalies,
        }
    }

    /// The Prometheus text exposition (OpenMetrics flavour).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Recorder for Prometheus {
    fn delivery(&self, provider: &str, outcome: &'static str, elapsed: Duration) {
        let labels = DeliveryLabels {
            provider: provider.to_owned(),
            outcome,
        };
        self.request_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        self.deliveries.get_or_create(&labels).inc();
    }

    fn secret_match(&self, provider: &str, index: usize) {
        self.secret_matches
            .get_or_create(&SecretLabels {
                provider: provider.to_owned(),
                secret: index.to_string(),
            })
            .inc();
    }

    fn upstream(&self, provider: &str, elapsed: Duration) {
        self.upstream_duration
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    fn store(&self, backend: &'static str, operation: &'static str, elapsed: Duration) {
        self.store_duration
            .get_or_create(&StoreLabels { backend, operation })
            .observe(elapsed.as_secs_f64());
    }

    fn mark_retry(&self, provider: &str) {
        self.mark_retries
            .get_or_create(&ProviderLabels {
                provider: provider.to_owned(),
            })
            .inc();
    }

    fn anomaly(&self, provider: &str, kind: &'static str) {
        self.anomalies
            .get_or_create(&AnomalyLabels {
                provider: provider.to_owned(),
                kind,
            })
            .inc();
    }

    fn partition_health(&self, health: &PartitionHealth) {
        let g = &self.partitions;
        g.estimated_rows
            .set(i64::try_from(health.estimated_rows).unwrap_or(i64::MAX));
        g.oldest_age_seconds.set(
            health
                .oldest_partition_age
                .map_or(0, |a| a.as_secs() as i64),
        );
        g.ahead.set(i64::from(health.partitions_ahead));
        let since_epoch = health
            .last_maintenance
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        g.last_maintenance
            .set(since_epoch.map_or(0, |d| d.as_secs() as i64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_match_the_contract() {
        let m = Prometheus::new();
        m.delivery("stripe", "forwarded", Duration::from_millis(3));
        m.secret_match("stripe", 1);
        m.mark_retry("stripe");
        m.anomaly("stripe", "payload_mismatch");
        m.store("sqlite", "claim", Duration::from_micros(300));
        m.upstream("stripe", Duration::from_millis(2));
        let text = m.encode();
        for line in [
            "hookgate_deliveries_total{provider=\"stripe\",outcome=\"forwarded\"} 1",
            "hookgate_secret_matches_total{provider=\"stripe\",secret=\"1\"} 1",
            "hookgate_mark_retries_total{provider=\"stripe\"} 1",
            "hookgate_anomalies_total{provider=\"stripe\",kind=\"payload_mismatch\"} 1",
            "hookgate_request_duration_seconds_count{provider=\"stripe\",outcome=\"forwarded\"} 1",
            "hookgate_upstream_duration_seconds_count{provider=\"stripe\"} 1",
            "hookgate_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"claim\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
