//! Which provider a request path belongs to (SPEC section 1, routing).
//!
//! A web framework behind the gate routes `/webhooks//stripe/`,
//! `/webhooks/%73tripe` and `/Webhooks/Stripe;jsessionid=1` to the same
//! handler as `/webhooks/stripe`, so the gate must too: otherwise a forgery
//! spelled differently would be passed through unverified. Every request
//! path is read twice:
//!
//! - its *canonical* form, what any standard router agrees on: unreserved
//!   characters percent-decoded, `;` parameters dropped from each segment,
//!   empty and `.` segments dropped (repeated and trailing slashes), `..`
//!   resolved, and ASCII case folded unless the provider matches case. A
//!   canonical match is that provider's delivery.
//! - its *lenient* form, the most any framework might make of it: every
//!   escape decoded (twice-encoded too), `\` read as `/`, trailing dots,
//!   blanks and a file extension dropped, any case folded. A path that
//!   reaches a provider only this way is ambiguous and refused (`bad_path`),
//!   never passed through.
//!
//! Written here rather than taken from a crate: URL crates normalize whole
//! URLs to RFC 3986 (which keeps `//`, `;` and case), not the way routers
//! match paths, and the lenient reading is a guard no crate offers.

use std::collections::HashMap;

/// Where a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The delivery of the provider at this index.
    Provider(usize),
    /// It could reach a provider only through an ambiguous spelling.
    Refused,
    /// No provider can claim it: passthrough or `unknown_route`.
    Other,
}

/// A provider's path as the route table needs it.
pub struct RouteSpec<'a> {
    pub path: &'a str,
    /// Match ASCII case exactly instead of folding it.
    pub case_sensitive: bool,
}

/// The route table, built once from the providers' paths.
#[derive(Debug, Default)]
pub struct Routes {
    /// Canonical paths of case-sensitive providers.
    exact: HashMap<String, usize>,
    /// Canonical, case-folded paths of the others.
    folded: HashMap<String, usize>,
    /// Lenient forms of the case-sensitive providers' paths.
    lenient_exact: HashMap<String, usize>,
    /// Lenient, case-folded forms of the others.
    lenient_folded: HashMap<String, usize>,
}

/// Why a path has no canonical form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("a `%` is not followed by two hex digits")]
    BadEscape,
    #[error("the path does not start with `/`")]
    NotAbsolute,
}

impl Routes {
    /// The table for providers in index order. Paths are validated (and
    /// made unique) by the config; one without a canonical form is left out.
    pub fn new<'a>(specs: impl IntoIterator<Item = RouteSpec<'a>>) -> Self {
        let mut routes = Self::default();
        for (index, spec) in specs.into_iter().enumerate() {
            let Ok(canonical) = canonical(spec.path) else {
                continue;
            };
            if spec.case_sensitive {
                routes.exact.insert(canonical, index);
                routes
                    .lenient_exact
                    .insert(lenient(spec.path, false), index);
            } else {
                routes.folded.insert(canonical.to_ascii_lowercase(), index);
                routes
                    .lenient_folded
                    .insert(lenient(spec.path, true), index);
            }
        }
        routes
    }

    /// Routes a request path (without its query).
    pub fn route(&self, path: &str) -> Route {
        // A path spelled exactly as configured is already canonical: the
        // common case costs two lookups and no allocation.
        if let Some(&i) = self.folded.get(path).or_else(|| self.exact.get(path)) {
            return Route::Provider(i);
        }
        if let Ok(canonical) = canonical(path) {
            if let Some(&i) = self.exact.get(&canonical) {
                return Route::Provider(i);
            }
            if let Some(&i) = self.folded.get(&canonical.to_ascii_lowercase()) {
                return Route::Provider(i);
            }
        }
        let ambiguous = (!self.lenient_folded.is_empty()
            && self.lenient_folded.contains_key(&lenient(path, true)))
            || (!self.lenient_exact.is_empty()
                && self.lenient_exact.contains_key(&lenient(path, false)));
        if ambiguous {
            Route::Refused
        } else {
            Route::Other
        }
    }
}

/// The canonical form of a path, case preserved (see the module doc).
pub fn canonical(path: &str) -> Result<String, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let mut segments: Vec<String> = Vec::new();
    for raw in path.split('/') {
        let raw = raw.split(';').next().unwrap_or("");
        let segment = decode_unreserved(raw)?;
        match segment.as_str() {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    Ok(join(&segments))
}

/// The lenient form of a path (see the module doc), its case folded when
/// `fold_case`. Never fails: a `%` that starts no escape is dropped.
pub fn lenient(path: &str, fold_case: bool) -> String {
    let mut bytes = path.as_bytes().to_vec();
    // Twice-encoded (`%2573`) decodes in two rounds; a third changes nothing
    // a framework would do.
    for _ in 0..2 {
        bytes = decode_all(&bytes);
    }
    let text = String::from_utf8_lossy(&bytes);
    // Through upper case first: routers that compare case-insensitively
    // fold `ſ` to `S` and the Kelvin sign to `K`, which `to_lowercase` alone
    // leaves apart from `s` and `k`.
    let text = if fold_case {
        text.to_uppercase().to_lowercase()
    } else {
        text.into_owned()
    };
    let text = text.replace('\\', "/");
    let mut segments: Vec<String> = Vec::new();
    let parts: Vec<&str> = text.split('/').collect();
    let last = parts.len().saturating_sub(1);
    for (n, raw) in parts.into_iter().enumerate() {
        let raw = raw.split(';').next().unwrap_or("");
        let trim = |c: char| c.is_whitespace() || c.is_control() || c == '.';
        let mut segment = raw.trim_matches(|c: char| c.is_whitespace() || c.is_control());
        if segment == "." || segment == ".." {
            if segment == ".." {
                segments.pop();
            }
            continue;
        }
        segment = segment.trim_end_matches(trim);
        if n == last
            && let Some((stem, _extension)) = segment.rsplit_once('.')
            && !stem.is_empty()
        {
            segment = stem.trim_end_matches(trim);
        }
        if !segment.is_empty() {
            segments.push(segment.to_owned());
        }
    }
    join(&segments)
}

fn join(segments: &[String]) -> String {
    if segments.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(segments.iter().map(|s| s.len() + 1).sum());
    for segment in segments {
        out.push('/');
        out.push_str(segment);
    }
    out
}

/// Decodes escapes of unreserved characters (RFC 3986 section 2.3); other
/// escapes stay, with upper-case hex digits, so `%2f` and `%2F` agree and
/// an encoded slash never becomes a separator.
fn decode_unreserved(segment: &str) -> Result<String, PathError> {
    let bytes = segment.as_bytes();
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            // A path from `http::Uri` is ASCII; anything else is kept whole.
            let next = segment[i..].find('%').map_or(bytes.len(), |n| i + n);
            out.push_str(&segment[i..next]);
            i = next;
            continue;
        }
        let hi = bytes.get(i + 1).and_then(|b| hex(*b));
        let lo = bytes.get(i + 2).and_then(|b| hex(*b));
        let (Some(hi), Some(lo)) = (hi, lo) else {
            return Err(PathError::BadEscape);
        };
        let byte = hi << 4 | lo;
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(hi)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(lo)]));
        }
        i += 3;
    }
    Ok(out)
}

/// Decodes every valid escape and drops a `%` that starts none.
fn decode_all(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)?, hex(*bytes.get(i + 2)?)?)))
            .flatten();
        match escaped {
            Some((hi, lo)) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            None => {
                if bytes[i] != b'%' {
                    out.push(bytes[i]);
                }
                i += 1;
            }
        }
    }
    out
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Routes {
        Routes::new([
            RouteSpec {
                path: "/webhooks/stripe",
                case_sensitive: false,
            },
            RouteSpec {
                path: "/hooks/Exact",
                case_sensitive: true,
            },
        ])
    }

    /// Asserts that each of `paths` routes to `expected`, naming the one
    /// that does not.
    fn assert_routes(expected: Route, paths: &[&str]) {
        let routes = table();
        for path in paths {
            assert_eq!(routes.route(path), expected, "{path}");
        }
    }

    #[test]
    fn every_spelling_a_router_accepts_is_the_provider() {
        assert_routes(
            Route::Provider(0),
            &[
                "/webhooks/stripe",
                "/webhooks/stripe/",
                "/webhooks//stripe",
                "//webhooks/stripe",
                "/webhooks/./stripe",
                "/webhooks/x/../stripe",
                "/../webhooks/stripe",
                "/webhooks/%73tripe",
                "/webhooks/%2e/stripe",
                "/webhooks/x/%2E%2E/stripe",
                "/Webhooks/Stripe",
                "/WEBHOOKS/STRIPE/",
                "/webhooks/stripe;jsessionid=1",
                "/webhooks;a=b/stripe",
                "/webhooks/stripe/.",
                "/webhooks/stripe/x/..",
            ],
        );
    }

    #[test]
    fn ambiguous_spellings_are_refused() {
        assert_routes(
            Route::Refused,
            &[
                "/webhooks%2Fstripe",
                "/webhooks%2fstripe",
                "/webhooks/%2573tripe",
                "/webhooks\\stripe",
                "/webhooks%5Cstripe",
                "/webhooks/stripe.json",
                "/webhooks/stripe%00",
                "/webhooks/stripe%20",
                "/webhooks/stripe.",
                "/webhooks/stripe%",
                "/webhooks/st%zzripe/../stripe",
                "/hooks/Exact.json",
                "/webhooks/%C5%BFtripe",
                "/webhooks/stripe%3Bx=1",
                "/webhooks/stripe%09",
            ],
        );
    }

    #[test]
    fn case_sensitive_providers_match_case_after_normalizing() {
        assert_routes(
            Route::Provider(1),
            &["/hooks/Exact", "/hooks//Exact/", "/hooks/%45xact"],
        );
    }

    #[test]
    fn other_paths_are_left_alone() {
        assert_routes(
            Route::Other,
            &[
                "/",
                "/webhooks",
                "/webhooks/stripe/events",
                "/webhooks/stripes",
                "/health",
                "/static/100%",
                "/hooks/exact",
                "/HOOKS/EXACT",
                "*",
            ],
        );
    }

    #[test]
    fn canonical_form_is_idempotent_and_clean() {
        for path in ["/a//b/./c/../d/", "/%7e%41;x/%2f", "/", "//"] {
            let once = canonical(path).unwrap();
            assert_eq!(canonical(&once).unwrap(), once, "{path}");
        }
        assert_eq!(canonical("/a//b/./c/../d/").unwrap(), "/a/b/d");
        assert_eq!(canonical("/%7e%41;x/%2f").unwrap(), "/~A/%2F");
        assert_eq!(canonical("/x%4"), Err(PathError::BadEscape));
        assert_eq!(canonical("x"), Err(PathError::NotAbsolute));
    }
}
