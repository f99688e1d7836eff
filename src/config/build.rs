//! Validation: from what the user wrote to the runtime [`Settings`],
//! reporting every problem at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};

use super::file::{BackendKind, KeyFile, ProviderFile, RateFile, SchemeKind, SecretFile};
use super::{ConfigErrors, ConfigFile, Issues};
use crate::key::KeySource;
use crate::provider::{Algorithm, Encoding, HmacScheme, Scheme, Template, TwilioScheme};
use crate::ratelimit::Rate;
use crate::secret::{SecretSource, SecretSpec};
use crate::settings::{
    DedupeSettings, FingerprintMode, OnMismatch, OnMissingKey, OtlpSettings, ProviderSettings,
    ServerSettings, Settings, TelemetrySettings, UpstreamSettings,
};
use crate::store::{BackendSettings, StoreSettings};
use crate::tls::TlsFiles;

pub(super) fn build(file: &ConfigFile, mut issues: Issues) -> Result<Settings, ConfigErrors> {
    let i = &mut issues;

    let s = &file.server;
    let server = ServerSettings {
        listen: addr(i, "server.listen", &s.listen),
        admin_listen: addr(i, "server.admin_listen", &s.admin_listen),
        max_body_bytes: s.max_body_bytes,
        read_timeout: duration(i, "server.read_timeout", &s.read_timeout),
        shutdown_grace: duration(i, "server.shutdown_grace", &s.shutdown_grace),
        client_ip_header: s
            .client_ip_header
            .as_deref()
            .and_then(|h| header(i, "server.client_ip_header", h)),
        per_source_rate_limit: s
            .per_source_rate_limit
            .and_then(|r| rate(i, "server.per_source_rate_limit", r)),
        max_connections: s.max_connections,
        max_header_bytes: s.max_header_bytes,
        tls: s.tls.as_ref().map(|t| TlsFiles {
            cert: PathBuf::from(&t.cert),
            key: PathBuf::from(&t.key),
        }),
    };
    if s.max_connections == 0 {
        i.push("server.max_connections", "must be greater than 0");
    }
    if s.max_header_bytes < 8192 {
        i.push("server.max_header_bytes", "must be at least 8192");
    }
    if s.max_body_bytes == 0 {
        i.push("server.max_body_bytes", "must be greater than 0");
    }

    let u = &file.upstream;
    let upstream = UpstreamSettings {
        url: upstream_url(i, &u.url),
        timeout: duration(i, "upstream.timeout", &u.timeout),
        passthrough: u.passthrough,
        ca_file: u.ca_file.as_ref().map(PathBuf::from),
        max_connections: u.max_connections,
    };
    if u.max_connections == 0 {
        i.push("upstream.max_connections", "must be greater than 0");
    }

    let st = &file.store;
    let backend = match st.backend {
        BackendKind::Sqlite => BackendSettings::Sqlite {
            path: PathBuf::from(&st.path),
        },
        BackendKind::Memory => BackendSettings::Memory {
            capacity: st.memory_capacity.max(1),
        },
        BackendKind::Postgres => match st.url.as_deref() {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                BackendSettings::Postgres {
                    url: url.to_owned(),
                    // Raised to the longest provider retention below.
                    retention: Duration::ZERO,
                }
            }
            Some(_) => {
                i.push(
                    "store.url",
                    "a postgres URL starts with postgres:// or postgresql://",
                );
                BackendSettings::Memory { capacity: 1 }
            }
            None => {
                i.push("store.url", "required when store.backend = \"postgres\"");
                BackendSettings::Memory { capacity: 1 }
            }
        },
        BackendKind::Redis => match st.url.as_deref() {
            Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                BackendSettings::Redis {
                    url: url.to_owned(),
                    prefix: st.prefix.clone(),
                }
            }
            Some(_) => {
                i.push("store.url", "a redis URL starts with redis:// or rediss://");
                BackendSettings::Memory { capacity: 1 }
            }
            None => {
                i.push("store.url", "required when store.backend = \"redis\"");
                BackendSettings::Memory { capacity: 1 }
            }
        },
    };
    let mut store = StoreSettings {
        backend,
        op_timeout: duration(i, "store.timeout", &st.timeout),
    };
    let dedupe = DedupeSettings {
        retention: duration(i, "store.retention", &st.retention),
        lease: duration(i, "store.lease", &st.lease),
        max_response_bytes: st.max_response_bytes,
    };
    if dedupe.lease <= upstream.timeout {
        i.push(
            "store.lease",
            format!(
                "must exceed upstream.timeout ({}), so that a live forward never loses its claim",
                humantime::format_duration(upstream.timeout)
            ),
        );
    }

    let t = &file.telemetry;
    let telemetry = TelemetrySettings {
        otlp: t.otlp_endpoint.as_deref().map(|endpoint| OtlpSettings {
            endpoint: otlp_endpoint(i, endpoint),
            interval: duration(i, "telemetry.otlp_interval", &t.otlp_interval),
            timeout: duration(i, "telemetry.otlp_timeout", &t.otlp_timeout),
        }),
    };

    let providers = providers(i, &file.providers, &dedupe);
    if let BackendSettings::Postgres { retention, .. } = &mut store.backend {
        *retention = providers
            .iter()
            .map(|p| p.retention)
            .fold(dedupe.retention, Duration::max);
    }

    if issues.0.is_empty() {
        Ok(Settings {
            server,
            upstream,
            store,
            dedupe,
            telemetry,
            faults: Default::default(),
            providers,
        })
    } else {
        Err(ConfigErrors(issues.0))
    }
}

fn providers(
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
        match crate::route::canonical(&p.path) {
            Err(e) => i.push(at("path"), format!("must be a URL path: {e}")),
            Ok(canonical) => {
                if let Some(other) = paths.insert(canonical.to_ascii_lowercase(), name) {
                    i.push(
                        at("path"),
                        format!("already used by provider {other} (paths are compared normalized)"),
                    );
                }
            }
        }

        let scheme = scheme(i, name, p);
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

        let key = key_source(i, &at("key"), p, &scheme);
        let on_missing_key = p
            .on_missing_key
            .unwrap_or(scheme.descriptor().on_missing_key);
        if key.is_none() && on_missing_key == OnMissingKey::Reject {
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
        if let Some(up) = &p.upstream_path
            && !up.starts_with('/')
        {
            i.push(at("upstream_path"), "must start with `/`");
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
            path: p.path.clone(),
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

fn scheme(i: &mut Issues, name: &str, p: &ProviderFile) -> Scheme {
    let at = |k: &str| format!("providers.{name}.{k}");
    let hmac_keys = [
        ("signature_header", p.signature_header.is_some()),
        ("signature_prefix", p.signature_prefix.is_some()),
        ("encoding", p.encoding.is_some()),
        ("algorithm", p.algorithm.is_some()),
        ("timestamp_header", p.timestamp_header.is_some()),
        ("signed_payload", p.signed_payload.is_some()),
    ];
    if p.scheme != SchemeKind::Hmac {
        for (k, _) in hmac_keys.iter().filter(|(_, set)| *set) {
            i.push(at(k), "only the hmac scheme takes this key");
        }
    }
    if p.scheme != SchemeKind::Twilio && p.public_url.is_some() {
        i.push(at("public_url"), "only the twilio scheme takes this key");
    }
    match p.scheme {
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
    }
}

fn key_source(i: &mut Issues, at: &str, p: &ProviderFile, scheme: &Scheme) -> Option<KeySource> {
    let specs = match &p.key {
        Some(KeyFile::One(one)) => vec![one.clone()],
        Some(KeyFile::Parts(parts)) => parts.clone(),
        None => {
            let default = scheme.descriptor().key.as_ref()?;
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

fn secret(i: &mut Issues, at: &str, entry: &SecretFile) -> Option<SecretSpec> {
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

pub(super) fn duration(i: &mut Issues, at: &str, text: &str) -> Duration {
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => d,
        Ok(_) => {
            i.push(at, "must be greater than zero");
            Duration::from_secs(1)
        }
        Err(_) => {
            i.push(
                at,
                format!("`{text}` is not a duration (write \"300ms\", \"30s\", \"5m\" or \"4d\")"),
            );
            Duration::from_secs(1)
        }
    }
}

fn rate(i: &mut Issues, at: &str, r: RateFile) -> Option<Rate> {
    let per_second = NonZeroU32::new(r.per_second);
    let burst = NonZeroU32::new(r.burst.unwrap_or(r.per_second));
    match (per_second, burst) {
        (Some(per_second), Some(burst)) => Some(Rate { per_second, burst }),
        _ => {
            i.push(at, "per_second and burst must be greater than zero");
            None
        }
    }
}

fn addr(i: &mut Issues, at: &str, text: &str) -> SocketAddr {
    text.parse().unwrap_or_else(|_| {
        i.push(at, format!("`{text}` is not an address like 0.0.0.0:8080"));
        SocketAddr::from(([127, 0, 0, 1], 0))
    })
}

fn header(i: &mut Issues, at: &str, name: &str) -> Option<HeaderName> {
    HeaderName::try_from(name)
        .map_err(|_| i.push(at, format!("`{name}` is not a valid header name")))
        .ok()
}

/// An OTLP/HTTP collector URL. As with `OTEL_EXPORTER_OTLP_ENDPOINT`, a
/// base URL gets the metrics path `/v1/metrics`; a URL with a path is used
/// as it is.
fn otlp_endpoint(i: &mut Issues, text: &str) -> Uri {
    match text.parse::<Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some() =>
        {
            if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
                // Said without the URL: what precedes the @ is a credential.
                i.push(
                    "telemetry.otlp_endpoint",
                    "must not carry credentials: set them as headers in OTEL_EXPORTER_OTLP_HEADERS",
                );
            }
            if uri.path() != "/" {
                return uri;
            }
            let mut parts = uri.into_parts();
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/v1/metrics"));
            Uri::from_parts(parts).unwrap_or_else(|_| Uri::from_static("http://127.0.0.1:4318"))
        }
        _ => {
            i.push(
                "telemetry.otlp_endpoint",
                format!("`{text}` is not a URL like http://otel-collector:4318"),
            );
            Uri::from_static("http://127.0.0.1:4318/v1/metrics")
        }
    }
}

fn upstream_url(i: &mut Issues, text: &str) -> Uri {
    match text.parse::<Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some() =>
        {
            if uri.query().is_some() {
                i.push("upstream.url", "must not carry a query string");
            }
            uri
        }
        _ => {
            i.push(
                "upstream.url",
                format!("`{text}` is not a URL like http://127.0.0.1:3000"),
            );
            Uri::from_static("http://127.0.0.1:3000")
        }
    }
}
