//! Stages 3 and 4, verify and window: the signature against every active
//! secret, then the signed timestamp against the replay window.

use std::time::{SystemTime, UNIX_EPOCH};

use super::read::Request;
use crate::error::GateError;
use crate::gate::Provider;
use crate::provider::{Delivery, Verified};
use crate::settings::ProviderSettings;

/// Verifies the signature over the raw body (any active secret may match;
/// the match's index is returned for the rotation metric), then the window.
pub fn verify(provider: &Provider, request: &Request) -> Result<Verified, GateError> {
    let settings = &provider.settings;
    let secrets = provider.secrets.active(SystemTime::now());
    let delivery = Delivery {
        headers: &request.head.headers,
        body: &request.body,
        uri: &request.head.uri,
    };
    let verified = settings
        .scheme
        .verify(&delivery, &secrets)
        .map_err(|source| GateError::InvalidSignature {
            status: settings.reject_status,
            source,
        })?;
    window(settings, verified.timestamp)?;
    Ok(verified)
}

/// Rejects a signed timestamp more than `tolerance` in the past or more
/// than `future_tolerance` in the future. Schemes that sign no timestamp
/// rely on the dedupe store alone. Tolerances are bounded by the config,
/// so the conversions below cannot wrap.
fn window(settings: &ProviderSettings, timestamp: Option<i64>) -> Result<(), GateError> {
    let Some(signed) = timestamp else {
        return Ok(());
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let age = now.saturating_sub(signed);
    let too_old = age > settings.tolerance.as_secs() as i64;
    let too_new = -age > settings.future_tolerance.as_secs() as i64;
    if too_old || too_new {
        return Err(GateError::StaleTimestamp { skew_secs: age });
    }
    Ok(())
}
