//! The `[telemetry]` section.

use http::Uri;

use super::{Issues, duration};
use crate::config::file::TelemetryFile;
use crate::settings::{OtlpSettings, TelemetrySettings};

pub(super) fn telemetry(i: &mut Issues, t: &TelemetryFile) -> TelemetrySettings {
    TelemetrySettings {
        otlp: t.otlp_endpoint.as_deref().map(|endpoint| OtlpSettings {
            endpoint: otlp_endpoint(i, endpoint),
            interval: duration(i, "telemetry.otlp_interval", &t.otlp_interval),
            timeout: duration(i, "telemetry.otlp_timeout", &t.otlp_timeout),
        }),
    }
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
