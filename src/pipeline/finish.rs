//! Phase 8, finish: what the app's answer means for the claim, and what the
//! sender is told.
//!
//! 2xx: mark the key completed with a snapshot of the answer (a failed mark
//! is retried in the background for as long as the claim's lease can still
//! hold; the sender still gets its 2xx, since the app did the work).
//! Anything else: release the key so the sender's retry gets through, and
//! pass the app's answer (or 502/504) back.

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use http::header::{self, HeaderValue};

use super::Context;
use super::held::HeldClaims;
use crate::body::{self, ProxyBody};
use crate::error::{GateError, RESULT_HEADER};
use crate::gate::Gate;
use crate::store::{Backend, LeaseToken, ScopedKey, Snapshot};
use crate::upstream::{Buffered, UpstreamError, strip_hop_by_hop};

/// How far apart a failed mark is retried: the attempt number times this,
/// at most `MARK_BACKOFF_MAX`.
const MARK_BACKOFF: Duration = Duration::from_millis(200);
const MARK_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A claim this delivery holds: the key and the token that owns it.
pub type Held = (ScopedKey, LeaseToken);

/// Finishes a delivery that holds claims (one, or one per batch element).
/// The status decides: a 2xx head means the app did the work, even when its
/// body was cut, so the claims are marked and the sender gets that status.
pub async fn claimed(
    cx: &mut Context,
    held: HeldClaims,
    answer: Result<Buffered, UpstreamError>,
) -> Result<Response<ProxyBody>, GateError> {
    let gate = Arc::clone(&cx.gate);
    let answer = match answer {
        Ok(answer) if answer.parts.status.is_success() => {
            if let Some(cut) = &answer.cut {
                tracing::warn!(provider = %cx.provider().settings.name, cut = %cut, "the app answered 2xx with a body cut short; marked processed");
            }
            let snapshot = snapshot(&answer, gate.settings.dedupe.max_response_bytes);
            for (key, token) in held.claims() {
                mark(&gate, cx.provider, key, token, &snapshot).await;
            }
            held.settled();
            return Ok(relay(answer, "forwarded"));
        }
        other => other,
    };
    release(&gate, held.claims()).await;
    held.settled();
    unclaimed(cx, answer)
}

/// Releases claims so that the sender's retry gets through at once.
pub async fn release(gate: &Gate, held: &[Held]) {
    for (key, token) in held {
        if let Err(e) = gate
            .timed("release", || gate.store.release(key, token))
            .await
        {
            // The lease expires on its own; the sender's retry waits for it.
            tracing::warn!(key = %key, error = %e, "release failed; the lease will expire");
        }
    }
}

/// Marks the key completed; a failed mark is retried in the background.
async fn mark(
    gate: &Arc<Gate>,
    provider: usize,
    key: &ScopedKey,
    token: &LeaseToken,
    snapshot: &Snapshot,
) {
    let retention = gate.providers[provider].settings.retention;
    let complete = || gate.store.complete(key, token, snapshot, retention);
    match gate.timed("complete", complete).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(key = %key, "claim lost before the mark: the lease had expired");
        }
        Err(e) => {
            tracing::warn!(key = %key, error = %e, "mark failed; retrying in the background");
            let provider = gate.providers[provider].settings.name.clone();
            let snapshot = snapshot.clone();
            spawn_mark_retry(
                Arc::clone(gate),
                provider,
                key.clone(),
                token.clone(),
                snapshot,
                retention,
            );
        }
    }
}

/// Finishes a delivery forwarded without a claim (no key, forward mode).
pub fn unclaimed(
    cx: &mut Context,
    answer: Result<Buffered, UpstreamError>,
) -> Result<Response<ProxyBody>, GateError> {
    match answer {
        Ok(answer) if answer.parts.status.is_success() => Ok(relay(answer, "forwarded")),
        Ok(answer) => {
            cx.record.outcome = "upstream_error";
            Ok(relay(answer, "upstream_error"))
        }
        Err(UpstreamError::Timeout(d)) => Err(GateError::UpstreamTimeout(d)),
        Err(e) => Err(GateError::UpstreamUnreachable(e.to_string())),
    }
}

/// Answers a duplicate with the stored response.
pub fn replay(snapshot: Snapshot) -> Response<ProxyBody> {
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
    headers.insert(RESULT_HEADER, HeaderValue::from_static("duplicate"));
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

/// Retries the mark with backoff until it lands, the claim is found lost, or
/// the lease has run out: the claim was taken before the app was called, so
/// a full `store.lease` from now is past its end, and no mark can land after
/// that. A store outage shorter than the lease's remainder thus costs
/// nothing; a longer one lets the lease expire, and a redelivery is
/// forwarded again (the at-least-once boundary, docs/RELIABILITY.md).
fn spawn_mark_retry(
    gate: Arc<Gate>,
    provider: String,
    key: ScopedKey,
    token: LeaseToken,
    snapshot: Snapshot,
    retention: Duration,
) {
    let deadline = tokio::time::Instant::now() + gate.settings.dedupe.lease;
    let tracker = gate.pending_marks.clone();
    tracker.spawn(async move {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let pause = (MARK_BACKOFF * attempt).min(MARK_BACKOFF_MAX);
            if tokio::time::Instant::now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
            gate.metrics.mark_retry(&provider);
            let complete = || gate.store.complete(&key, &token, &snapshot, retention);
            match gate.timed("complete", complete).await {
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
