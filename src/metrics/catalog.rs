//! Every metric the gate exports, declared once. Both exports build their
//! instruments from [`ALL`] and record by these entries, so a name, a help
//! text, a label or a bucket cannot differ between `/metrics` and OTLP.
//!
//! A new metric is an entry here and a method on `Metrics` that records it.

use std::marker::PhantomData;
use std::time::Duration;

use super::labels::{Key, Value};

/// How an export builds and records a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Only goes up; its name ends in `_total`.
    Counter,
    /// Counts observations into `buckets`.
    Histogram,
    /// The latest value set.
    Gauge,
}

/// What an export needs to know of a metric.
#[derive(Debug)]
pub(super) struct Descriptor {
    /// Position in [`ALL`], where each export keeps the metric's instrument.
    pub index: usize,
    /// The exposed name, as SPEC section 6 writes it.
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// Label names, in the order `Metric::labels` takes their values.
    pub labels: &'static [&'static str],
    /// Upper bounds of a histogram's buckets; empty for other kinds.
    pub buckets: &'static [f64],
}

impl Descriptor {
    /// The unit as OTLP carries it: Prometheus names end in it instead.
    pub fn unit(&self) -> &'static str {
        if self.name.ends_with("_seconds") {
            "s"
        } else {
            ""
        }
    }
}

/// A declared metric, typed by its kind so that `Metrics` can only add to
/// a counter, observe a histogram and set a gauge.
pub(super) struct Metric<K> {
    pub descriptor: Descriptor,
    kind: PhantomData<K>,
}

/// Kinds as types, for [`Metric`].
pub(super) enum Counter {}
pub(super) enum Histogram {}
pub(super) enum Gauge {}

/// One value to record into a metric.
#[derive(Clone, Copy, Debug)]
pub(super) enum Measurement {
    Add(&'static Descriptor, u64),
    Observe(&'static Descriptor, f64),
    Set(&'static Descriptor, u64),
}

impl Measurement {
    pub fn metric(&self) -> &'static Descriptor {
        match *self {
            Self::Add(metric, _) | Self::Observe(metric, _) | Self::Set(metric, _) => metric,
        }
    }
}

impl<K> Metric<K> {
    const fn new(descriptor: Descriptor) -> Self {
        Self {
            descriptor,
            kind: PhantomData,
        }
    }

    /// The label set for these values, given in the order of the names.
    pub fn labels<'a, const N: usize>(&self, values: [Value<'a>; N]) -> Key<'a> {
        debug_assert_eq!(N, self.descriptor.labels.len(), "{}", self.descriptor.name);
        Key::new(self.descriptor.labels, values)
    }
}

impl Metric<Counter> {
    pub fn add(&'static self, n: u64) -> Measurement {
        Measurement::Add(&self.descriptor, n)
    }
}

impl Metric<Histogram> {
    /// Histograms hold durations, in seconds.
    pub fn observe(&'static self, elapsed: Duration) -> Measurement {
        Measurement::Observe(&self.descriptor, elapsed.as_secs_f64())
    }
}

impl Metric<Gauge> {
    pub fn set(&'static self, value: u64) -> Measurement {
        Measurement::Set(&self.descriptor, value)
    }
}

/// Latency buckets in seconds, from 0.25 ms doubling to about 16 s.
pub(super) const LATENCY_BUCKETS: [f64; 17] = doubling(0.000_25);

/// Accept-to-delivery buckets in seconds: 0.1 s doubling to about 58 h,
/// past the 3 days a job may wait at the most by default.
pub(super) const QUEUE_BUCKETS: [f64; 22] = doubling(0.1);

/// `N` bucket bounds, from `first` doubling.
const fn doubling<const N: usize>(first: f64) -> [f64; N] {
    let mut buckets = [first; N];
    let mut i = 1;
    while i < N {
        buckets[i] = buckets[i - 1] * 2.0;
        i += 1;
    }
    buckets
}

/// Declares each metric as a `static` [`Metric`] and lists them all in
/// [`ALL`], in the order both exports register them.
macro_rules! catalog {
    (@buckets) => { &[] };
    (@buckets $buckets:expr) => { &$buckets };
    ($(
        $id:ident: $kind:ident {
            name: $name:literal,
            help: $help:literal,
            labels: [$($label:literal),* $(,)?],
            $(buckets: $buckets:expr,)?
        }
    )*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        enum Index { $($id),* }

        $(
            pub(super) static $id: Metric<$kind> = Metric::new(Descriptor {
                index: Index::$id as usize,
                name: $name,
                help: $help,
                kind: Kind::$kind,
                labels: &[$($label),*],
                buckets: catalog!(@buckets $($buckets)?),
            });
        )*

        /// Every metric, in the order of their `index`.
        pub(super) static ALL: &[&Descriptor] = &[$(&$id.descriptor),*];
    };
}

catalog! {
    DELIVERIES: Counter {
        name: "hookgate_deliveries_total",
        help: "Deliveries by provider and outcome",
        labels: ["provider", "outcome"],
    }
    REQUEST_DURATION: Histogram {
        name: "hookgate_request_duration_seconds",
        help: "Time from the request head to the answer, by provider and outcome",
        labels: ["provider", "outcome"],
        buckets: LATENCY_BUCKETS,
    }
    UPSTREAM_DURATION: Histogram {
        name: "hookgate_upstream_duration_seconds",
        help: "Time the application took to answer a delivery",
        labels: ["provider"],
        buckets: LATENCY_BUCKETS,
    }
    STORE_DURATION: Histogram {
        name: "hookgate_store_operation_duration_seconds",
        help: "Dedupe store operations by backend and operation",
        labels: ["backend", "operation"],
        buckets: LATENCY_BUCKETS,
    }
    SECRET_MATCHES: Counter {
        name: "hookgate_secret_matches_total",
        help: "Verified deliveries by the index of the secret that matched",
        labels: ["provider", "secret"],
    }
    MARK_RETRIES: Counter {
        name: "hookgate_mark_retries_total",
        help: "Background retries of a failed completion mark",
        labels: ["provider"],
    }
    ANOMALIES: Counter {
        name: "hookgate_anomalies_total",
        help: "Deliveries a sender should never make, by kind (payload_mismatch)",
        labels: ["provider", "kind"],
    }
    // Queue mode (SPEC section 1b).
    QUEUE_DEPTH: Gauge {
        name: "hookgate_queue_depth",
        help: "Queue-mode jobs by provider and state (pending, leased, dead)",
        labels: ["provider", "state"],
    }
    QUEUE_OLDEST_PENDING: Gauge {
        name: "hookgate_queue_oldest_pending_seconds",
        help: "Age of the oldest pending queue-mode job (0: none)",
        labels: ["provider"],
    }
    RELAY_ATTEMPTS: Counter {
        name: "hookgate_relay_attempts_total",
        help: "Relay attempts by provider and outcome (delivered, retry, dead)",
        labels: ["provider", "outcome"],
    }
    ACCEPT_TO_DELIVERY: Histogram {
        name: "hookgate_accept_to_delivery_seconds",
        help: "Time from a queue-mode accept to the app's 2xx",
        labels: ["provider"],
        buckets: QUEUE_BUCKETS,
    }
    DEAD_LETTERS: Counter {
        name: "hookgate_dead_letters_total",
        help: "Queue-mode jobs moved to the dead letter",
        labels: ["provider"],
    }
    // The postgres store's partition maintenance (set only on that backend).
    // Claim latency is `hookgate_store_operation_duration_seconds`.
    POSTGRES_ESTIMATED_ROWS: Gauge {
        name: "hookgate_postgres_estimated_rows",
        help: "Rows in processed_events, from the planner's statistics",
        labels: [],
    }
    POSTGRES_OLDEST_PARTITION_AGE: Gauge {
        name: "hookgate_postgres_oldest_partition_age_seconds",
        help: "Age of the oldest processed_events partition's first day",
        labels: [],
    }
    POSTGRES_PARTITIONS_AHEAD: Gauge {
        name: "hookgate_postgres_partitions_ahead",
        help: "Daily partitions provisioned after today",
        labels: [],
    }
    POSTGRES_LAST_MAINTENANCE: Gauge {
        name: "hookgate_postgres_last_maintenance_timestamp_seconds",
        help: "When partition maintenance last succeeded (Unix time; 0: never)",
        labels: [],
    }
}

#[cfg(test)]
mod tests {
    use super::super::labels::MAX_LABELS;
    use super::*;

    #[test]
    fn latency_buckets_double_from_a_quarter_millisecond() {
        assert_eq!(LATENCY_BUCKETS[0], 0.000_25);
        assert_eq!(LATENCY_BUCKETS[16], 0.000_25 * 65_536.0);
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[1] == w[0] * 2.0));
    }

    #[test]
    fn every_entry_follows_the_naming_rules() {
        for (i, d) in ALL.iter().enumerate() {
            assert_eq!(d.index, i, "{}", d.name);
            assert!(d.name.starts_with("hookgate_"), "{}", d.name);
            assert_eq!(
                d.name.ends_with("_total"),
                d.kind == Kind::Counter,
                "{}",
                d.name
            );
            assert_eq!(
                !d.buckets.is_empty(),
                d.kind == Kind::Histogram,
                "{}",
                d.name
            );
            assert!(d.labels.len() <= MAX_LABELS, "{}", d.name);
            assert!(!d.help.ends_with('.'), "prometheus-client adds the period");
        }
        let mut names: Vec<_> = ALL.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a name is declared twice");
    }
}
