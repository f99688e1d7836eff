//! Stage 6, queue mode's terminal stage (SPEC section 1b): instead of
//! claiming and forwarding while the sender waits, record each new event's
//! dedupe entry and its job in one atomic store operation, and answer
//! `queue.accept_status` once that is durable. The relay delivers the jobs
//! (`crate::relay`).

use bytes::{BufMut, Bytes, BytesMut};
use http::header::HeaderMap;
use http::{Response, StatusCode};
use tokio::sync::Notify;

use super::finish;
use super::forward::{self, PartialBatch, Payload};
use super::plan::Identity;
use super::read::Request;
use crate::body::ProxyBody;
use crate::error::GateError;
use crate::server::Conn;
use crate::settings::{OnMismatch, ProviderSettings, QueueSettings};
use crate::store::outbox::{Accept, AcceptPolicy, Accepted, NewJob, Outbox};
use crate::store::{Existing, Snapshot, Store};
use crate::telemetry::trace::StageSpan;
use crate::telemetry::{Dedupe, Mismatch};

/// What the stage needs of the gate.
pub struct AcceptContext<'a> {
    pub store: &'a Store,
    pub queue: &'a QueueSettings,
    /// Wakes the relay when jobs were added.
    pub relay: &'a Notify,
    /// The accept stage's span: each job's `traceparent` names it, and the
    /// relay's attempts are its children.
    pub trace: &'a StageSpan,
}

/// The answer, and what the delivery log says of it.
pub struct AcceptResult {
    pub response: Response<ProxyBody>,
    pub dedupe: Dedupe,
    pub accepted: bool,
    pub mismatch: Option<Mismatch>,
}

/// Accepts the delivery's new events; duplicates are answered as such.
pub async fn accept(
    cx: &AcceptContext<'_>,
    settings: &ProviderSettings,
    request: &Request,
    conn: Conn,
    identities: &[Identity],
) -> Result<AcceptResult, GateError> {
    let items: Vec<Accept> = identities
        .iter()
        .map(|id| Accept {
            key: id.key.clone(),
            fingerprint: id.fingerprint.clone(),
            job: job(settings, request, conn, id, identities.len(), cx.trace),
        })
        .collect();
    let policy = AcceptPolicy {
        answer: answer(cx.queue.accept_status),
        retention: settings.retention,
        reject_mismatch: settings.on_mismatch == OnMismatch::Reject,
    };
    let outcomes = cx.store.accept(items, policy.clone()).await?;
    let verdict = verdict(outcomes, identities, settings)?;
    if verdict.accepted {
        cx.relay.notify_one();
        return Ok(AcceptResult {
            response: finish::stored(policy.answer, "accepted"),
            dedupe: Dedupe::Fresh,
            accepted: true,
            mismatch: verdict.mismatch,
        });
    }
    let dedupe = match verdict.mismatch {
        Some(_) => Dedupe::Mismatch,
        None => Dedupe::Duplicate,
    };
    Ok(AcceptResult {
        response: finish::stored(verdict.replay.unwrap_or(policy.answer), "duplicate"),
        dedupe,
        accepted: false,
        mismatch: verdict.mismatch,
    })
}

/// What the store found, over all the delivery's events.
struct Verdict {
    /// At least one event was new and is now enqueued.
    accepted: bool,
    /// The first event known with another payload (`on_mismatch = alert`).
    mismatch: Option<Mismatch>,
    /// The first known event's stored answer, replayed to a duplicate.
    replay: Option<Snapshot>,
}

/// Reads the store's outcomes: an event in flight, or a mismatch the
/// provider rejects, is the whole delivery's error.
fn verdict(
    outcomes: Vec<Accepted>,
    identities: &[Identity],
    settings: &ProviderSettings,
) -> Result<Verdict, GateError> {
    let mut verdict = Verdict {
        accepted: false,
        mismatch: None,
        replay: None,
    };
    for (outcome, id) in outcomes.into_iter().zip(identities) {
        let existing = match outcome {
            Accepted::Enqueued => {
                verdict.accepted = true;
                continue;
            }
            Accepted::Existing(existing) => existing,
            Accepted::Mismatch {
                stored_fingerprint,
                existing,
            } => {
                let mismatch = Mismatch {
                    key: id.key.key.clone(),
                    stored: stored_fingerprint,
                    incoming: id.fingerprint.clone(),
                };
                if settings.on_mismatch == OnMismatch::Reject {
                    return Err(GateError::PayloadMismatch {
                        key: mismatch.key,
                        stored: mismatch.stored,
                        incoming: mismatch.incoming,
                    });
                }
                verdict.mismatch.get_or_insert(mismatch);
                existing
            }
        };
        match existing {
            Existing::InFlight { retry_after } => return Err(GateError::InFlight { retry_after }),
            Existing::Completed(snapshot) => {
                verdict.replay.get_or_insert(snapshot);
            }
        }
    }
    Ok(verdict)
}

/// The job for one event: the whole signed delivery for a single event;
/// for a batch element, an array of that element alone, which is not the
/// signed body (so it goes like a partial batch: no signature headers,
/// `Hookgate-Verified`).
fn job(
    settings: &ProviderSettings,
    request: &Request,
    conn: Conn,
    id: &Identity,
    events: usize,
    trace: &StageSpan,
) -> NewJob {
    let key = Some(id.key.clone());
    let payload = match &id.range {
        None => Payload::Signed(key),
        Some(range) => {
            let mut body = BytesMut::with_capacity(range.len() + 2);
            body.put_u8(b'[');
            body.extend_from_slice(&request.body[range.clone()]);
            body.put_u8(b']');
            let batch = PartialBatch {
                body: body.freeze(),
                forwarded: 1,
                duplicates: events - 1,
            };
            Payload::Partial(batch, key)
        }
    };
    let (mut headers, body) = forward::outgoing(settings, request, conn, payload);
    trace.propagate(&mut headers);
    NewJob {
        method: request.head.method.to_string(),
        target: forward::target(settings, request),
        headers: header_block(&headers),
        body,
    }
}

/// Headers as an HTTP/1 header block (see [`NewJob::headers`]).
pub fn header_block(headers: &HeaderMap) -> Bytes {
    let mut out = BytesMut::new();
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.freeze()
}

/// What an accepted delivery is answered, and its duplicates replayed.
fn answer(status: StatusCode) -> Snapshot {
    Snapshot {
        status: status.as_u16(),
        content_type: Some("application/json".to_owned()),
        body: Bytes::from_static(b"{\"result\":\"accepted\"}"),
        truncated: false,
    }
}
