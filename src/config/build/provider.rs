//! The `[providers.*]` sections: each provider's scheme, secrets, key and
//! dedupe overrides.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};

use super::{Issues, duration, header, rate};
use crate::config::file::{KeyFile, ProviderFile, SchemeKind, SecretFile};
use crate::key::KeySource;
use crate::provider::{Algorithm, Encoding, HmacScheme, Scheme, Template, TwilioScheme};
use crate::secret::{SecretSource, SecretSpec};
use crate::settings::{
    DedupeSettings, FingerprintMode, OnMismatch, OnMissingKey, ProviderSettings,
};

pub(super) fn providers(
    i: &mut Issues,
    files: &BTreeMap<String, ProviderFile>,
    dedupe: &DedupeSettings,
) -> Vec<ProviderSettings> {
    let mut paths: BTreeMap<String, &str> = BTreeMap::new();
    let mut out = Vec::new();
    for (name, p) in files {
        let at = |k: &str| format!("providers.{name}.{k}");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            i.push(
                format!("providers.{name}"),
                "provider names use lower-case letters, digits, `_` and `-`",
            );
        }
        // Routing compares canonical paths (crate::route), so two spellings
        // of one path are one path.
        match p
            .path
            .as_deref()
            .map(|path| crate::route::plain(path).and_then(crate::route::canonical))
        {
            None => i.push(
                at("path"),
                "required: the path the sender posts to, like \"/webhooks/stripe\"",
            ),
            Some(Err(e)) => i.push(at("path"), format!("must be a URL path: {e}")),
            Some(Ok(canonical)) => {
                if let Some(other) = paths.insert(canonical.to_ascii_lowercase(), name) {
                    i.push(
                        at("path"),
                        format!("already used by provider {other} (paths are compared normalized)"),
                    );
                }
            }
        }

        // Without a scheme the checks below still run (every error at once);
        // those that depend on the scheme are skipped, and the placeholder
        // never leaves `build`, which fails.
        let known = scheme(i, name, p);
        let scheme = known.clone().unwrap_or(Scheme::Stripe);
        if p.secrets.is_empty() {
            i.push(at("secrets"), "at least one secret source is required");
        }
        let secrets = p
            .secrets
            .iter()
            .enumerate()
            .filter_map(|(n, s)| secret(i, &format!("{}[{n}]", at("secrets")), s))
            .collect();

        let tolerance = p
            .tolerance
            .as_deref()
            .map_or(Duration::from_secs(300), |t| {
                replay_window(i, &at("tolerance"), t)
            });
        let future_tolerance = p
            .future_tolerance
            .as_deref()
            .map_or(tolerance, |t| replay_window(i, &at("future_tolerance"), t));

        let key = key_source(i, &at("key"), p, known.as_ref());
        let on_missing_key = p
            .on_missing_key
            .unwrap_or(scheme.descriptor().on_missing_key);
        if key.is_none() && known.is_some() && on_missing_key == OnMissingKey::Reject {
            i.push(
                at("key"),
                "required: this scheme has no default key (set `key`, or on_missing_key = \"forward\")",
            );
        }
        let reject_status = p.reject_status.unwrap_or(400);
        let reject_status = match StatusCode::from_u16(reject_status) {
            Ok(s) if s.is_client_error() => s,
            _ => {
                i.push(at("reject_status"), "must be a 4xx status");
                StatusCode::BAD_REQUEST
            }
        };
        if let Some(Err(e)) = p.upstream_path.as_deref().map(crate::route::plain) {
            i.push(at("upstream_path"), format!("must be a URL path: {e}"));
        }
        let passthrough_methods = p
            .passthrough_methods
            .iter()
            .filter_map(
                |m| match Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                    Ok(Method::POST) => {
                        i.push(at("passthrough_methods"), "POST is always verified");
                        None
                    }
                    Ok(m) => Some(m),
                    Err(_) => {
                        i.push(at("passthrough_methods"), format!("`{m}` is not a method"));
                        None
                    }
                },
            )
            .collect();
        for pointer in &p.volatile_fields {
            if !pointer.starts_with('/') {
                i.push(at("volatile_fields"), "JSON pointers start with `/`");
            }
        }

        out.push(ProviderSettings {
            name: name.clone(),
            scheme,
            path: p.path.clone().unwrap_or_default(),
            mode: p.mode.unwrap_or_default(),
            secrets,
            tolerance,
            future_tolerance,
            key,
            on_missing_key,
            fingerprint: p.fingerprint.unwrap_or(FingerprintMode::Canonical),
            volatile_fields: p.volatile_fields.clone(),
            on_mismatch: p.on_mismatch.unwrap_or(OnMismatch::Reject),
            retention: p
                .retention
                .as_deref()
                .map_or(dedupe.retention, |r| duration(i, &at("retention"), r)),
            reject_status,
            rate_limit: p.rate_limit.and_then(|r| rate(i, &at("rate_limit"), r)),
            upstream_path: p.upstream_path.clone(),
            passthrough_methods,
            case_sensitive_path: p.case_sensitive_path,
        });
    }
    out
}

/// The provider's scheme; `None` when it is missing (reported here) or was
/// misspelt (reported when the file was read).
fn scheme(i: &mut Issues, name: &str, p: &ProviderFile) -> Option<Scheme> {
    let at = |k: &str| format!("providers.{name}.{k}");
    let Some(kind) = p.scheme else {
        i.push(
            at("scheme"),
            "required: one of `stripe`, `github`, `slack`, `twilio`, `sendgrid`, `shopify`, `standard`, `hmac`",
        );
        return None;
    };
    let hmac_keys = [
        ("signature_header", p.signature_header.is_some()),
        ("signature_prefix", p.signature_prefix.is_some()),
        ("encoding", p.encoding.is_some()),
        ("algorithm", p.algorithm.is_some()),
        ("timestamp_header", p.timestamp_header.is_some()),
        ("signed_payload", p.signed_payload.is_some()),
    ];
    if kind != SchemeKind::Hmac {
        for (k, _) in hmac_keys.iter().filter(|(_, set)| *set) {
            i.push(at(k), "only the hmac scheme takes this key");
        }
    }
    if kind != SchemeKind::Twilio && p.public_url.is_some() {
        i.push(at("public_url"), "only the twilio scheme takes this key");
    }
    Some(match kind {
        SchemeKind::Stripe => Scheme::Stripe,
        SchemeKind::Github => Scheme::Github,
        SchemeKind::Slack => Scheme::Slack,
        SchemeKind::Twilio => Scheme::Twilio(TwilioScheme {
            public_url: public_url(i, &at("public_url"), p.public_url.as_deref()),
        }),
        SchemeKind::Sendgrid => Scheme::Sendgrid,
        SchemeKind::Shopify => Scheme::Shopify,
        SchemeKind::Standard => Scheme::Standard,
        SchemeKind::Hmac => {
            let header_at = at("signature_header");
            let signature = match p.signature_header.as_deref() {
                Some(h) => header(i, &header_at, h),
                None => {
                    i.push(header_at, "required by the hmac scheme");
                    None
                }
            };
            let timestamp_header = p
                .timestamp_header
                .as_deref()
                .and_then(|h| header(i, &at("timestamp_header"), h));
            let default_template = if timestamp_header.is_some() {
                "{timestamp}.{body}"
            } else {
                "{body}"
            };
            let template_text = p.signed_payload.as_deref().unwrap_or(default_template);
            let template = Template::parse(template_text).unwrap_or_else(|e| {
                i.push(at("signed_payload"), e);
                Template::parse("{body}").expect("the fallback template parses")
            });
            if template.uses_timestamp() && timestamp_header.is_none() {
                i.push(
                    at("signed_payload"),
                    "uses {timestamp} but no timestamp_header is set",
                );
            }
            if timestamp_header.is_some() && !template.uses_timestamp() {
                // An unsigned timestamp can be rewritten by whoever replays
                // the delivery: checking it would only look like protection.
                i.push(
                    at("timestamp_header"),
                    "is set but signed_payload does not sign {timestamp}",
                );
            }
            Scheme::Hmac(HmacScheme {
                header: signature.unwrap_or(HeaderName::from_static("x-signature")),
                prefix: p.signature_prefix.clone().unwrap_or_default(),
                encoding: p.encoding.unwrap_or(Encoding::Hex),
                algorithm: p.algorithm.unwrap_or(Algorithm::Sha256),
                timestamp_header,
                template,
            })
        }
    })
}

fn key_source(
    i: &mut Issues,
    at: &str,
    p: &ProviderFile,
    scheme: Option<&Scheme>,
) -> Option<KeySource> {
    let specs = match &p.key {
        Some(KeyFile::One(one)) => vec![one.clone()],
        Some(KeyFile::Parts(parts)) => parts.clone(),
        None => {
            let default = scheme?.descriptor().key.as_ref()?;
            let mut source =
                KeySource::parse(&[default.source.to_owned()]).expect("default keys parse");
            for alias in default.aliases {
                source = source.or_header(HeaderName::from_static(alias));
            }
            if let Some(scope) = default.scope {
                source = source.scoped_by(HeaderName::from_static(scope));
            }
            return Some(source);
        }
    };
    KeySource::parse(&specs).map_err(|e| i.push(at, e)).ok()
}

/// The twilio scheme's `public_url`: the URL Twilio calls, which it signs.
/// Without a query, since the request's own query is appended to it.
fn public_url(i: &mut Issues, at: &str, text: Option<&str>) -> String {
    let Some(text) = text else {
        i.push(
            at,
            "required by the twilio scheme: the URL Twilio calls for this provider's path, like https://example.com/webhooks/twilio",
        );
        return String::new();
    };
    match text.parse::<Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https"))
                && uri.authority().is_some_and(|a| !a.host().is_empty()) =>
        {
            if text.contains('?') {
                i.push(
                    at,
                    "must not carry a query string: the request's own query is appended when verifying",
                );
            } else if text.contains('#') {
                i.push(at, "must not carry a fragment: Twilio does not sign one");
            }
        }
        _ => i.push(
            at,
            format!("`{text}` is not an http(s) URL like https://example.com/webhooks/twilio"),
        ),
    }
    text.to_owned()
}

pub(super) fn secret(i: &mut Issues, at: &str, entry: &SecretFile) -> Option<SecretSpec> {
    let (source, not_after) = match entry {
        SecretFile::Source(s) => (s.as_str(), None),
        SecretFile::Table(t) => (t.source.as_str(), t.not_after.as_deref()),
    };
    let source = SecretSource::parse(source)
        .map_err(|e| i.push(at, e))
        .ok()?;
    let not_after = match not_after {
        None => None,
        Some(t) => match humantime::parse_rfc3339_weak(t) {
            Ok(t) => Some(t),
            Err(_) => {
                i.push(
                    format!("{at}.not_after"),
                    "must be an RFC 3339 instant like 2026-12-31T00:00:00Z",
                );
                return None;
            }
        },
    };
    Some(SecretSpec { source, not_after })
}

/// The longest replay window (`tolerance`, `future_tolerance`) accepted.
/// The window covers clock skew and delivery delay (Stripe and Svix sign
/// each retry anew); past a week it outlasts every known provider's whole
/// retry window (3 days at the longest, `provider::Descriptor`). Bounded,
/// it also keeps the window check's seconds far inside an `i64`.
const MAX_TOLERANCE: Duration = Duration::from_secs(7 * 86400);

/// A replay window: a duration of at most `MAX_TOLERANCE`.
fn replay_window(i: &mut Issues, at: &str, text: &str) -> Duration {
    let window = duration(i, at, text);
    if window > MAX_TOLERANCE {
        i.push(
            at,
            format!(
                "`{text}` is longer than 7d: a replay window longer than a provider's retry \
                 window makes no sense (the longest known is Stripe's, 3 days)"
            ),
        );
        return MAX_TOLERANCE;
    }
    window
}
