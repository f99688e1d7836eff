//! The relay of queue mode (SPEC section 1b): takes due jobs from the
//! outbox under a lease, delivers them to the app as forward mode would
//! (plus `Hookgate-Attempt: N`), and settles each attempt: delivered on a
//! 2xx; dead on a status in `queue.dead_on` or when `max_attempts` or
//! `max_age` run out; else retried with capped exponential backoff and
//! jitter, or after the app's `Retry-After` when that is later. Delivery is
//! at least once: a gate that dies mid-attempt leaves its lease to expire,
//! and the job is attempted again. No ordering is promised. With traces
//! on, each attempt is a span in the delivery's trace, the child of the
//! accept span that the job's `traceparent` names, and the app's
//! `traceparent` names the attempt.

mod policy;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Version};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;

use crate::body;
use crate::gate::Gate;
use crate::settings::Mode;
use crate::store::StoreError;
use crate::store::outbox::{Job, Outbox, Settle};
use crate::telemetry::trace::StageSpan;
use crate::upstream::UpstreamError;

/// A failed settle is tried again after this, doubling up to the max, as
/// long as the job's lease lasts.
const SETTLE_BACKOFF: Duration = Duration::from_millis(50);
const SETTLE_BACKOFF_MAX: Duration = Duration::from_secs(1);

pub use self::policy::decide;

const ATTEMPT: HeaderName = HeaderName::from_static("hookgate-attempt");

/// How often an idle relay looks for due jobs (retries come due without a
/// wake-up; new jobs wake it at once).
const POLL: Duration = Duration::from_millis(250);
/// How often the queue gauges are refreshed, at most.
const DEPTH_INTERVAL: Duration = Duration::from_secs(5);
/// Reading the gauges walks the whole backlog on every store, so after a
/// read the next waits this many times as long as it took: the gauges
/// take at most a tenth of the store's time, whatever the backlog.
const DEPTH_PAUSE_FACTOR: u32 = 9;
/// The longest pause between two reads of the gauges.
const DEPTH_PAUSE_MAX: Duration = Duration::from_secs(60);
/// How long to wait after the store failed before trying again.
const STORE_BACKOFF: Duration = Duration::from_secs(1);

/// Runs until `stop` flips, then lets attempts in flight finish within the
/// shutdown grace; those cut off keep their lease, which expires, and the
/// job is attempted again (by this gate after a restart, or another).
pub async fn run(gate: Arc<Gate>, mut stop: watch::Receiver<bool>) {
    let queue = &gate.settings.queue;
    let mut attempts: JoinSet<()> = JoinSet::new();
    // The gauges apart from the takes: a long read of them does not hold
    // deliveries back. Dropped with the relay, the task is aborted: a read
    // in progress is only a read.
    let gauges =
        AbortOnDropHandle::new(tokio::spawn(report_depths(Arc::clone(&gate), stop.clone())));
    loop {
        let room = queue.concurrency.saturating_sub(attempts.len());
        let took = if room == 0 || *stop.borrow() {
            Ok(0)
        } else {
            take(&gate, &mut attempts, room).await
        };
        let pause = match took {
            Ok(0) => POLL,
            Ok(_) => Duration::ZERO,
            Err(e) => {
                tracing::warn!(error = %e, "relay: taking due jobs failed; retrying");
                STORE_BACKOFF
            }
        };
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            _ = gate.relay_wakeup.notified() => {}
            _ = tokio::time::sleep(pause), if !pause.is_zero() => {}
            Some(_) = attempts.join_next(), if !attempts.is_empty() => {}
            _ = stop.changed() => {}
            else => {}
        }
    }
    drop(gauges);
    let grace = gate.settings.server.shutdown_grace;
    if tokio::time::timeout(grace, async {
        while attempts.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(
            attempts = attempts.len(),
            "relay: grace elapsed with attempts in flight; their leases will expire"
        );
    }
}

/// Refreshes the queue gauges until `stop` flips: `DEPTH_INTERVAL` after
/// each read, or `DEPTH_PAUSE_FACTOR` times a successful read's length
/// when that is more (up to `DEPTH_PAUSE_MAX`). A failed read is retried
/// after `DEPTH_INTERVAL`: its length says nothing of the backlog.
async fn report_depths(gate: Arc<Gate>, mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        let started = tokio::time::Instant::now();
        let pause = match report_depth(&gate).await {
            true => (started.elapsed() * DEPTH_PAUSE_FACTOR).clamp(DEPTH_INTERVAL, DEPTH_PAUSE_MAX),
            false => DEPTH_INTERVAL,
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            changed = stop.changed() => if changed.is_err() { return },
        }
    }
}

/// Sets the queue gauges of every queue-mode provider (zero when it has
/// no job); false when the store could not be read.
async fn report_depth(gate: &Gate) -> bool {
    let depths = match gate.store.depth().await {
        Ok(depths) => depths,
        Err(e) => {
            tracing::warn!(error = %e, "relay: reading the queue's depth failed");
            return false;
        }
    };
    let now = SystemTime::now();
    for p in gate
        .providers
        .iter()
        .filter(|p| p.settings.mode == Mode::Queue)
    {
        let name = &p.settings.name;
        let d = depths.iter().find(|d| &d.provider == name);
        let oldest = d
            .and_then(|d| d.oldest_pending)
            .and_then(|t| now.duration_since(t).ok())
            .unwrap_or_default();
        gate.metrics.queue_depth(
            name,
            d.map_or(0, |d| d.pending),
            d.map_or(0, |d| d.leased),
            d.map_or(0, |d| d.dead),
            oldest,
        );
    }
    true
}

/// Leases up to `room` due jobs and starts an attempt for each.
async fn take(
    gate: &Arc<Gate>,
    attempts: &mut JoinSet<()>,
    room: usize,
) -> Result<usize, StoreError> {
    let jobs = gate.store.take_due(gate.settings.queue.lease, room).await?;
    let n = jobs.len();
    for job in jobs {
        attempts.spawn(attempt(Arc::clone(gate), job));
    }
    Ok(n)
}

/// One attempt: send, decide, settle, log.
async fn attempt(gate: Arc<Gate>, job: Job) {
    let provider = gate
        .providers
        .iter()
        .find(|p| p.settings.name == job.key.provider);
    let started = std::time::Instant::now();
    let mut headers = parse_header_block(&job.job.headers);
    let mut span = match &gate.traces {
        Some(traces) => {
            traces.relay_attempt(&job.key.provider, &job.key.key, job.attempt, &mut headers)
        }
        None => StageSpan::OFF,
    };
    let answer = match provider {
        Some(p) => send(&gate, &p.settings.name, &job, headers).await,
        None => Err(UpstreamError::Other(format!(
            "provider {} is no longer configured",
            job.key.provider
        ))),
    };
    let status = answer.as_ref().ok().map(|a| a.parts.status.as_u16());
    let settle = if provider.is_none() {
        Settle::Dead {
            status: None,
            error: "the provider is no longer configured".into(),
        }
    } else {
        decide(
            &gate.settings.queue,
            job.attempt,
            job.received_at,
            SystemTime::now(),
            &answer,
        )
    };
    let outcome = match &settle {
        Settle::Delivered { .. } => "delivered",
        Settle::Retry { .. } => "retry",
        Settle::Dead { .. } => "dead",
    };
    span.settled(outcome);
    span.answered(&answer);
    let metrics = &gate.metrics;
    metrics.relay_attempt(&job.key.provider, outcome);
    match &settle {
        Settle::Delivered { .. } => {
            let waited = SystemTime::now()
                .duration_since(job.received_at)
                .unwrap_or_default();
            metrics.accept_to_delivery(&job.key.provider, waited);
        }
        Settle::Dead { .. } => metrics.dead_letter(&job.key.provider),
        Settle::Retry { .. } => {}
    }
    log(&job, outcome, status, &settle, started.elapsed());
    let lease_ends = tokio::time::Instant::from_std(started) + gate.settings.queue.lease;
    settle_within(&gate, &job, settle, lease_ends).await;
}

/// Records the attempt's end, trying again while the store is down, until
/// the job's lease ends; past it the job is attempted again (the relay's
/// at-least-once boundary: a delivery the app already has).
async fn settle_within(gate: &Gate, job: &Job, settle: Settle, lease_ends: tokio::time::Instant) {
    let mut pause = SETTLE_BACKOFF;
    loop {
        match gate.store.settle(job.id, &job.token, settle.clone()).await {
            Ok(true) => return,
            Ok(false) => {
                tracing::warn!(key = %job.key, "relay: the job's lease had expired before it was settled");
                return;
            }
            Err(e) if tokio::time::Instant::now() + pause >= lease_ends => {
                tracing::warn!(key = %job.key, error = %e, "relay: settling the attempt failed; it will be attempted again");
                return;
            }
            Err(e) => {
                tracing::debug!(key = %job.key, error = %e, "relay: settling failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(SETTLE_BACKOFF_MAX);
            }
        }
    }
}

/// Sends the job with `headers`, its header block as parsed (with the
/// attempt's `traceparent`, when traces are on).
async fn send(
    gate: &Gate,
    provider: &str,
    job: &Job,
    mut headers: HeaderMap,
) -> Result<crate::upstream::Buffered, UpstreamError> {
    let uri = gate.upstream.target(&job.job.target)?;
    headers.insert(ATTEMPT, HeaderValue::from(job.attempt));
    let method = Method::from_bytes(job.job.method.as_bytes()).unwrap_or(Method::POST);
    let mut req = Request::new(body::full(job.job.body.clone()));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    gate.upstream.call_buffered(provider, req).await
}

/// The headers of an HTTP/1 header block written by the accept stage.
pub fn parse_header_block(block: &Bytes) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in block.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    headers
}

fn log(job: &Job, outcome: &str, status: Option<u16>, settle: &Settle, took: Duration) {
    let error = match settle {
        Settle::Retry { error, .. } | Settle::Dead { error, .. } => Some(error.as_str()),
        Settle::Delivered { .. } => None,
    };
    let retry_in_ms = match settle {
        Settle::Retry { after, .. } => Some(after.as_millis() as u64),
        _ => None,
    };
    let duration_ms = (took.as_secs_f64() * 1e6).round() / 1e3;
    tracing::info!(
        target: "hookgate::relay",
        provider = job.key.provider.as_str(),
        key = job.key.key.as_str(),
        attempt = job.attempt,
        outcome,
        upstream_status = status,
        error,
        retry_in_ms,
        duration_ms,
        "relay attempt"
    );
}
