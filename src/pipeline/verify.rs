//! Phases 2 and 3, verify and window: the signature against every active
//! secret, then the signed timestamp against the replay window.

use std::time::{SystemTime, UNIX_EPOCH};

use super::Context;
use crate::error::GateError;
use crate::provider::{Delivery, Verified};

/// Verifies the signature over the raw body. Any active secret may match;
/// the matching one's index is recorded for the rotation metric.
pub fn signature(cx: &mut Context) -> Result<Verified, GateError> {
    let provider = cx.provider();
    let secrets = provider.secrets.active(SystemTime::now());
    let delivery = Delivery {
        headers: &cx.head.headers,
        body: &cx.body,
        uri: &cx.head.uri,
    };
    let result = provider.settings.scheme.verify(&delivery, &secrets);
    let status = provider.settings.reject_status;
    match result {
        Ok(verified) => {
            cx.record.verification = "ok";
            cx.record.secret_index = Some(verified.secret_index);
            Ok(verified)
        }
        Err(source) => Err(GateError::InvalidSignature { status, source }),
    }
}

/// Rejects a signed timestamp more than `tolerance` in the past or more
/// than `future_tolerance` in the future. Schemes that sign no timestamp
/// rely on the dedupe store alone.
pub fn window(cx: &Context, timestamp: Option<i64>) -> Result<(), GateError> {
    let Some(signed) = timestamp else {
        return Ok(());
    };
    let settings = &cx.provider().settings;
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
