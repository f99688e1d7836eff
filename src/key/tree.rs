//! A JSON body parsed once into a tree that borrows its strings from the
//! body, for key lookups and the canonical fingerprint.
//!
//! Written out rather than using `serde_json::Value`, whose `BTreeMap` and
//! owned `String` per key and per string were most of the gate's own CPU on
//! a duplicate (docs/BENCHMARKS.md, finding 4). The tree keeps `Value`'s
//! meaning exactly: numbers are `serde_json::Number`, an object's entries
//! are sorted by key once, at parse time, and a repeated key keeps its last
//! value, as `Value`'s map does. The canonical bytes it writes are pinned by
//! a test and compared with `Value`'s by the fingerprint fuzz target, since
//! stored fingerprints must keep matching across an upgrade.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde_json::Number;

use crate::json_string::push_str;

/// A JSON value whose strings and keys borrow from the parsed text when
/// they have no escapes.
#[derive(Clone, Debug, PartialEq)]
pub enum Node<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Node<'a>>),
    /// Sorted by key, each key once.
    Object(Vec<(Cow<'a, str>, Node<'a>)>),
}

impl<'a> Node<'a> {
    /// Parses a whole JSON text (serde_json's parser: its nesting limit,
    /// its refusal of trailing characters and of invalid escapes).
    ///
    /// The text's UTF-8 is checked once, whole, and serde_json's `str`
    /// reader then takes each string as it is. Its slice reader checks
    /// every string on its own: 56 strings in a 1 KiB Stripe event, 5,750
    /// instructions of a duplicate (callgrind; docs/BENCHMARKS.md, The
    /// overhead work). The same texts parse either way: the slice reader
    /// refuses invalid UTF-8 inside a string, and any byte above 0x7f
    /// outside one is not JSON.
    pub fn parse(text: &'a [u8]) -> Option<Self> {
        serde_json::from_str(std::str::from_utf8(text).ok()?).ok()
    }

    /// The value at an RFC 6901 pointer, resolved as `Value::pointer` does.
    pub fn pointer(&self, pointer: &str) -> Option<&Node<'a>> {
        tokens(pointer)?.try_fold(self, |target, token| match target {
            Node::Object(entries) => find(entries, &token).map(|i| &entries[i].1),
            Node::Array(items) => array_index(&token).and_then(|i| items.get(i)),
            _ => None,
        })
    }

    fn pointer_mut(&mut self, pointer: &str) -> Option<&mut Node<'a>> {
        tokens(pointer)?.try_fold(self, |target, token| match target {
            Node::Object(entries) => find(entries, &token).map(|i| &mut entries[i].1),
            Node::Array(items) => array_index(&token).and_then(|i| items.get_mut(i)),
            _ => None,
        })
    }

    /// Removes the value at an RFC 6901 pointer, if present.
    pub fn remove(&mut self, pointer: &str) {
        let Some((parent, last)) = pointer.rsplit_once('/') else {
            return;
        };
        let last = unescape_token(last);
        match self.pointer_mut(parent) {
            Some(Node::Object(entries)) => {
                if let Some(i) = find(entries, &last) {
                    entries.remove(i);
                }
            }
            // `usize::from_str`, not the pointer's stricter index rule: the
            // fingerprints stored so far were computed this way.
            Some(Node::Array(items)) => {
                if let Ok(i) = last.parse::<usize>()
                    && i < items.len()
                {
                    items.remove(i);
                }
            }
            _ => {}
        }
    }

    /// Writes the value with object keys sorted and no whitespace; strings
    /// and numbers exactly as serde_json writes `Value`'s.
    pub fn write_canonical(&self, out: &mut Vec<u8>) {
        // Serializing into a Vec cannot fail.
        match self {
            Node::Null => out.extend_from_slice(b"null"),
            Node::Bool(true) => out.extend_from_slice(b"true"),
            Node::Bool(false) => out.extend_from_slice(b"false"),
            Node::Number(n) => {
                let _ = serde_json::to_writer(&mut *out, n);
            }
            Node::String(s) => push_str(out, s),
            Node::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_canonical(out);
                }
                out.push(b']');
            }
            Node::Object(entries) => {
                out.push(b'{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    push_str(out, k);
                    out.push(b':');
                    v.write_canonical(out);
                }
                out.push(b'}');
            }
        }
    }

    /// A scalar's text as a key part: a string as is, a number or a boolean
    /// as JSON writes it; `None` for null, arrays and objects.
    pub fn key_text(&self) -> Option<Cow<'_, str>> {
        match self {
            Node::String(s) => Some(Cow::Borrowed(s.as_ref())),
            Node::Number(n) => Some(Cow::Owned(n.to_string())),
            Node::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
            _ => None,
        }
    }
}

fn find(entries: &[(Cow<'_, str>, Node<'_>)], key: &str) -> Option<usize> {
    entries.binary_search_by(|(k, _)| k.as_ref().cmp(key)).ok()
}

/// The reference tokens of an RFC 6901 pointer, unescaped: none for the
/// empty pointer (the whole document), `None` for one not starting at `/`.
fn tokens(pointer: &str) -> Option<impl Iterator<Item = Cow<'_, str>>> {
    let rest = match pointer {
        "" => None,
        _ => Some(pointer.strip_prefix('/')?),
    };
    Some(
        rest.into_iter()
            .flat_map(|r| r.split('/'))
            .map(unescape_token),
    )
}

fn unescape_token(token: &str) -> Cow<'_, str> {
    if token.contains('~') {
        Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(token)
    }
}

/// An array index as RFC 6901 (and `Value::pointer`) reads it: digits
/// without a sign or a leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

/// An object key, borrowed when the text has no escapes: serde's `borrow`
/// on a `Cow<str>` does exactly that (a plain `Cow` always owns).
#[derive(Deserialize)]
#[serde(transparent)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> Deserialize<'de> for Node<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Node<'de>, E> {
        Ok(Node::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Node<'de>, E> {
        Ok(Node::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Node<'de>, E> {
        Ok(Node::Number(n.into()))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Node<'de>, E> {
        Ok(Number::from_f64(n).map_or(Node::Null, Node::Number))
    }

    // Strings are borrowed or owned exactly as keys are (`Text`).
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Node<'de>, E> {
        Ok(Node::String(Cow::Owned(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node<'de>, A::Error> {
        let mut entries: Vec<(Cow<'de, str>, Node<'de>)> =
            Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
        while let Some(Text(key)) = map.next_key()? {
            entries.push((key, map.next_value()?));
        }
        // Stable, so equal keys stay in the body's order; `dedup_by` then
        // keeps the first of a run, given the last one's value.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                std::mem::swap(&mut later.1, &mut kept.1);
            }
            same
        });
        Ok(Node::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &[u8]) -> String {
        let mut out = Vec::new();
        Node::parse(text).unwrap().write_canonical(&mut out);
        String::from_utf8(out).unwrap()
    }

    /// Fingerprints are stored (sqlite, redis, postgres) and compared after
    /// an upgrade, so the canonical bytes must never change: pinned here,
    /// escapes, nesting and number forms included.
    #[test]
    fn canonical_bytes_are_stable() {
        let body = br#"{"z":[1,{"y":null,"x":true}],"\u00e9\n\"k":"v\u0001\/","a":1.50,"n":-0}"#;
        assert_eq!(
            canonical(body),
            "{\"a\":1.5,\"n\":-0.0,\"z\":[1,{\"x\":true,\"y\":null}],\"é\\n\\\"k\":\"v\\u0001/\"}"
        );
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_as_serde_json_does() {
        let body = br#"{"b":1,"a":2,"b":3,"a":{"x":4},"b":5}"#;
        assert_eq!(canonical(body), r#"{"a":{"x":4},"b":5}"#);
        let value: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(canonical(body), value.to_string());
    }

    #[test]
    fn strings_without_escapes_borrow_from_the_body() {
        let body = br#"{"id":"evt_1","e\u0073c":"a\nb"}"#;
        let node = Node::parse(body).unwrap();
        let Node::Object(entries) = &node else {
            panic!("an object")
        };
        let range = body.as_ptr_range();
        let borrowed =
            |s: &Cow<'_, str>| matches!(s, Cow::Borrowed(b) if range.contains(&b.as_ptr()));
        assert!(borrowed(&entries[1].0), "`id` is borrowed");
        assert!(matches!(&entries[1].1, Node::String(s) if borrowed(s)));
        assert!(!borrowed(&entries[0].0), "`esc` was unescaped");
    }

    #[test]
    fn pointers_resolve_as_serde_json_resolves_them() {
        let body = br#"{"a/b":{"~":[10,{"id":"x"}]},"n":0,"":{"":1}}"#;
        let node = Node::parse(body).unwrap();
        let value: serde_json::Value = serde_json::from_slice(body).unwrap();
        for pointer in [
            "",
            "/",
            "//",
            "/a~1b",
            "/a~1b/~0",
            "/a~1b/~0/1/id",
            "/a~1b/~0/01",
            "/a~1b/~0/+1",
            "/a~1b/~0/2",
            "/n",
            "/n/x",
            "n",
            "/missing",
        ] {
            let mut out = Vec::new();
            let found = node.pointer(pointer).map(|n| {
                n.write_canonical(&mut out);
                String::from_utf8(out).unwrap()
            });
            assert_eq!(
                found,
                value.pointer(pointer).map(|v| v.to_string()),
                "{pointer}"
            );
        }
    }

    #[test]
    fn removing_a_pointer_drops_the_field_or_element() {
        let mut node = Node::parse(br#"{"a":[1,2,3],"b":{"c":1,"d":2}}"#).unwrap();
        for pointer in ["/a/+1", "/b/c", "/b/missing", "/a/9", "nothing", "/x/y"] {
            node.remove(pointer);
        }
        let mut out = Vec::new();
        node.write_canonical(&mut out);
        assert_eq!(out, br#"{"a":[1,3],"b":{"d":2}}"#);
    }

    #[test]
    fn what_serde_json_refuses_is_refused() {
        for bad in [
            &b"{\"a\":1"[..],
            b"[1,]",
            b"{\"a\":1} x",
            b"\"\\ud800\"",
            b"\xff",
            b"[\"\xff\"]",
            b"[1]\xc3",
            b"{\"\xed\xa0\x80\":1}",
        ] {
            assert!(Node::parse(bad).is_none(), "{bad:?}");
            assert!(serde_json::from_slice::<serde_json::Value>(bad).is_err());
        }
        let accented = "{\"caf\u{e9}\":\"na\u{ef}ve \u{1f600}\"}";
        assert_eq!(
            Node::parse(accented.as_bytes()),
            Some(Node::Object(vec![(
                Cow::Borrowed("caf\u{e9}"),
                Node::String(Cow::Borrowed("na\u{ef}ve \u{1f600}"))
            )]))
        );
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(Node::parse(deep.as_bytes()).is_none(), "nesting is limited");
    }
}
