//! Label sets, built once per call of `Metrics` and shared by the metrics
//! it records and by both exports. A code is kept as the `&'static str` it
//! is; only a configured name is copied, once.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};

/// The most labels a metric has: `provider` and one code.
pub(super) const MAX_LABELS: usize = 2;

/// One label's value.
#[derive(Clone, Copy, Debug)]
pub(super) enum Value<'a> {
    /// One of a fixed set of codes (`forwarded`, `claim`, `payload_mismatch`).
    Code(&'static str),
    /// A configured name, such as a provider's.
    Name(&'a str),
    /// A position in a configured list, spelled in decimal.
    Index(usize),
}

/// The first indexes, which need no copy.
const INDEXES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

impl Value<'_> {
    /// The value to keep past the call: codes and the first indexes are not
    /// copied.
    #[inline]
    pub fn to_static(self) -> Cow<'static, str> {
        match self {
            Self::Code(code) => Cow::Borrowed(code),
            Self::Name(name) => Cow::Owned(name.to_owned()),
            Self::Index(index) => match INDEXES.get(index) {
                Some(spelled) => Cow::Borrowed(spelled),
                None => spell(index),
            },
        }
    }
}

#[cold]
fn spell(index: usize) -> Cow<'static, str> {
    Cow::Owned(index.to_string())
}

/// A metric's label values, with the names they go with; also the key of a
/// Prometheus series. Equal and hashed by the values only: a set is only
/// compared with those of its own metric, which have the same names.
#[derive(Clone, Debug)]
pub(super) struct Labels {
    names: &'static [&'static str],
    /// The values of `names`, then padding.
    values: [Cow<'static, str>; MAX_LABELS],
}

impl Labels {
    /// Built by `Metric::labels`, which takes the names from the catalog.
    pub(super) fn new<const N: usize>(
        names: &'static [&'static str],
        values: [Value<'_>; N],
    ) -> Self {
        const { assert!(N <= MAX_LABELS, "raise MAX_LABELS") };
        let mut kept = [const { Cow::Borrowed("") }; MAX_LABELS];
        for (slot, value) in kept.iter_mut().zip(values) {
            *slot = value.to_static();
        }
        Self {
            names,
            values: kept,
        }
    }

    /// For a metric without labels.
    pub fn none() -> Self {
        Self::new(&[], [])
    }

    pub fn names(&self) -> &'static [&'static str] {
        self.names
    }

    /// The values, padded to [`MAX_LABELS`]: only the first `names().len()`
    /// are the metric's.
    pub fn padded(&self) -> &[Cow<'static, str>; MAX_LABELS] {
        &self.values
    }

    /// `(name, value)` pairs, in the catalog's order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.names
            .iter()
            .copied()
            .zip(self.values.iter().map(|v| v.as_ref()))
    }

    fn values(&self) -> &[Cow<'static, str>] {
        &self.values[..self.names.len()]
    }
}

impl PartialEq for Labels {
    fn eq(&self, other: &Self) -> bool {
        // A code is mostly the same literal: equal without reading it.
        let same = |(a, b): (&Cow<str>, &Cow<str>)| {
            a.len() == b.len() && (a.as_ptr() == b.as_ptr() || a == b)
        };
        self.values().iter().zip(other.values()).all(same)
    }
}

impl Eq for Labels {}

impl Hash for Labels {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Value by value: a slice would hash its length too, the same for all.
        for value in self.values() {
            value.hash(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_small_indexes_are_kept_without_a_copy() {
        assert!(matches!(
            Value::Code("claim").to_static(),
            Cow::Borrowed("claim")
        ));
        assert!(matches!(Value::Index(9).to_static(), Cow::Borrowed("9")));
        assert_eq!(Value::Index(23).to_static(), "23");
        assert!(matches!(Value::Name("stripe").to_static(), Cow::Owned(_)));
    }

    #[test]
    fn a_set_pairs_each_name_with_its_value() {
        let labels = Labels::new(&["provider", "secret"], [Value::Name("x"), Value::Index(1)]);
        let pairs: Vec<_> = labels.iter().collect();
        assert_eq!(pairs, [("provider", "x"), ("secret", "1")]);
        assert_eq!(Labels::none().iter().count(), 0);
    }
}
