//! Metrics of SPEC section 6: always on the admin listener's `/metrics`
//! (Prometheus text), and pushed by OTLP/HTTP when `telemetry.otlp_endpoint`
//! is set. Both exports carry the same names and the same bounded labels:
//! `provider` is a configured name; `outcome`, `operation` and `backend`
//! come from fixed sets of codes.
//!
//! The gate records into [`Metrics`] only; it hands each measurement to
//! every [`Recorder`] in use.

mod catalog;
mod labels;
mod otlp;
mod prometheus;

use std::time::{Duration, UNIX_EPOCH};

use crate::settings::TelemetrySettings;
use crate::store::PartitionHealth;

// Every declared metric, by name: a new one needs no import.
use self::catalog::*;
use self::labels::{Key, Value};
pub(crate) use self::otlp::ExportClient;
use self::otlp::Otlp;
pub use self::otlp::OtlpError;
use self::prometheus::Prometheus;

/// What every export records. Each builds one instrument per entry of
/// [`catalog::ALL`] and finds it by the descriptor's `index`.
trait Recorder: Send + Sync {
    /// Records measurements of metrics that share one label set, given
    /// once for all of them, borrowed: an export copies what it keeps.
    fn record(&self, labels: &Key<'_>, measurements: &[Measurement]);
}

/// Every instrument the gate records into.
#[derive(Default)]
pub struct Metrics {
    prometheus: Prometheus,
    otlp: Option<Otlp>,
}

impl Metrics {
    /// `/metrics`, plus OTLP export when configured. Must run inside the
    /// tokio runtime that will carry the exports.
    pub fn new(settings: &TelemetrySettings) -> Result<Self, OtlpError> {
        Ok(Self {
            prometheus: Prometheus::new(),
            otlp: settings.otlp.as_ref().map(Otlp::start).transpose()?,
        })
    }

    /// A finished delivery and its duration.
    pub fn delivery(&self, provider: &str, outcome: &'static str, elapsed: Duration) {
        let labels = DELIVERIES.labels([Value::Name(provider), Value::Code(outcome)]);
        self.record(
            &labels,
            &[DELIVERIES.add(1), REQUEST_DURATION.observe(elapsed)],
        );
    }

    /// A verified delivery, by the index of the secret that matched.
    pub fn secret_match(&self, provider: &str, index: usize) {
        let labels = SECRET_MATCHES.labels([Value::Name(provider), Value::Index(index)]);
        self.record(&labels, &[SECRET_MATCHES.add(1)]);
    }

    /// How long the application took to answer.
    pub fn upstream(&self, provider: &str, elapsed: Duration) {
        let labels = UPSTREAM_DURATION.labels([Value::Name(provider)]);
        self.record(&labels, &[UPSTREAM_DURATION.observe(elapsed)]);
    }

    /// One dedupe store operation.
    pub fn store(&self, backend: &'static str, operation: &'static str, elapsed: Duration) {
        let labels = STORE_DURATION.labels([Value::Code(backend), Value::Code(operation)]);
        self.record(&labels, &[STORE_DURATION.observe(elapsed)]);
    }

    /// A background retry of a failed completion mark.
    pub fn mark_retry(&self, provider: &str) {
        let labels = MARK_RETRIES.labels([Value::Name(provider)]);
        self.record(&labels, &[MARK_RETRIES.add(1)]);
    }

    /// Something a sender should never do, by kind (`payload_mismatch`).
    pub fn anomaly(&self, provider: &str, kind: &'static str) {
        let labels = ANOMALIES.labels([Value::Name(provider), Value::Code(kind)]);
        self.record(&labels, &[ANOMALIES.add(1)]);
    }

    /// One relay attempt, by how it ended (`delivered`, `retry`, `dead`).
    pub fn relay_attempt(&self, provider: &str, outcome: &'static str) {
        let labels = RELAY_ATTEMPTS.labels([Value::Name(provider), Value::Code(outcome)]);
        self.record(&labels, &[RELAY_ATTEMPTS.add(1)]);
    }

    /// A job delivered `waited` after it was accepted.
    pub fn accept_to_delivery(&self, provider: &str, waited: Duration) {
        let labels = ACCEPT_TO_DELIVERY.labels([Value::Name(provider)]);
        self.record(&labels, &[ACCEPT_TO_DELIVERY.observe(waited)]);
    }

    /// A job moved to the dead letter.
    pub fn dead_letter(&self, provider: &str) {
        let labels = DEAD_LETTERS.labels([Value::Name(provider)]);
        self.record(&labels, &[DEAD_LETTERS.add(1)]);
    }

    /// A provider's queue: jobs by state, and the oldest pending one's age.
    pub fn queue_depth(
        &self,
        provider: &str,
        pending: u64,
        leased: u64,
        dead: u64,
        oldest: Duration,
    ) {
        for (state, n) in [("pending", pending), ("leased", leased), ("dead", dead)] {
            let labels = QUEUE_DEPTH.labels([Value::Name(provider), Value::Code(state)]);
            self.record(&labels, &[QUEUE_DEPTH.set(n)]);
        }
        let labels = QUEUE_OLDEST_PENDING.labels([Value::Name(provider)]);
        self.record(&labels, &[QUEUE_OLDEST_PENDING.set(oldest.as_secs())]);
    }

    /// The postgres store's partition maintenance.
    pub fn partition_health(&self, health: &PartitionHealth) {
        let seconds = |d: Option<Duration>| d.map_or(0, |d| d.as_secs());
        let since_epoch = health
            .last_maintenance
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok());
        self.record(
            &Key::none(),
            &[
                POSTGRES_ESTIMATED_ROWS.set(health.estimated_rows),
                POSTGRES_OLDEST_PARTITION_AGE.set(seconds(health.oldest_partition_age)),
                POSTGRES_PARTITIONS_AHEAD.set(u64::from(health.partitions_ahead)),
                POSTGRES_LAST_MAINTENANCE.set(seconds(since_epoch)),
            ],
        );
    }

    /// The Prometheus text exposition for `/metrics`.
    pub fn encode(&self) -> String {
        self.prometheus.encode()
    }

    /// Pushes what OTLP has not exported yet and stops its exporter.
    pub async fn shutdown(&self) {
        if let Some(otlp) = &self.otlp {
            otlp.shutdown().await;
        }
    }

    fn record(&self, labels: &Key<'_>, measurements: &[Measurement]) {
        // A label set shared by two metrics must suit both.
        debug_assert!(
            measurements
                .iter()
                .all(|m| m.metric().labels == labels.names()),
            "{measurements:?} with {labels:?}"
        );
        self.prometheus.record(labels, measurements);
        if let Some(otlp) = &self.otlp {
            otlp.record(labels, measurements);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::otlp::capture::Capture;
    use super::*;

    /// Calls every method that records, so that every declared metric has
    /// a series.
    fn record_everything(m: &Metrics) {
        m.delivery("stripe", "forwarded", Duration::from_millis(3));
        m.secret_match("stripe", 12);
        m.upstream("stripe", Duration::from_millis(2));
        m.store("sqlite", "claim", Duration::from_micros(300));
        m.mark_retry("stripe");
        m.anomaly("stripe", "payload_mismatch");
        m.relay_attempt("stripe", "retry");
        m.accept_to_delivery("stripe", Duration::from_secs(2));
        m.dead_letter("stripe");
        m.queue_depth("stripe", 3, 1, 2, Duration::from_secs(40));
        m.partition_health(&PartitionHealth {
            estimated_rows: 1234,
            oldest_partition_age: Some(Duration::from_secs(3 * 86_400)),
            partitions_ahead: 3,
            last_maintenance: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        });
    }

    #[test]
    fn both_exports_carry_every_declared_metric_as_declared() {
        let capture = Capture::default();
        let m = Metrics {
            prometheus: Prometheus::new(),
            otlp: Some(capture.otlp()),
        };
        record_everything(&m);
        let text = m.encode();
        let exported = capture.take(m.otlp.as_ref().unwrap());

        for metric in ALL {
            let name = metric.name;
            let family = name.strip_suffix("_total").unwrap_or(name);
            let kind = format!("{:?}", metric.kind).to_lowercase();
            assert!(
                text.contains(&format!("# HELP {family} {}.\n", metric.help)),
                "{name}"
            );
            assert!(
                text.contains(&format!("# TYPE {family} {kind}\n")),
                "{name}"
            );
            let series = match metric.kind {
                Kind::Histogram => format!("{name}_count"),
                _ => name.to_owned(),
            };
            let line = text
                .lines()
                .find(|l| l.starts_with(&series) && !l.starts_with(&format!("{series}_")))
                .unwrap_or_else(|| panic!("no series of {name} in\n{text}"));
            let labels: Vec<_> = metric.labels.iter().map(|l| format!("{l}=")).collect();
            assert!(labels.iter().all(|l| line.contains(l)), "{line}");

            let otlp = exported
                .iter()
                .find(|e| e.name == name)
                .unwrap_or_else(|| panic!("{name} not exported by OTLP"));
            assert_eq!(otlp.description, metric.help, "{name}");
            assert_eq!(otlp.unit, metric.unit(), "{name}");
            assert!(!otlp.points.is_empty(), "{name}");
            for point in &otlp.points {
                let mut names = point.clone();
                names.sort();
                let mut declared = metric.labels.to_vec();
                declared.sort();
                assert_eq!(names, declared, "{name}");
            }
        }
        assert_eq!(
            exported.len(),
            ALL.len(),
            "OTLP exports an undeclared metric"
        );
    }
}
