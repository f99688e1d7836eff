//! Stage 8, finish: what the app's answer means for the claims, and what
//! the sender is told.
//!
//! The status decides. 2xx: mark the keys completed with a snapshot of the
//! answer (a failed mark is retried in the background for as long as the
//! claim's lease can still hold; the sender still gets its 2xx, since the
//! app did the work), even when the body was cut. Anything else: release
//! the keys so the sender's retry gets through, and pass the app's answer
//! (or 502/504) back.

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use http::header::{self, HeaderValue};
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use super::held::{self, HeldClaims};
use crate::body::{self, ProxyBody};
use crate::error::{GateError, RESULT_HEADER};
use crate::metrics::Metrics;
use crate::settings::ProviderSettings;
use crate::store::{Backend, LeaseToken, ScopedKey, Snapshot, Store};
use crate::telemetry::Outcome;
use crate::upstream::{Buffered, UpstreamError, strip_hop_by_hop};

/// How far apart a failed mark is retried: the attempt number times this,
/// at most `MARK_BACKOFF_MAX`.
const MARK_BACKOFF: Duration = Duration::from_millis(200);
const MARK_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Marks keys completed, retrying in the background when the store fails.
pub struct Marks {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    /// Marks not made yet, those of answered deliveries (`Settle`) and
    /// the retries: shutdown waits for them within its grace, since a
    /// mark given up is a delivery the next redelivery would process
    /// again.
    pending: TaskTracker,
    lease: Duration,
    max_response_bytes: usize,
}

impl Marks {
    pub fn new(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        lease: Duration,
        max_response_bytes: usize,
    ) -> Self {
        Self {
            store,
            metrics,
            pending: TaskTracker::new(),
            lease,
            max_response_bytes,
        }
    }

    /// The marks not made yet.
    pub fn pending(&self) -> &TaskTracker {
        &self.pending
    }
}

/// Finishes a forwarded delivery: releases what it holds when the app did
/// not take it, and answers the sender. When it did (2xx), the keys are
/// marked once the answer has gone: [`Settle`], which the runner runs
/// right after sending it (SPEC section 1, step 9: the answer does not
/// depend on the mark, and a failed one is retried in the background).
/// From here a redelivery of those keys waits for their marks
/// (`held::Inflight::marking`); nothing between here and the answer waits.
pub async fn finish(
    marks: &Marks,
    settings: &ProviderSettings,
    held: Option<HeldClaims>,
    answer: Result<Buffered, UpstreamError>,
) -> Result<(Response<ProxyBody>, Outcome, Option<Settle>), GateError> {
    let answer = match answer {
        Ok(answer) if answer.parts.status.is_success() => {
            let settle = held.map(|held| {
                if let Some(cut) = &answer.cut {
                    tracing::warn!(provider = %settings.name, cut = %cut, "the app answered 2xx with a body cut short; it is marked processed");
                }
                held.answered();
                Settle {
                    held,
                    snapshot: snapshot(&answer, marks.max_response_bytes),
                    _pending: marks.pending.token(),
                }
            });
            return Ok((relay(answer, "forwarded"), Outcome::Forwarded, settle));
        }
        other => other,
    };
    if let Some(held) = held {
        held::release(&marks.store, held.claims()).await;
        held.settled();
    }
    match answer {
        Ok(answer) => Ok((
            relay(answer, "upstream_error"),
            Outcome::UpstreamError,
            None,
        )),
        Err(UpstreamError::Timeout(d)) => Err(GateError::UpstreamTimeout(d)),
        Err(e) => Err(GateError::UpstreamUnreachable(e.to_string())),
    }
}

/// The marks of a delivery the app took: its held claims and the answer
/// they record.
pub struct Settle {
    held: HeldClaims,
    snapshot: Snapshot,
    /// Counted in `Marks::pending` from before the answer until the marks
    /// are made: a gate shutting down waits for them.
    _pending: TaskTrackerToken,
}

impl Settle {
    /// Marks every held key completed.
    pub async fn run(self, marks: &Marks, settings: &ProviderSettings) {
        for (key, token) in self.held.claims() {
            mark(marks, settings, key, token, &self.snapshot).await;
        }
        self.held.settled();
    }
}

/// Marks the key completed; a failed mark is retried in the background.
async fn mark(
    marks: &Marks,
    settings: &ProviderSettings,
    key: &ScopedKey,
    token: &LeaseToken,
    snapshot: &Snapshot,
) {
    let retention = settings.retention;
    match marks.store.complete(key, token, snapshot, retention).await {
        // The line the chaos test reads to tell a mark made from one a
        // SIGKILL cut off (tests/it/chaos.rs).
        Ok(true) => tracing::debug!(key = %key, "marked"),
        Ok(false) => {
            tracing::warn!(key = %key, "claim lost before the mark: the lease had expired");
        }
        Err(e) => {
            tracing::warn!(key = %key, error = %e, "mark failed; retrying in the background");
            let retry = MarkRetry {
                provider: settings.name.clone(),
                key: key.clone(),
                token: token.clone(),
                snapshot: snapshot.clone(),
                retention,
            };
            retry.spawn(marks);
        }
    }
}

/// Answers with a stored response: a duplicate's, or (`result` =
/// `accepted`) queue mode's accept answer.
pub fn stored(snapshot: Snapshot, result: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(body::full(snapshot.body));
    *response.status_mut() =
        http::StatusCode::from_u16(snapshot.status).unwrap_or(http::StatusCode::OK);
    let headers = response.headers_mut();
    if let Some(v) = snapshot
        .content_type
        .and_then(|ct| HeaderValue::try_from(ct).ok())
    {
        headers.insert(header::CONTENT_TYPE, v);
    }
    headers.insert(RESULT_HEADER, HeaderValue::from_static(result));
    response
}

/// The app's answer, passed back to the sender with the gate's verdict. A
/// cut body goes as far as it came, so its declared length goes.
fn relay(answer: Buffered, result: &'static str) -> Response<ProxyBody> {
    let Buffered {
        mut parts,
        body,
        cut,
    } = answer;
    strip_hop_by_hop(&mut parts.headers);
    if cut.is_some() {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    parts
        .headers
        .insert(RESULT_HEADER, HeaderValue::from_static(result));
    Response::from_parts(parts, body::full(body))
}

/// What a duplicate will be answered with: the status, the content type and
/// as much of the body as `max_bytes` allows, marked truncated when that is
/// not all the app said.
fn snapshot(answer: &Buffered, max_bytes: usize) -> Snapshot {
    let content_type = answer
        .parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let truncated = answer.cut.is_some() || answer.body.len() > max_bytes;
    let body = answer.body.slice(..answer.body.len().min(max_bytes));
    Snapshot {
        status: answer.parts.status.as_u16(),
        content_type,
        body,
        truncated,
    }
}

/// A mark to retry: everything it needs, owned.
struct MarkRetry {
    provider: String,
    key: ScopedKey,
    token: LeaseToken,
    snapshot: Snapshot,
    retention: Duration,
}

impl MarkRetry {
    /// Retries the mark with backoff until it lands, the claim is found
    /// lost, or the lease has run out: the claim was taken before the app
    /// was called, so a full `store.lease` from now is past its end, and no
    /// mark can land after that. A store outage shorter than the lease's
    /// remainder thus costs nothing; a longer one lets the lease expire, and
    /// a redelivery is forwarded again (the at-least-once boundary,
    /// docs/RELIABILITY.md).
    fn spawn(self, marks: &Marks) {
        let deadline = tokio::time::Instant::now() + marks.lease;
        let (store, metrics) = (Arc::clone(&marks.store), Arc::clone(&marks.metrics));
        marks.pending.spawn(async move {
            let Self { provider, key, token, snapshot, retention } = self;
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                let pause = (MARK_BACKOFF * attempt).min(MARK_BACKOFF_MAX);
                if tokio::time::Instant::now() + pause >= deadline {
                    break;
                }
                tokio::time::sleep(pause).await;
                metrics.mark_retry(&provider);
                match store.complete(&key, &token, &snapshot, retention).await {
                    Ok(true) => {
                        tracing::info!(key = %key, attempt, "mark retry succeeded");
                        return;
                    }
                    Ok(false) => {
                        tracing::warn!(key = %key, attempt, "mark retry found the claim lost");
                        return;
                    }
                    Err(e) => tracing::warn!(key = %key, attempt, error = %e, "mark retry failed"),
                }
            }
            tracing::error!(key = %key, attempt, "mark retries exhausted with the lease; a redelivery may be forwarded again");
        });
    }
}
