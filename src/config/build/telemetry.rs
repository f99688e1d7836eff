//! The `[telemetry]` section.

use http::Uri;
use http::uri::PathAndQuery;

use super::{Issues, duration};
use crate::config::file::TelemetryFile;
use crate::settings::{OtlpSettings, TelemetrySettings, TraceSettings};

const METRICS_PATH: &str = "/v1/metrics";
const TRACES_PATH: &str = "/v1/traces";

pub(super) fn telemetry(i: &mut Issues, t: &TelemetryFile) -> TelemetrySettings {
    let timeout = duration(i, "telemetry.otlp_timeout", &t.otlp_timeout);
    let base = t
        .otlp_endpoint
        .as_deref()
        .map(|text| otlp_url(i, "telemetry.otlp_endpoint", text));
    let ratio = t.trace_sample_ratio;
    if !(0.0..=1.0).contains(&ratio) {
        i.push(
            "telemetry.trace_sample_ratio",
            format!("{ratio} is not a share between 0 (traces off) and 1 (every delivery)"),
        );
    }
    let traces_endpoint = match t.otlp_traces_endpoint.as_deref() {
        Some(text) => Some(otlp_url(i, "telemetry.otlp_traces_endpoint", text)),
        None => base.as_ref().and_then(|uri| beside(uri, TRACES_PATH)),
    };
    TelemetrySettings {
        otlp: base.map(|uri| OtlpSettings {
            endpoint: beside(&uri, METRICS_PATH).unwrap_or(uri),
            interval: duration(i, "telemetry.otlp_interval", &t.otlp_interval),
            timeout,
        }),
        traces: traces_endpoint
            .filter(|_| ratio > 0.0 && ratio <= 1.0)
            .map(|endpoint| TraceSettings {
                endpoint,
                sample_ratio: ratio,
                timeout,
            }),
    }
}

/// The URL of one signal, as with `OTEL_EXPORTER_OTLP_ENDPOINT`: a base
/// URL gets the signal's path (`/v1/metrics`, `/v1/traces`); a URL ending in
/// another signal's path gets this one's instead. A URL with any other path
/// is the metrics URL as it is, and says nothing of where traces go
/// (`telemetry.otlp_traces_endpoint` does).
fn beside(uri: &Uri, signal: &'static str) -> Option<Uri> {
    let path = uri.path();
    let prefix = if path == "/" {
        ""
    } else {
        path.strip_suffix(METRICS_PATH)
            .or_else(|| path.strip_suffix(TRACES_PATH))?
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(format!("{prefix}{signal}")).ok()?);
    Uri::from_parts(parts).ok()
}

/// An OTLP/HTTP collector URL.
fn otlp_url(i: &mut Issues, at: &str, text: &str) -> Uri {
    match text.parse::<Uri>() {
        Ok(uri)
            if matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some() =>
        {
            if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
                // Said without the URL: what precedes the @ is a credential.
                i.push(
                    at,
                    "must not carry credentials: set them as headers in OTEL_EXPORTER_OTLP_HEADERS",
                );
            }
            uri
        }
        _ => {
            i.push(
                at,
                format!("`{text}` is not a URL like http://otel-collector:4318"),
            );
            Uri::from_static("http://127.0.0.1:4318/")
        }
    }
}
