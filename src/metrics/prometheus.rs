//! The Prometheus text exposition on the admin listener's `/metrics`.
//!
//! Built on `prometheus-client`, the Prometheus project's own Rust client:
//! OpenTelemetry's Prometheus exporter is deprecated (its releases depend on
//! the unmaintained `prometheus` crate and its maintainers recommend OTLP
//! instead), so OTLP export (`otlp.rs`) uses the OpenTelemetry SDK and the
//! scrape endpoint uses this.

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

use super::Recorder;
use super::catalog::{ALL, Descriptor, Kind, Measurement};
use super::labels::Labels;

/// The instruments behind `/metrics`.
pub struct Prometheus {
    registry: Registry,
    /// One per entry of the catalog, at its `index`.
    instruments: Vec<Instrument>,
}

/// A family of series, one per label set recorded. A metric without labels
/// has its one series from the start, so it reads 0 until recorded.
enum Instrument {
    Counter(Family<Labels, Counter>),
    Histogram(Family<Labels, Histogram, Buckets>),
    Gauge(Family<Labels, Gauge>),
}

impl EncodeLabelSet for Labels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        for label in self.iter() {
            label.encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// Builds each new series of a histogram family with the declared buckets.
#[derive(Clone, Debug)]
struct Buckets(&'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

impl Default for Prometheus {
    fn default() -> Self {
        Self::new()
    }
}

impl Prometheus {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let instruments = ALL
            .iter()
            .map(|metric| Instrument::register(&mut registry, metric))
            .collect();
        Self {
            registry,
            instruments,
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

impl Instrument {
    fn register(registry: &mut Registry, metric: &Descriptor) -> Self {
        match metric.kind {
            Kind::Counter => Self::Counter(register(registry, metric, Family::default())),
            Kind::Histogram => {
                let buckets = Buckets(metric.buckets);
                Self::Histogram(register(
                    registry,
                    metric,
                    Family::new_with_constructor(buckets),
                ))
            }
            Kind::Gauge => Self::Gauge(register(registry, metric, Family::default())),
        }
    }
}

fn register<M, C>(
    registry: &mut Registry,
    metric: &Descriptor,
    family: Family<Labels, M, C>,
) -> Family<Labels, M, C>
where
    Family<Labels, M, C>: Metric + Clone,
    C: MetricConstructor<M>,
{
    // prometheus-client appends `_total` to counters.
    let name = metric.name.strip_suffix("_total").unwrap_or(metric.name);
    registry.register(name, metric.help, family.clone());
    if metric.labels.is_empty() {
        drop(family.get_or_create(&Labels::none()));
    }
    family
}

impl Recorder for Prometheus {
    fn record(&self, labels: &Labels, measurements: &[Measurement]) {
        for measurement in measurements {
            match (measurement, &self.instruments[measurement.metric().index]) {
                (Measurement::Add(_, n), Instrument::Counter(family)) => {
                    family.get_or_create(labels).inc_by(*n);
                }
                (Measurement::Observe(_, value), Instrument::Histogram(family)) => {
                    family.get_or_create(labels).observe(*value);
                }
                (Measurement::Set(_, value), Instrument::Gauge(family)) => {
                    family
                        .get_or_create(labels)
                        .set(i64::try_from(*value).unwrap_or(i64::MAX));
                }
                _ => unreachable!("{measurement:?}: the catalog types each metric by its kind"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Metrics;

    #[test]
    fn names_and_labels_match_the_contract() {
        let m = Metrics::default();
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
