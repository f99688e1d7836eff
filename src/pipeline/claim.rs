//! Phases 4 to 6, key, fingerprint and claim: find the event's idempotency
//! key, fingerprint the payload, and claim the key in the store.

use crate::error::GateError;
use crate::key::{KeyError, Payload};
use crate::settings::{OnMismatch, OnMissingKey};
use crate::store::{Backend, Claim, Existing, LeaseToken, ScopedKey, Snapshot};

use super::Context;

/// The event's scoped key and its payload fingerprint.
pub struct Identity {
    pub key: ScopedKey,
    pub fingerprint: String,
}

/// What the claim lets the pipeline do next.
pub enum Decision {
    /// First delivery: forward it, then complete or release with the token.
    Fresh(LeaseToken),
    /// Already processed: answer with the stored response.
    Replay(Snapshot),
}

/// Extracts the key and the fingerprint. `Ok(None)`: no key, and the
/// provider forwards such deliveries without dedupe.
pub fn identify(cx: &mut Context) -> Result<Option<Identity>, GateError> {
    let settings = &cx.gate.providers[cx.provider].settings;
    let payload = Payload::new(&cx.body, &cx.head.headers);
    let key = match &settings.key {
        Some(source) => source.extract(&payload).map_err(|e| match e {
            KeyError::NotJson | KeyError::NotForm | KeyError::Invalid(_) => {
                GateError::BadPayload(e.to_string())
            }
        })?,
        None => None,
    };
    let Some(key) = key else {
        return match settings.on_missing_key {
            OnMissingKey::Reject => Err(GateError::MissingKey),
            OnMissingKey::Forward => Ok(None),
        };
    };
    let fingerprint = payload.fingerprint(settings.fingerprint, &settings.volatile_fields);
    let key = ScopedKey::new(&settings.name, key);
    cx.record.key = Some(key.key.clone());
    Ok(Some(Identity { key, fingerprint }))
}

/// Claims the key. Fails closed: a store error ends the delivery with 503
/// and nothing is forwarded.
pub async fn claim(cx: &mut Context, identity: &Identity) -> Result<Decision, GateError> {
    let gate = &cx.gate;
    let lease = gate.settings.dedupe.lease;
    let claim = gate
        .timed("claim", || {
            gate.store
                .claim(&identity.key, &identity.fingerprint, lease)
        })
        .await?;
    let existing = match claim {
        Claim::Fresh(token) => {
            cx.record.dedupe = "fresh";
            return Ok(Decision::Fresh(token));
        }
        Claim::Existing(existing) => existing,
        Claim::Mismatch {
            stored_fingerprint,
            existing,
        } => {
            mismatch(
                cx,
                &identity.key,
                &stored_fingerprint,
                &identity.fingerprint,
            )?;
            existing
        }
    };
    match existing {
        Existing::InFlight { retry_after } => Err(GateError::InFlight { retry_after }),
        Existing::Completed(snapshot) => {
            if cx.record.dedupe != "mismatch" {
                cx.record.dedupe = "duplicate";
            }
            cx.record.outcome = "duplicate";
            cx.record.upstream_status = Some(snapshot.status);
            Ok(Decision::Replay(snapshot))
        }
    }
}

/// A known key arrived with a different payload: logged with both
/// fingerprints and counted as an anomaly whatever the provider's
/// `on_mismatch`; an error when that is `reject`, else the delivery goes on
/// as a duplicate.
pub fn mismatch(
    cx: &mut Context,
    key: &ScopedKey,
    stored: &str,
    incoming: &str,
) -> Result<(), GateError> {
    let settings = &cx.gate.providers[cx.provider].settings;
    tracing::warn!(
        provider = %settings.name,
        key = %key.key,
        stored_fingerprint = %stored,
        incoming_fingerprint = %incoming,
        "payload mismatch: a known event id arrived with a different payload"
    );
    cx.gate.metrics.anomaly(&settings.name, "payload_mismatch");
    if settings.on_mismatch == OnMismatch::Reject {
        return Err(GateError::PayloadMismatch {
            stored: stored.to_owned(),
            incoming: incoming.to_owned(),
        });
    }
    cx.record.dedupe = "mismatch";
    Ok(())
}
