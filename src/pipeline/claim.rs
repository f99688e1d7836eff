//! Stage 6, claim: every identity's key in the store, at once (one round
//! trip's wait), each distinct key once. The store's answers decide what
//! happens next (SPEC section 1, step 7, and the batch rule of section 3):
//! all fresh, forward the body; all completed, replay; a mix, forward only
//! the fresh elements. A key held by another delivery, a store error or a
//! rejected mismatch ends the delivery, releasing what was taken.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future::join_all;

use super::forward::PartialBatch;
use super::held::{self, Held, HeldClaims, Inflight};
use super::plan::Identity;
use crate::error::GateError;
use crate::settings::{OnMismatch, ProviderSettings};
use crate::store::{Backend, Claim, Existing, Snapshot, Store, StoreError};
use crate::telemetry::{Dedupe, Mismatch};

/// What the claims let the delivery do.
pub enum Claims {
    /// Forward: the signed body, or (`partial`) only the fresh elements.
    Fresh {
        held: HeldClaims,
        partial: Option<PartialBatch>,
    },
    /// Every event was processed: answer with the stored response.
    Replay(Snapshot),
}

/// The claims, and what the delivery log says of them.
pub struct Claimed {
    pub claims: Claims,
    pub dedupe: Dedupe,
    /// A known key with a changed payload, let through (`on_mismatch =
    /// "alert"`): an anomaly all the same.
    pub mismatch: Option<Mismatch>,
}

/// What the stage needs of the gate.
pub struct ClaimContext<'a> {
    pub store: &'a Arc<Store>,
    pub inflight: &'a Arc<Inflight>,
    pub lease: Duration,
}

/// Claims every identity's key; `body` is the delivery's raw body.
pub async fn claim(
    cx: &ClaimContext<'_>,
    settings: &ProviderSettings,
    body: &Bytes,
    identities: &[Identity],
) -> Result<Claimed, GateError> {
    let (firsts, slot) = distinct(identities);
    let store = cx.store;
    // A redelivery of keys whose first deliveries here have answered their
    // senders and are still making the marks: waiting for the marks (a
    // store operation per key, the wait bounded by the store's timeout)
    // answers it as the duplicate it is, where claiming now would find the
    // keys in flight.
    let deadline = tokio::time::Instant::now() + store.op_timeout();
    while let Some(marked) = cx.inflight.marking(firsts.iter().map(|id| &id.key)) {
        if tokio::time::timeout_at(deadline, marked).await.is_err() {
            break;
        }
    }
    let answers = match firsts.as_slice() {
        // The common case, without join_all's allocations.
        [one] => vec![store.claim(&one.key, &one.fingerprint, cx.lease).await],
        many => {
            join_all(
                many.iter()
                    .map(|id| store.claim(&id.key, &id.fingerprint, cx.lease)),
            )
            .await
        }
    };
    let sorted = sort(settings, &firsts, answers);
    if let Some(error) = sorted.failure {
        held::release(cx.store, &sorted.held).await;
        return Err(error);
    }
    let fresh: Vec<&Identity> = (0..identities.len())
        .filter(|&i| sorted.fresh[slot[i]])
        .map(|i| &identities[i])
        .collect();
    let dedupe_seen = if sorted.mismatch.is_some() {
        Dedupe::Mismatch
    } else {
        Dedupe::Duplicate
    };
    let (claims, dedupe) = if fresh.is_empty() {
        let snapshot = sorted.replay.unwrap_or(Snapshot {
            status: 200,
            content_type: None,
            body: Bytes::new(),
            truncated: false,
        });
        (Claims::Replay(snapshot), dedupe_seen)
    } else {
        let duplicates = identities.len() - fresh.len();
        let partial = (duplicates > 0).then(|| PartialBatch {
            body: assemble(body, &fresh),
            forwarded: fresh.len(),
            duplicates,
        });
        let held = HeldClaims::new(cx.store, cx.inflight, sorted.held);
        (Claims::Fresh { held, partial }, Dedupe::Fresh)
    };
    Ok(Claimed {
        claims,
        dedupe,
        mismatch: sorted.mismatch,
    })
}

/// Each distinct key's first identity, in body order, and for each
/// identity the index of its key among those.
fn distinct(identities: &[Identity]) -> (Vec<&Identity>, Vec<usize>) {
    if let [one] = identities {
        return (vec![one], vec![0]);
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(identities.len());
    let mut firsts = Vec::new();
    let slot = identities
        .iter()
        .map(|id| {
            *seen.entry(id.key.key.as_str()).or_insert_with(|| {
                firsts.push(id);
                firsts.len() - 1
            })
        })
        .collect();
    (firsts, slot)
}

/// The store's answers, sorted out.
struct Sorted {
    /// Per distinct key: did this delivery take it?
    fresh: Vec<bool>,
    held: Vec<Held>,
    replay: Option<Snapshot>,
    mismatch: Option<Mismatch>,
    failure: Option<GateError>,
}

fn sort(
    settings: &ProviderSettings,
    firsts: &[&Identity],
    answers: Vec<Result<Claim, StoreError>>,
) -> Sorted {
    let mut out = Sorted {
        fresh: vec![false; firsts.len()],
        held: Vec::new(),
        replay: None,
        mismatch: None,
        failure: None,
    };
    for (n, (answer, id)) in answers.into_iter().zip(firsts).enumerate() {
        let existing = match answer {
            Ok(Claim::Fresh(token)) => {
                out.fresh[n] = true;
                out.held.push((id.key.clone(), token));
                continue;
            }
            Ok(Claim::Existing(existing)) => existing,
            Ok(Claim::Mismatch {
                stored_fingerprint,
                existing,
            }) => {
                if settings.on_mismatch == OnMismatch::Reject {
                    out.failure.get_or_insert(GateError::PayloadMismatch {
                        key: id.key.key.clone(),
                        stored: stored_fingerprint,
                        incoming: id.fingerprint.clone(),
                    });
                    continue;
                }
                out.mismatch.get_or_insert(Mismatch {
                    key: id.key.key.clone(),
                    stored: stored_fingerprint,
                    incoming: id.fingerprint.clone(),
                });
                existing
            }
            Err(e) => {
                out.failure.get_or_insert(e.into());
                continue;
            }
        };
        match existing {
            Existing::Completed(snapshot) => {
                out.replay.get_or_insert(snapshot);
            }
            Existing::InFlight { retry_after } => {
                out.failure
                    .get_or_insert(GateError::InFlight { retry_after });
            }
        }
    }
    out
}

/// A JSON array of the given elements, each with its original bytes.
fn assemble(body: &Bytes, elements: &[&Identity]) -> Bytes {
    let mut out = BytesMut::with_capacity(body.len());
    out.put_u8(b'[');
    for (n, id) in elements.iter().enumerate() {
        if n > 0 {
            out.put_u8(b',');
        }
        if let Some(range) = &id.range {
            out.extend_from_slice(&body[range.clone()]);
        }
    }
    out.put_u8(b']');
    out.freeze()
}
