//! Label sets. A call of `Metrics` builds a [`Key`], borrowed, shared by
//! the metrics it records and by both exports; a series kept past the call
//! holds [`Labels`], in which a code is kept as the `&'static str` it is and
//! only a configured name is copied.

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

/// A label set as a call gives it: nothing copied.
#[derive(Clone, Copy, Debug)]
pub(super) struct Key<'a> {
    names: &'static [&'static str],
    /// The values of `names`, then padding.
    values: [Value<'a>; MAX_LABELS],
}

impl<'a> Key<'a> {
    /// Built by `Metric::labels`, which takes the names from the catalog.
    pub(super) fn new<const N: usize>(
        names: &'static [&'static str],
        values: [Value<'a>; N],
    ) -> Self {
        const { assert!(N <= MAX_LABELS, "raise MAX_LABELS") };
        let mut padded = [Value::Code(""); MAX_LABELS];
        padded[..N].copy_from_slice(&values);
        Self {
            names,
            values: padded,
        }
    }

    /// For a metric without labels.
    pub fn none() -> Self {
        Self::new(&[], [])
    }

    pub fn names(&self) -> &'static [&'static str] {
        self.names
    }

    /// The set to keep past the call: a name is copied.
    pub fn to_labels(self) -> Labels {
        Labels {
            names: self.names,
            values: self.values.map(Value::to_static),
        }
    }

    /// Whether `labels` holds these values (both of one metric).
    pub fn matches(&self, labels: &Labels) -> bool {
        self.values()
            .iter()
            .zip(&labels.values)
            .all(|(value, kept)| value.is(kept))
    }

    fn values(&self) -> &[Value<'a>] {
        &self.values[..self.names.len()]
    }
}

/// Hashed as [`Labels`] with the same values is, so that a set kept past a
/// call can be found by a key.
impl Hash for Key<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for value in self.values() {
            value.spelled(|spelled| spelled.hash(state));
        }
    }
}

/// The first indexes, which need no copy.
const INDEXES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

impl Value<'_> {
    /// Whether `kept` spells this value.
    fn is(self, kept: &str) -> bool {
        match self {
            Self::Code(code) => same(code, kept),
            _ => self.spelled(|spelled| spelled == kept),
        }
    }

    /// `f` of the value as the exports spell it, without a copy.
    fn spelled<R>(self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            Self::Code(code) => f(code),
            Self::Name(name) => f(name),
            Self::Index(index) => f(itoa::Buffer::new().format(index)),
        }
    }

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

/// Equal strings; a code is mostly the same literal on both sides, equal
/// then without reading it.
#[inline]
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.as_ptr() == b.as_ptr() || a == b)
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
    /// For a metric without labels.
    pub fn none() -> Self {
        Key::none().to_labels()
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
        self.values()
            .iter()
            .zip(other.values())
            .all(|(a, b)| same(a, b))
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
        let key = Key::new(&["provider", "secret"], [Value::Name("x"), Value::Index(1)]);
        let labels = key.to_labels();
        let pairs: Vec<_> = labels.iter().collect();
        assert_eq!(pairs, [("provider", "x"), ("secret", "1")]);
        assert_eq!(Labels::none().iter().count(), 0);
    }

    #[test]
    fn a_key_matches_the_labels_that_spell_its_values() {
        const NAMES: &[&str] = &["provider", "outcome"];
        let kept = Key::new(NAMES, [Value::Name("stripe"), Value::Code("forwarded")]).to_labels();
        let stripe = String::from("stripe");
        let outcome = String::from("forwarded");
        let copy = Value::Code(Box::leak(outcome.into_boxed_str()));
        assert!(Key::new(NAMES, [Value::Name(&stripe), Value::Code("forwarded")]).matches(&kept));
        assert!(
            Key::new(NAMES, [Value::Name(&stripe), copy]).matches(&kept),
            "by value"
        );
        assert!(!Key::new(NAMES, [Value::Name("github"), Value::Code("forwarded")]).matches(&kept));
        assert!(!Key::new(NAMES, [Value::Name(&stripe), Value::Code("duplicate")]).matches(&kept));
        let secrets = Key::new(
            &["provider", "secret"],
            [Value::Name("x"), Value::Index(12)],
        );
        assert!(secrets.matches(&secrets.to_labels()));
        let other = Key::new(&["provider", "secret"], [Value::Name("x"), Value::Index(1)]);
        assert!(!other.matches(&secrets.to_labels()));
    }

    #[test]
    fn a_key_hashes_as_the_labels_it_matches() {
        use std::hash::BuildHasher;
        let hasher = std::hash::RandomState::new();
        let keys = [
            Key::new(
                &["provider", "outcome"],
                [Value::Name("stripe"), Value::Code("forwarded")],
            ),
            Key::new(&["provider", "secret"], [Value::Name("x"), Value::Index(3)]),
            Key::new(
                &["provider", "secret"],
                [Value::Name("x"), Value::Index(12)],
            ),
            Key::none(),
        ];
        for key in keys {
            assert_eq!(
                hasher.hash_one(key),
                hasher.hash_one(key.to_labels()),
                "{key:?}"
            );
        }
    }
}
