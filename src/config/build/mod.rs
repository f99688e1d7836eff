//! Validation: from what the user wrote to the runtime [`Settings`],
//! reporting every problem at once. One file per section; the value
//! parsers every section shares are here.

mod provider;
mod queue;
mod server;
mod store;
mod telemetry;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use http::HeaderName;

use super::file::{RateFile, SizeFile};
use super::{ConfigErrors, ConfigFile, Issues};
use crate::ratelimit::Rate;
use crate::settings::{Mode, Settings};
use crate::store::BackendSettings;

pub(super) fn build(file: &ConfigFile, mut issues: Issues) -> Result<Settings, ConfigErrors> {
    let i = &mut issues;
    let server = server::server(i, &file.server);
    let upstream = server::upstream(i, &file.upstream);
    let (mut store, dedupe) = store::store(i, &file.store, upstream.timeout);
    let telemetry = telemetry::telemetry(i, &file.telemetry);
    let queue = queue::queue(i, &file.queue, upstream.timeout);
    let providers = provider::providers(i, &file.providers, &dedupe);
    queue::check_backend(i, &store.backend, &providers);
    if let BackendSettings::Postgres { retention, .. } = &mut store.backend {
        *retention = providers
            .iter()
            .map(|p| p.retention)
            .fold(dedupe.retention, Duration::max);
    }
    if let BackendSettings::Redis { queue, .. } = &mut store.backend {
        *queue = providers
            .iter()
            .filter(|p| p.mode == Mode::Queue)
            .map(|p| p.name.clone())
            .collect();
    }

    if issues.0.is_empty() {
        Ok(Settings {
            server,
            upstream,
            store,
            dedupe,
            telemetry,
            queue,
            faults: Default::default(),
            providers,
        })
    } else {
        Err(ConfigErrors(issues.0))
    }
}

fn duration(i: &mut Issues, at: &str, text: &str) -> Duration {
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

/// A size in bytes, from an integer or a string with a unit. The text is
/// not repeated in the error (a pasted secret must not come back).
fn size(i: &mut Issues, at: &str, written: &SizeFile) -> u64 {
    match written {
        SizeFile::Bytes(n) => *n,
        SizeFile::Text(text) => super::text::parse_size(text).unwrap_or_else(|| {
            i.push(
                at,
                "is not a size: write bytes (1048576) or a number with a unit (\"512KiB\", \"1MiB\", \"1MB\")",
            );
            1
        }),
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
