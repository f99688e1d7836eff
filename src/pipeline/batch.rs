//! The batch rule (SPEC section 3), for bodies that are JSON arrays of
//! events each keyed on its own (SendGrid): every element's key is claimed.
//! All completed: replay as a duplicate. All fresh: forward the body
//! unchanged. A mix: forward an array of only the fresh elements, in their
//! original order. Completion and release apply to every claimed element.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http::Response;

use futures_util::future::join_all;

use super::Context;
use super::claim;
use super::finish::{self, Held};
use super::forward::{self, PartialBatch};
use super::held::HeldClaims;
use crate::body::ProxyBody;
use crate::error::GateError;
use crate::key::{BatchItem, KeyError, Payload};
use crate::settings::OnMissingKey;
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
            truncated: false,
        });
        cx.record.upstream_status = Some(snapshot.status);
        return Ok(finish::replay(snapshot));
    }
    cx.record.dedupe = "fresh";
    let held = HeldClaims::new(&cx.gate, outcome.held);
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
    finish::claimed(cx, held, answer).await
}

struct Claimed {
    /// Indexes of the fresh elements, in body order.
    fresh: Vec<usize>,
    /// One claim per fresh key (an event repeated in the body is one event).
    held: Vec<Held>,
    duplicates: usize,
    replay: Option<Snapshot>,
}

/// Claims every element's key, all at once: the claims go to the store
/// together (one round trip's wait, each bounded by the store's timeout),
/// and an event repeated in the body is claimed once. An element held by
/// another delivery, a store error, or (with `on_mismatch = "reject"`) a
/// changed payload ends the batch: the claims taken are released so the
/// sender's retry finds them free.
async fn claim_all(cx: &mut Context, items: &[BatchItem]) -> Result<Claimed, GateError> {
    let gate = Arc::clone(&cx.gate);
    let settings = &gate.providers[cx.provider].settings;
    let lease = gate.settings.dedupe.lease;
    // Each distinct key once, in body order; `slot[i]` is item i's key.
    let mut distinct: HashMap<&str, usize> = HashMap::with_capacity(items.len());
    let mut firsts: Vec<usize> = Vec::new();
    let slot: Vec<usize> = items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            *distinct.entry(item.key.as_str()).or_insert_with(|| {
                firsts.push(index);
                firsts.len() - 1
            })
        })
        .collect();
    let keys: Vec<ScopedKey> = firsts
        .iter()
        .map(|&i| ScopedKey::new(&settings.name, &items[i].key))
        .collect();
    let claims = gate
        .timed("claim", || {
            join_all(
                firsts
                    .iter()
                    .zip(&keys)
                    .map(|(&i, key)| gate.store.claim(key, &items[i].fingerprint, lease)),
            )
        })
        .await;

    let mut held = Vec::new();
    let mut fresh_keys = vec![false; keys.len()];
    let mut failure = None;
    let mut replay = None;
    for ((n, claim), key) in claims.into_iter().enumerate().zip(keys) {
        let item = &items[firsts[n]];
        let existing = match claim {
            Ok(Claim::Fresh(token)) => {
                fresh_keys[n] = true;
                held.push((key, token));
                continue;
            }
            Ok(Claim::Existing(existing)) => existing,
            Ok(Claim::Mismatch {
                stored_fingerprint,
                existing,
            }) => {
                // Alert mode goes on as for a duplicate; reject ends the batch.
                if let Err(e) = claim::mismatch(cx, &key, &stored_fingerprint, &item.fingerprint) {
                    failure.get_or_insert(e);
                    continue;
                }
                existing
            }
            Err(e) => {
                failure.get_or_insert(GateError::from(e));
                continue;
            }
        };
        match existing {
            Existing::Completed(snapshot) => {
                replay.get_or_insert(snapshot);
            }
            Existing::InFlight { retry_after } => {
                failure.get_or_insert(GateError::InFlight { retry_after });
            }
        }
    }
    if let Some(error) = failure {
        finish::release(&gate, &held).await;
        return Err(error);
    }
    let fresh: Vec<usize> = (0..items.len()).filter(|&i| fresh_keys[slot[i]]).collect();
    Ok(Claimed {
        duplicates: items.len() - fresh.len(),
        fresh,
        held,
        replay,
    })
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
