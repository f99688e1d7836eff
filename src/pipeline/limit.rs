//! Stage 1, rate limit: the provider's bucket, then the source's. It runs
//! before the body is read, so a flood costs the gate as little as possible.

use std::net::IpAddr;

use http::{HeaderMap, HeaderName};

use crate::error::GateError;
use crate::gate::Provider;
use crate::ratelimit::{SourceLimit, source_ip};

/// Where a request comes from, as the per-source bucket sees it.
pub struct Source<'a> {
    pub limit: Option<&'a SourceLimit>,
    /// The trusted forwarding header, when the gate sits behind an ingress.
    pub header: Option<&'a HeaderName>,
    pub peer: IpAddr,
}

/// Takes a token from each bucket that applies; 429 when one is empty.
/// The source's bucket first: a source over its own rate is refused without
/// spending the provider's tokens, so one flooding address cannot empty the
/// bucket the provider's real deliveries draw from.
pub fn check(
    provider: &Provider,
    source: &Source<'_>,
    headers: &HeaderMap,
) -> Result<(), GateError> {
    if let Some(limit) = source.limit {
        let ip = source_ip(source.peer, headers, source.header);
        limit
            .check(ip)
            .map_err(|retry_after| GateError::RateLimited { retry_after })?;
    }
    if let Some(limit) = &provider.limit {
        limit
            .check()
            .map_err(|retry_after| GateError::RateLimited { retry_after })?;
    }
    Ok(())
}
