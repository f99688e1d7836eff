//! Metrics of SPEC section 6: always on the admin listener's `/metrics`
//! (Prometheus text), and pushed by OTLP/HTTP when `telemetry.otlp_endpoint`
//! is set. Both exports carry the same names and the same bounded labels:
//! `provider` is a configured name; `outcome`, `operation` and `backend`
//! come from fixed sets of codes.
//!
//! The gate records into [`Metrics`] only; it hands each measurement to
//! every [`Recorder`] in use.

mod otlp;
mod prometheus;

use std::time::Duration;

use crate::settings::TelemetrySettings;
use crate::store::PartitionHealth;

use self::otlp::Otlp;
pub use self::otlp::OtlpError;
use self::prometheus::Prometheus;

/// Latency buckets in seconds, from 0.25 ms doubling to about 16 s.
const LATENCY_BUCKETS: [f64; 17] = {
    let mut buckets = [0.000_25; 17];
    let mut i = 1;
    while i < buckets.len() {
        buckets[i] = buckets[i - 1] * 2.0;
        i += 1;
    }
    buckets
};

/// What every export records.
trait Recorder: Send + Sync {
    /// A finished delivery and its duration.
    fn delivery(&self, provider: &str, outcome: &'static str, elapsed: Duration);
    /// A verified delivery, by the index of the secret that matched.
    fn secret_match(&self, provider: &str, index: usize);
    /// How long the application took to answer.
    fn upstream(&self, provider: &str, elapsed: Duration);
    /// One dedupe store operation.
    fn store(&self, backend: &'static str, operation: &'static str, elapsed: Duration);
    /// A background retry of a failed completion mark.
    fn mark_retry(&self, provider: &str);
    /// Something a sender should never do, by kind (`payload_mismatch`).
    fn anomaly(&self, provider: &str, kind: &'static str);
    /// The postgres store's partition maintenance.
    fn partition_health(&self, health: &PartitionHealth);
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

    fn each(&self, record: impl Fn(&dyn Recorder)) {
        record(&self.prometheus);
        if let Some(otlp) = &self.otlp {
            record(otlp);
        }
    }

    pub fn delivery(&self, provider: &str, outcome: &'static str, elapsed: Duration) {
        self.each(|r| r.delivery(provider, outcome, elapsed));
    }

    pub fn secret_match(&self, provider: &str, index: usize) {
        self.each(|r| r.secret_match(provider, index));
    }

    pub fn upstream(&self, provider: &str, elapsed: Duration) {
        self.each(|r| r.upstream(provider, elapsed));
    }

    pub fn store(&self, backend: &'static str, operation: &'static str, elapsed: Duration) {
        self.each(|r| r.store(backend, operation, elapsed));
    }

    pub fn mark_retry(&self, provider: &str) {
        self.each(|r| r.mark_retry(provider));
    }

    pub fn anomaly(&self, provider: &str, kind: &'static str) {
        self.each(|r| r.anomaly(provider, kind));
    }

    pub fn partition_health(&self, health: &PartitionHealth) {
        self.each(|r| r.partition_health(health));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_double_from_a_quarter_millisecond() {
        assert_eq!(LATENCY_BUCKETS[0], 0.000_25);
        assert_eq!(LATENCY_BUCKETS[16], 0.000_25 * 65_536.0);
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[1] == w[0] * 2.0));
    }
}
