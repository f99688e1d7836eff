//! Phase 2, rate limit: the provider's bucket, then the source's. It runs
//! before the body is read, so a flood costs the gate as little as possible.

use super::Context;
use crate::error::GateError;
use crate::ratelimit::source_ip;

/// Takes a token from each bucket that applies; 429 when one is empty.
pub fn check(cx: &Context) -> Result<(), GateError> {
    if let Some(limit) = &cx.provider().limit {
        limit
            .check()
            .map_err(|retry_after| GateError::RateLimited { retry_after })?;
    }
    if let Some(limit) = &cx.gate.source_limit {
        let header = cx.gate.settings.server.client_ip_header.as_ref();
        let source = source_ip(cx.conn.peer.ip(), &cx.head.headers, header);
        limit
            .check(source)
            .map_err(|retry_after| GateError::RateLimited { retry_after })?;
    }
    Ok(())
}
