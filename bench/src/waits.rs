//! Where a gate row's time went, by the gate's own histograms: its
//! `/metrics` text read back after the row (the names in README.md,
//! Metrics). A CPU profile does not show waits; these do: each delivery's
//! wait for the store's claim and mark and for the app, against the whole
//! request.
//!
//! Written by hand: the text format's lines this needs are
//! `name_bucket{...le="x"...} n`, `name_sum{...} s` and `name_count{...} n`,
//! summed over every label set, and a parsing crate would be a dependency
//! for ten lines.

/// One histogram, summed over its label sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub count: f64,
    pub sum: f64,
    /// (upper bound in seconds, cumulative count), ascending.
    pub buckets: Vec<(f64, f64)>,
}

impl Histogram {
    /// The mean in milliseconds; `None` with no observation.
    pub fn mean_ms(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count * 1e3)
    }

    /// The share of observations above `bound` seconds, which must be one
    /// of the bucket bounds; `None` with no observation or no such bound.
    pub fn share_above(&self, bound: f64) -> Option<f64> {
        let (_, below) = self.buckets.iter().find(|(le, _)| *le == bound)?;
        (self.count > 0.0).then(|| 1.0 - below / self.count)
    }
}

/// A gate row's waits: the whole request, the store's claim and mark
/// (`complete`), and the app.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Waits {
    pub request: Histogram,
    pub claim: Histogram,
    pub complete: Histogram,
    pub upstream: Histogram,
}

impl Waits {
    /// Reads the histograms out of a `/metrics` text.
    pub fn parse(text: &str) -> Self {
        let of = |name: &str, filter: &str| histogram(text, name, filter);
        let store = "hookgate_store_operation_duration_seconds";
        Self {
            request: of("hookgate_request_duration_seconds", ""),
            claim: of(store, "operation=\"claim\""),
            complete: of(store, "operation=\"complete\""),
            upstream: of("hookgate_upstream_duration_seconds", ""),
        }
    }
}

/// The histogram `name`, summed over the label sets that contain `filter`.
fn histogram(text: &str, name: &str, filter: &str) -> Histogram {
    let mut h = Histogram::default();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let Some((series, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if !series.contains(filter) {
            continue;
        }
        // The suffix, then the labels or the value: a longer name that
        // starts with `name` is another metric.
        let is = |suffix: &str| {
            series
                .strip_prefix(suffix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
        };
        if is("_sum") {
            h.sum += value;
        } else if is("_count") {
            h.count += value;
        } else if is("_bucket")
            && let Some(le) = label(series, "le").and_then(|v| v.parse::<f64>().ok())
        {
            match h.buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, n)) => *n += value,
                None => h.buckets.push((le, value)),
            }
        }
    }
    h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    h
}

/// A label's value in `{a="x",b="y"}` (values with no quote in them).
fn label<'a>(series: &'a str, name: &str) -> Option<&'a str> {
    let labels = series.split_once('{')?.1.strip_suffix('}')?;
    labels.split(',').find_map(|pair| {
        let value = pair.strip_prefix(name)?.strip_prefix("=\"")?;
        value.strip_suffix('"')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE hookgate_store_operation_duration_seconds histogram
hookgate_store_operation_duration_seconds_sum{backend=\"sqlite\",operation=\"claim\"} 0.5
hookgate_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"claim\"} 1000
hookgate_store_operation_duration_seconds_bucket{le=\"0.00025\",backend=\"sqlite\",operation=\"claim\"} 900
hookgate_store_operation_duration_seconds_bucket{le=\"0.0005\",backend=\"sqlite\",operation=\"claim\"} 990
hookgate_store_operation_duration_seconds_bucket{le=\"+Inf\",backend=\"sqlite\",operation=\"claim\"} 1000
hookgate_store_operation_duration_seconds_sum{backend=\"sqlite\",operation=\"complete\"} 0.25
hookgate_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"complete\"} 1000
hookgate_request_duration_seconds_sum{provider=\"stripe\",outcome=\"forwarded\"} 0.3
hookgate_request_duration_seconds_count{provider=\"stripe\",outcome=\"forwarded\"} 1000
hookgate_request_duration_seconds_bucket{le=\"0.0005\",provider=\"stripe\",outcome=\"forwarded\"} 950
hookgate_request_duration_seconds_total_sum{provider=\"stripe\"} 9
hookgate_request_duration_seconds_bucket{role=\"0.0005\",provider=\"stripe\"} 7
hookgate_request_duration_seconds_sum{provider=\"stripe\",outcome=\"duplicate\"} 0.1
hookgate_request_duration_seconds_count{provider=\"stripe\",outcome=\"duplicate\"} 1000
hookgate_request_duration_seconds_bucket{le=\"0.0005\",provider=\"stripe\",outcome=\"duplicate\"} 1000
";

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn histograms_are_read_and_summed_over_label_sets() {
        let w = Waits::parse(TEXT);
        assert_eq!(w.claim.count, 1000.0);
        assert!(close(w.claim.mean_ms(), 0.5));
        assert!(close(w.claim.share_above(0.0005), 0.01));
        assert_eq!(w.claim.share_above(0.001), None);
        assert_eq!(w.claim.buckets.len(), 3, "+Inf included");
        assert!(close(w.complete.mean_ms(), 0.25));
        assert!(w.complete.buckets.is_empty());
        // Two outcomes' series, summed; another metric whose name starts
        // with this one's left out; `le`, not a label ending in it.
        assert_eq!(w.request.count, 2000.0);
        assert!(close(w.request.mean_ms(), 0.2));
        assert!(close(w.request.share_above(0.0005), 0.025));
        assert_eq!(w.upstream, Histogram::default());
        assert_eq!(w.upstream.mean_ms(), None);
    }
}
