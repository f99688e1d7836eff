//! The `[queue]` section, and which stores can carry queue mode.

use std::time::Duration;

use http::StatusCode;

use super::{Issues, duration};
use crate::config::file::QueueFile;
use crate::settings::{Mode, ProviderSettings, QueueSettings};
use crate::store::BackendSettings;

pub(super) fn queue(i: &mut Issues, q: &QueueFile, upstream_timeout: Duration) -> QueueSettings {
    let accept_status = match StatusCode::from_u16(q.accept_status) {
        Ok(s) if s.is_success() => s,
        _ => {
            i.push(
                "queue.accept_status",
                "must be a 2xx status (202, or 200 for senders that want it)",
            );
            StatusCode::ACCEPTED
        }
    };
    if q.max_attempts == 0 {
        i.push("queue.max_attempts", "must be at least 1");
    }
    if !(0.0..=1.0).contains(&q.jitter) {
        i.push(
            "queue.jitter",
            "must be between 0 and 1 (a fraction of the delay)",
        );
    }
    if q.concurrency == 0 {
        i.push("queue.concurrency", "must be greater than 0");
    }
    let lease = duration(i, "queue.lease", &q.lease);
    if lease <= upstream_timeout {
        i.push(
            "queue.lease",
            format!(
                "must exceed upstream.timeout ({}), so that a relay attempt never outlives its lease",
                humantime::format_duration(upstream_timeout)
            ),
        );
    }
    let retry_initial = duration(i, "queue.retry_initial", &q.retry_initial);
    let retry_max = duration(i, "queue.retry_max", &q.retry_max);
    if retry_max < retry_initial {
        i.push(
            "queue.retry_max",
            "must not be shorter than queue.retry_initial",
        );
    }
    let dead_on = q
        .dead_on
        .iter()
        .filter_map(|&code| match StatusCode::from_u16(code) {
            Ok(s) if s.is_client_error() || s.is_server_error() => Some(s),
            _ => {
                i.push(
                    "queue.dead_on",
                    format!("{code} is not a 4xx or 5xx status"),
                );
                None
            }
        })
        .collect();
    QueueSettings {
        accept_status,
        max_attempts: q.max_attempts.max(1),
        max_age: duration(i, "queue.max_age", &q.max_age),
        retry_initial,
        retry_max,
        jitter: q.jitter.clamp(0.0, 1.0),
        lease,
        concurrency: q.concurrency.max(1),
        dead_on,
    }
}

/// Queue mode needs a durable store with an outbox: the memory store
/// forgets on restart.
pub(super) fn check_backend(
    i: &mut Issues,
    backend: &BackendSettings,
    providers: &[ProviderSettings],
) {
    if !matches!(backend, BackendSettings::Memory { .. }) {
        return;
    }
    let refusal = "the memory store is not durable: queue mode needs store.backend = \"sqlite\", \"redis\" or \"postgres\"";
    for p in providers.iter().filter(|p| p.mode == Mode::Queue) {
        i.push(format!("providers.{}.mode", p.name), refusal);
    }
}
