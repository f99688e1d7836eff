//! The Prometheus text exposition on the admin listener's `/metrics`.
//!
//! Built on `prometheus-client`, the Prometheus project's own Rust client:
//! OpenTelemetry's Prometheus exporter is deprecated (its releases depend on
//! the unmaintained `prometheus` crate and its maintainers recommend OTLP
//! instead), so OTLP export (`otlp.rs`) uses the OpenTelemetry SDK and the
//! scrape endpoint uses this.
//!
//! A series is found in its family once per thread, then kept in the
//! thread's own map (`HOT`), found there by the call's borrowed label set:
//! a family finds a series by hashing an owned label set (SipHash, with
//! the provider's name copied into it) behind a lock that every core
//! takes, for each of the half-dozen measurements of a delivery.
//! prometheus-client offers no handle cheaper to reach than that, and a
//! series' handle records into the family's own series. The gate never
//! removes a series from a family (a handle kept here would go on counting
//! into one that `/metrics` no longer shows).

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::{Equivalent, HashMap};

use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};

use super::Recorder;
use super::catalog::{ALL, Descriptor, Kind, Measurement};
use super::labels::{Key, Labels};

/// The instruments behind `/metrics`.
pub struct Prometheus {
    registry: Registry,
    /// One per entry of the catalog, at its `index`.
    instruments: Vec<Instrument>,
    /// Tells this registry's series in `HOT` from another's (a test runs
    /// many gates in one process).
    id: usize,
}

/// Where a thread keeps a series it recorded into: by registry, metric
/// and labels.
struct Place {
    registry: usize,
    metric: usize,
    labels: Labels,
}

/// A place as a call looks for it: its labels borrowed, not copied.
struct Wanted<'k, 'a> {
    registry: usize,
    metric: usize,
    labels: &'k Key<'a>,
}

impl Hash for Place {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.registry, self.metric).hash(state);
        self.labels.hash(state);
    }
}

impl PartialEq for Place {
    fn eq(&self, other: &Self) -> bool {
        (self.registry, self.metric) == (other.registry, other.metric)
            && self.labels == other.labels
    }
}

impl Eq for Place {}

/// Hashed as the `Place` it is equivalent to (`Key` hashes as `Labels`).
impl Hash for Wanted<'_, '_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.registry, self.metric).hash(state);
        self.labels.hash(state);
    }
}

impl Equivalent<Place> for Wanted<'_, '_> {
    fn equivalent(&self, place: &Place) -> bool {
        (self.registry, self.metric) == (place.registry, place.metric)
            && self.labels.matches(&place.labels)
    }
}

/// A handle to one series of a family: it shares the family's counts.
enum Series {
    Counter(Counter),
    Histogram(Histogram),
    Gauge(Gauge),
}

/// Far more than a gate's series (each provider's outcomes, secrets and
/// queue states, the store's operations): a bound for the registries that
/// a process has dropped (tests), whose series the map then forgets.
const HOT_SERIES: usize = 4096;

thread_local! {
    static HOT: RefCell<HashMap<Place, Series>> = RefCell::new(HashMap::new());
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

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
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
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
    /// The series for `labels`, made if it is new.
    fn series(&self, labels: &Labels) -> Series {
        match self {
            Self::Counter(family) => Series::Counter(family.get_or_create_owned(labels)),
            Self::Histogram(family) => Series::Histogram(family.get_or_create_owned(labels)),
            Self::Gauge(family) => Series::Gauge(family.get_or_create_owned(labels)),
        }
    }

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
    fn record(&self, labels: &Key<'_>, measurements: &[Measurement]) {
        let kept = HOT.try_with(|hot| {
            let mut hot = hot.borrow_mut();
            for measurement in measurements {
                let metric = measurement.metric().index;
                let wanted = Wanted {
                    registry: self.id,
                    metric,
                    labels,
                };
                if let Some(series) = hot.get(&wanted) {
                    series.record(measurement);
                    continue;
                }
                let owned = labels.to_labels();
                let series = self.instruments[metric].series(&owned);
                series.record(measurement);
                if hot.len() == HOT_SERIES {
                    hot.clear();
                }
                let place = Place {
                    registry: self.id,
                    metric,
                    labels: owned,
                };
                hot.insert(place, series);
            }
        });
        if kept.is_err() {
            // The thread is ending and its map is gone (a delivery's record
            // dropped late): the family's own lookup.
            let owned = labels.to_labels();
            for measurement in measurements {
                let metric = measurement.metric().index;
                self.instruments[metric].series(&owned).record(measurement);
            }
        }
    }
}

impl Series {
    fn record(&self, measurement: &Measurement) {
        match (measurement, self) {
            (Measurement::Add(_, n), Self::Counter(counter)) => {
                counter.inc_by(*n);
            }
            (Measurement::Observe(_, value), Self::Histogram(histogram)) => {
                histogram.observe(*value);
            }
            (Measurement::Set(_, value), Self::Gauge(gauge)) => {
                gauge.set(i64::try_from(*value).unwrap_or(i64::MAX));
            }
            _ => unreachable!("{measurement:?}: the catalog types each metric by its kind"),
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

    /// Recorded again from the thread's map, a series counts on in its
    /// family; another registry on the same thread keeps counts of its own.
    #[test]
    fn a_kept_series_counts_into_its_own_registry() {
        let (first, second) = (Metrics::default(), Metrics::default());
        let provider = String::from("stripe");
        for _ in 0..3 {
            first.delivery(&provider, "forwarded", Duration::from_millis(3));
        }
        second.delivery("stripe", "forwarded", Duration::from_millis(3));
        first.delivery("stripe", "duplicate", Duration::from_millis(3));
        let (first, second) = (first.encode(), second.encode());
        for (text, line) in [
            (
                &first,
                "deliveries_total{provider=\"stripe\",outcome=\"forwarded\"} 3",
            ),
            (
                &first,
                "deliveries_total{provider=\"stripe\",outcome=\"duplicate\"} 1",
            ),
            (
                &first,
                "duration_seconds_count{provider=\"stripe\",outcome=\"forwarded\"} 3",
            ),
            (
                &second,
                "deliveries_total{provider=\"stripe\",outcome=\"forwarded\"} 1",
            ),
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(!second.contains("duplicate"), "{second}");
    }

    /// A series recorded once is found in the thread's map after, by the
    /// borrowed labels of the next call (they hash as the kept ones).
    #[test]
    fn a_series_is_found_by_the_next_calls_labels() {
        use super::super::catalog::DELIVERIES;
        use super::super::labels::Value;
        use super::{HOT, Wanted};
        let m = Metrics::default();
        let provider = String::from("stripe");
        m.delivery(&provider, "forwarded", Duration::from_millis(3));
        let labels = DELIVERIES.labels([Value::Name("stripe"), Value::Code("forwarded")]);
        let wanted = Wanted {
            registry: m.prometheus.id,
            metric: DELIVERIES.descriptor.index,
            labels: &labels,
        };
        assert!(HOT.with_borrow(|hot| hot.get(&wanted).is_some()));
        let other = DELIVERIES.labels([Value::Name("stripe"), Value::Code("duplicate")]);
        let unknown = Wanted {
            labels: &other,
            ..wanted
        };
        assert!(HOT.with_borrow(|hot| hot.get(&unknown).is_none()));
    }

    /// Past `HOT_SERIES` the thread's map starts over; nothing is lost.
    #[test]
    fn more_series_than_a_thread_keeps_are_all_counted() {
        let m = Metrics::default();
        let names: Vec<String> = (0..super::HOT_SERIES + 10)
            .map(|i| format!("p{i}"))
            .collect();
        for _ in 0..2 {
            for name in &names {
                m.upstream(name, Duration::from_millis(1));
            }
        }
        let text = m.encode();
        let lines: std::collections::HashSet<&str> = text.lines().collect();
        for name in &names {
            let line = format!("hookgate_upstream_duration_seconds_count{{provider=\"{name}\"}} 2");
            assert!(lines.contains(line.as_str()), "missing {line}");
        }
    }
}
