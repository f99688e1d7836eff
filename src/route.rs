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
//! - its *lenient* forms, the most any framework might make of it: every
//!   escape decoded (twice-encoded and IIS's `%u0073` too), `\` read as
//!   `/`, trailing dots, blanks and a file extension dropped, any case
//!   folded; `..` resolved both after empty segments are merged (most
//!   routers) and before (RFC 3986's algorithm, as Kestrel and the WHATWG
//!   URL parser do: `/webhooks//../stripe` is `/webhooks/stripe` there). A
//!   path that reaches a provider only this way is ambiguous and refused
//!   (`bad_path`), never passed through.
//! - what the app will be sent for a passed-through path: the upstream's
//!   base path before it. Read leniently, that must not reach the path the
//!   app is sent a provider's deliveries on (the provider's `upstream_path`,
//!   or `/../api/webhooks/stripe` climbing back into a base path of `/api`).
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
    /// Where the app is sent its deliveries, when not `path`.
    pub upstream_path: Option<&'a str>,
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
    /// The upstream's base path, which every forwarded path follows.
    base: String,
    /// Lenient forms of the paths the app is sent deliveries on, base
    /// included, where they differ from the provider's own (`lenient_*`
    /// already guards those); case folded unless the provider matches case.
    app_exact: HashMap<String, usize>,
    app_folded: HashMap<String, usize>,
}

/// Why a path has no canonical form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("a `%` is not followed by two hex digits")]
    BadEscape,
    #[error("the path does not start with `/`")]
    NotAbsolute,
    #[error("a request's path has no `?`, `#`, blank or control character")]
    NotPlain,
}

/// `path` if it can be a request's path, as a provider's `path` and
/// `upstream_path` must: a path with a query would never match a request
/// (whose path routing reads without its query), so its provider would be
/// left to passthrough, unverified.
pub fn plain(path: &str) -> Result<&str, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if path
        .chars()
        .any(|c| matches!(c, '?' | '#') || c.is_whitespace() || c.is_control())
    {
        return Err(PathError::NotPlain);
    }
    Ok(path)
}

impl Routes {
    /// The table for providers in index order, with `base`, the path of the
    /// upstream's URL. Paths are validated (and made unique) by the config;
    /// one without a canonical form is left out.
    pub fn new<'a>(base: &str, specs: impl IntoIterator<Item = RouteSpec<'a>>) -> Self {
        let base = base.trim_end_matches('/');
        let mut routes = Self {
            base: base.to_owned(),
            ..Self::default()
        };
        for (index, spec) in specs.into_iter().enumerate() {
            let Ok(canonical) = canonical(spec.path) else {
                continue;
            };
            let fold = !spec.case_sensitive;
            let (own, lenient_own) = if fold {
                (&mut routes.folded, &mut routes.lenient_folded)
            } else {
                (&mut routes.exact, &mut routes.lenient_exact)
            };
            own.insert(
                if fold {
                    canonical.to_ascii_lowercase()
                } else {
                    canonical
                },
                index,
            );
            lenient_own.insert(lenient(spec.path, fold), index);
            let app_path = [base, spec.upstream_path.unwrap_or(spec.path)].concat();
            if app_path != spec.path {
                let app = if fold {
                    &mut routes.app_folded
                } else {
                    &mut routes.app_exact
                };
                app.insert(lenient(&app_path, fold), index);
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
        let ambiguous = reaches(&self.lenient_folded, path, true)
            || reaches(&self.lenient_exact, path, false)
            || self.reaches_app(path);
        if ambiguous {
            Route::Refused
        } else {
            Route::Other
        }
    }

    /// Whether `path`, forwarded after the base path as passthrough sends
    /// it, reads leniently as a path the app is sent deliveries on.
    fn reaches_app(&self, path: &str) -> bool {
        if self.app_folded.is_empty() && self.app_exact.is_empty() {
            return false;
        }
        let forwarded = [self.base.as_str(), path].concat();
        reaches(&self.app_folded, &forwarded, true) || reaches(&self.app_exact, &forwarded, false)
    }
}

/// Whether either lenient form of `path` is in `table`.
fn reaches(table: &HashMap<String, usize>, path: &str, fold_case: bool) -> bool {
    !table.is_empty()
        && [Dots::AfterMerging, Dots::BeforeMerging]
            .into_iter()
            .any(|dots| table.contains_key(&lenient_as(path, fold_case, dots)))
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

/// When `..` is resolved against empty segments (`//`).
#[derive(Clone, Copy)]
enum Dots {
    /// Empty segments dropped first, so `..` removes the last named one.
    AfterMerging,
    /// RFC 3986's order: `..` removes the segment before it even if empty.
    BeforeMerging,
}

/// The lenient form of a path (see the module doc), its case folded when
/// `fold_case`, `..` resolved after empty segments are merged. Never fails:
/// a `%` that starts no escape is dropped.
pub fn lenient(path: &str, fold_case: bool) -> String {
    lenient_as(path, fold_case, Dots::AfterMerging)
}

fn lenient_as(path: &str, fold_case: bool, dots: Dots) -> String {
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
    let trim = |c: char| c.is_whitespace() || c.is_control() || c == '.';
    let mut segments: Vec<&str> = Vec::new();
    for raw in text.split('/') {
        let raw = raw.split(';').next().unwrap_or("");
        let segment = raw.trim_matches(|c: char| c.is_whitespace() || c.is_control());
        match segment {
            "." => {}
            ".." => {
                segments.pop();
            }
            _ => {
                let segment = segment.trim_end_matches(trim);
                if !segment.is_empty() || matches!(dots, Dots::BeforeMerging) {
                    segments.push(segment);
                }
            }
        }
    }
    segments.retain(|s| !s.is_empty());
    // The extension of the last segment, even with slashes after it: Rails
    // drops a trailing `/` before it reads a `(.:format)`.
    if let Some(last) = segments.last_mut()
        && let Some((stem, _extension)) = last.rsplit_once('.')
        && !stem.is_empty()
    {
        *last = stem.trim_end_matches(trim);
        if last.is_empty() {
            segments.pop();
        }
    }
    join(&segments)
}

fn join(segments: &[impl AsRef<str>]) -> String {
    if segments.is_empty() {
        return "/".to_owned();
    }
    let mut out = String::with_capacity(segments.iter().map(|s| s.as_ref().len() + 1).sum());
    for segment in segments {
        out.push('/');
        out.push_str(segment.as_ref());
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

/// Decodes every valid escape, IIS's `%uXXXX` too, and drops a `%` that
/// starts none.
fn decode_all(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let Some(c) = iis_escape(&bytes[i..]) {
            let mut utf8 = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
            i += 6;
            continue;
        }
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

/// The character of a `%uXXXX` escape at the start of `bytes`.
fn iis_escape(bytes: &[u8]) -> Option<char> {
    let [b'%', b'u' | b'U', digits @ ..] = bytes.get(..6)? else {
        return None;
    };
    let code = digits
        .iter()
        .try_fold(0u32, |code, d| Some(code << 4 | u32::from(hex(*d)?)))?;
    char::from_u32(code)
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Routes {
        Routes::new(
            "",
            [
                RouteSpec {
                    path: "/webhooks/stripe",
                    upstream_path: None,
                    case_sensitive: false,
                },
                RouteSpec {
                    path: "/hooks/Exact",
                    upstream_path: None,
                    case_sensitive: true,
                },
            ],
        )
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
                // Rails drops the trailing slash, then reads the format.
                "/webhooks/stripe.json/",
                "/webhooks//stripe.json//",
                // `..` before the empty segments merge (Kestrel, WHATWG).
                "/webhooks//../stripe",
                "/webhooks/stripe//..",
                "/webhooks//%2e%2e/stripe",
                // IIS's `%u` escapes.
                "/webhooks/%u0073tripe",
                "/webhooks/%U0053TRIPE",
                // An extension stripped down to nothing.
                "/webhooks/stripe/..json",
            ],
        );
    }

    /// What the app is sent for a passed-through path is the upstream's
    /// base path and the request's: read leniently, it must not reach the
    /// path the app gets a provider's deliveries on.
    #[test]
    fn a_passed_through_path_cannot_reach_the_apps_delivery_path() {
        let routes = Routes::new(
            "/api/",
            [
                RouteSpec {
                    path: "/webhooks/stripe",
                    upstream_path: None,
                    case_sensitive: false,
                },
                RouteSpec {
                    path: "/webhooks/github",
                    upstream_path: Some("/internal/github"),
                    case_sensitive: false,
                },
            ],
        );
        // Forwarded as `/api/../api/webhooks/stripe` and so on.
        for path in [
            "/../api/webhooks/stripe",
            "/%2e%2e/api/webhooks/stripe",
            "/x/../../api/webhooks/stripe/",
            "/internal/github",
            "/Internal/GitHub.json",
        ] {
            assert_eq!(routes.route(path), Route::Refused, "{path}");
        }
        assert_eq!(routes.route("/webhooks/github"), Route::Provider(1));
        for path in ["/health", "/api/webhooks/stripe", "/../internal/github"] {
            assert_eq!(
                routes.route(path),
                Route::Other,
                "/api{path} is no delivery path"
            );
        }

        let no_base = Routes::new(
            "",
            [RouteSpec {
                path: "/webhooks/github",
                upstream_path: Some("/internal/github"),
                case_sensitive: false,
            }],
        );
        for path in [
            "/internal/github",
            "/Internal//GitHub/",
            "/internal/github.json",
        ] {
            assert_eq!(no_base.route(path), Route::Refused, "{path}");
        }
        assert_eq!(no_base.route("/internal/other"), Route::Other);
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
