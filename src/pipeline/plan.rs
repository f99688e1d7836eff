//! Stage 5, key and fingerprint: which events the delivery carries. A
//! single key is a batch of one, so everything after this stage handles
//! one event and a SendGrid array alike.

use std::ops::Range;

use super::read::Request;
use crate::error::GateError;
use crate::key::{KeyError, KeySource, Payload};
use crate::settings::{OnMissingKey, ProviderSettings};
use crate::store::ScopedKey;

/// What the claim stage is to claim.
pub enum Plan {
    /// No key, and the provider forwards such deliveries without dedupe.
    Unkeyed,
    /// One identity per event, in body order (repeats included).
    Keyed(Vec<Identity>),
}

/// One event of the delivery: its scoped key and payload fingerprint.
pub struct Identity {
    pub key: ScopedKey,
    pub fingerprint: String,
    /// A batch element's exact bytes in the body; `None`: the whole body.
    pub range: Option<Range<usize>>,
}

impl Plan {
    /// The key as the delivery log shows it.
    pub fn label(identities: &[Identity]) -> String {
        match identities {
            [one] if one.range.is_none() => one.key.key.clone(),
            many => format!("batch of {}", many.len()),
        }
    }
}

/// Extracts the key (or a batch's keys) and fingerprints.
pub fn plan(settings: &ProviderSettings, request: &Request) -> Result<Plan, GateError> {
    let payload = Payload::new(&request.body, &request.head.headers);
    let identities = match &settings.key {
        Some(KeySource::Batch(pointer)) => payload
            .batch(pointer, settings.fingerprint, &settings.volatile_fields)
            .map_err(bad_payload)?
            .map(|items| {
                items
                    .into_iter()
                    .map(|item| Identity {
                        key: ScopedKey::new(&settings.name, item.key),
                        fingerprint: item.fingerprint,
                        range: Some(item.range),
                    })
                    .collect()
            }),
        Some(source) => source.extract(&payload).map_err(bad_payload)?.map(|key| {
            let fingerprint = payload.fingerprint(settings.fingerprint, &settings.volatile_fields);
            vec![Identity {
                key: ScopedKey::new(&settings.name, key),
                fingerprint,
                range: None,
            }]
        }),
        None => None,
    };
    match (identities, settings.on_missing_key) {
        (Some(identities), _) => Ok(Plan::Keyed(identities)),
        (None, OnMissingKey::Reject) => Err(GateError::MissingKey),
        (None, OnMissingKey::Forward) => Ok(Plan::Unkeyed),
    }
}

fn bad_payload(e: KeyError) -> GateError {
    GateError::BadPayload(e.to_string())
}
