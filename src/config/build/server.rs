//! The `[server]` and `[upstream]` sections.

use std::path::PathBuf;

use http::Uri;

use super::{Issues, addr, duration, header, rate, size};
use crate::config::file::{ServerFile, SizeFile, UpstreamFile};
use crate::settings::{ServerSettings, UpstreamSettings};
use crate::tls::TlsFiles;

/// `server.max_body_bytes_in_flight` when unset (or `max_body_bytes`, when
/// that is larger: a config that allowed one large body still does).
const DEFAULT_BODY_BYTES_IN_FLIGHT: u64 = 64 * 1024 * 1024;

/// Whether a written size is one (`size` reports one that is not).
fn size_parsed(written: Option<&SizeFile>) -> bool {
    match written {
        Some(SizeFile::Text(text)) => crate::config::text::parse_size(text).is_some(),
        _ => true,
    }
}

pub(super) fn server(i: &mut Issues, s: &ServerFile) -> ServerSettings {
    let max_body_bytes = size(i, "server.max_body_bytes", &s.max_body_bytes);
    let max_body_bytes_in_flight = s
        .max_body_bytes_in_flight
        .as_ref()
        .map(|written| size(i, "server.max_body_bytes_in_flight", written));
    let max_header_bytes = size(i, "server.max_header_bytes", &s.max_header_bytes);
    let server = ServerSettings {
        listen: addr(i, "server.listen", &s.listen),
        admin_listen: addr(i, "server.admin_listen", &s.admin_listen),
        max_body_bytes,
        max_body_bytes_in_flight: max_body_bytes_in_flight
            .unwrap_or(DEFAULT_BODY_BYTES_IN_FLIGHT.max(max_body_bytes)),
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
        max_header_bytes: usize::try_from(max_header_bytes).unwrap_or(usize::MAX),
        tls: s.tls.as_ref().map(|t| TlsFiles {
            cert: PathBuf::from(&t.cert),
            key: PathBuf::from(&t.key),
        }),
        admin_token: s
            .admin_token
            .as_ref()
            .and_then(|t| super::provider::secret(i, "server.admin_token", t)),
        allow_no_providers: s.allow_no_providers,
    };
    if s.max_connections == 0 {
        i.push("server.max_connections", "must be greater than 0");
    }
    if max_header_bytes < 8192 {
        i.push("server.max_header_bytes", "must be at least 8192");
    }
    if max_body_bytes == 0 {
        i.push("server.max_body_bytes", "must be greater than 0");
    }
    // A size that did not parse is reported as such, not compared.
    if let Some(in_flight) = max_body_bytes_in_flight
        && in_flight < max_body_bytes
        && size_parsed(s.max_body_bytes_in_flight.as_ref())
    {
        i.push(
            "server.max_body_bytes_in_flight",
            format!(
                "must be at least server.max_body_bytes ({max_body_bytes} bytes), \
                 or no body that large could ever be read"
            ),
        );
    }
    server
}

pub(super) fn upstream(i: &mut Issues, u: &UpstreamFile) -> UpstreamSettings {
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
    upstream
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
