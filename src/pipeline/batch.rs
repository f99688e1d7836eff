//! The batch rule (SPEC section 3), for bodies that are JSON arrays of
//! events each keyed on its own (SendGrid): every element's key is claimed.
//! All completed: replay as a duplicate. All fresh: forward the body
//! unchanged. A mix: forward an array of only the fresh elements, in their
//! original order. Completion and release apply to every claimed element.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http::Response;

use super::Context;
use super::finish::{self, Held};
use super::forward::{self, PartialBatch};
use crate::body::ProxyBody;
use crate::error::GateError;
use crate::key::{BatchItem, KeyError, Payload};
use crate::settings::{OnMismatch, OnMissingKey};
use crate::store::{Backend, Claim, Existing, ScopedKey, Snapshot};

/// Claims, forwards and finishes a batch delivery.
pub async fn run(cx: &mut Context, pointer: &str) -> Result<Response<ProxyBody>, GateError> {
    let settings = &cx.gate.providers[cx.provider].settings;
    let payload = Payload::new(&cx.body, &cx.head.headers);
    let items = payload
        .batch(pointer, settings.fingerprint, &settings.volatile_fields)
        .map_err(|e: KeyError| GateError::BadPayload(e.to_string()))?;
    let Some(items) = items else {
        return match settings.on_missing_key {
            OnMissingKey::Reject => Err(GateError::MissingKey),
            OnMissingKey::Forward => {
                let answer = forward::send(cx, None).await;
                finish::unclaimed(cx, answer)
            }
        };
    };
    cx.record.key = Some(format!("batch of {}", items.len()));

    let outcome = claim_all(cx, &items).await?;
    if outcome.fresh.is_empty() {
        cx.record.dedupe = "duplicate";
        cx.record.outcome = "duplicate";
        let snapshot = outcome.replay.unwrap_or_else(|| Snapshot {
            status: 200,
            content_type: None,
            body: Bytes::new(),
        });
        cx.record.upstream_status = Some(snapshot.status);
        return Ok(finish::replay(snapshot));
    }
    cx.record.dedupe = "fresh";
    let held = outcome.held;
    cx.gate.track(&held);
    let answer = if outcome.duplicates == 0 {
        forward::send(cx, None).await
    } else {
        let partial = PartialBatch {
            body: assemble(&cx.body, outcome.fresh.iter().map(|i| &items[*i])),
            forwarded: outcome.fresh.len(),
            duplicates: outcome.duplicates,
        };
        forward::send_partial(cx, partial).await
    };
    let gate = Arc::clone(&cx.gate);
    let tokens: Vec<_> = held.iter().map(|(_, t)| t.clone()).collect();
    let result = finish::claimed(cx, held, answer).await;
    gate.untrack(&tokens);
    result
}

struct Claimed {
    /// Indexes of the fresh elements, in body order.
    fresh: Vec<usize>,
    /// One claim per fresh key (an event repeated in the body is one event).
    held: Vec<Held>,
    duplicates: usize,
    replay: Option<Snapshot>,
}

/// Claims every element's key. An element held by another delivery, or
/// (with `on_mismatch = "reject"`) a changed payload, ends the batch: the
/// claims taken so far are released so the sender's retry finds them free.
async fn claim_all(cx: &mut Context, items: &[BatchItem]) -> Result<Claimed, GateError> {
    let gate = Arc::clone(&cx.gate);
    let settings = &gate.providers[cx.provider].settings;
    let lease = gate.settings.dedupe.lease;
    let mut claimed = Claimed {
        fresh: Vec::new(),
        held: Vec::new(),
        duplicates: 0,
        replay: None,
    };
    for (index, item) in items.iter().enumerate() {
        let key = ScopedKey::new(&settings.name, &item.key);
        // The same event twice in one body is one event: claim it once.
        if claimed.held.iter().any(|(k, _)| *k == key) {
            claimed.fresh.push(index);
            continue;
        }
        let outcome = gate
            .timed("claim", || gate.store.claim(&key, &item.fingerprint, lease))
            .await;
        let existing = match outcome {
            Ok(Claim::Fresh(token)) => {
                claimed.fresh.push(index);
                claimed.held.push((key, token));
                continue;
            }
            Ok(Claim::Existing(existing)) => existing,
            Ok(Claim::Mismatch {
                stored_fingerprint,
                existing,
            }) => {
                tracing::warn!(
                    provider = %settings.name,
                    key = %item.key,
                    stored_fingerprint = %stored_fingerprint,
                    incoming_fingerprint = %item.fingerprint,
                    "payload mismatch in a batch element"
                );
                if settings.on_mismatch == OnMismatch::Reject {
                    abandon(&gate, &claimed).await;
                    return Err(GateError::PayloadMismatch {
                        stored: stored_fingerprint,
                        incoming: item.fingerprint.clone(),
                    });
                }
                existing
            }
            Err(e) => {
                abandon(&gate, &claimed).await;
                return Err(e.into());
            }
        };
        match existing {
            Existing::Completed(snapshot) => {
                claimed.duplicates += 1;
                claimed.replay.get_or_insert(snapshot);
            }
            Existing::InFlight { retry_after } => {
                abandon(&gate, &claimed).await;
                return Err(GateError::InFlight { retry_after });
            }
        }
    }
    Ok(claimed)
}

async fn abandon(gate: &crate::gate::Gate, claimed: &Claimed) {
    finish::release(gate, &claimed.held).await;
}

/// A JSON array of the given elements, each with its original bytes.
fn assemble<'a>(body: &Bytes, items: impl Iterator<Item = &'a BatchItem>) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len());
    out.put_u8(b'[');
    for (n, item) in items.enumerate() {
        if n > 0 {
            out.put_u8(b',');
        }
        out.extend_from_slice(&body[item.range.clone()]);
    }
    out.put_u8(b']');
    out.freeze()
}
