//! Phase 1, read: the raw body, at most `server.max_body_bytes`, within
//! `server.read_timeout`. The bytes are kept exactly: they are what is
//! verified and what is forwarded.

use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;

use super::Context;
use crate::error::GateError;

/// Reads the whole body. A declared length over the limit is refused before
/// a byte is read; a body that grows past it is cut off as soon as it does.
pub async fn body(cx: &Context, incoming: Incoming) -> Result<Bytes, GateError> {
    let server = &cx.gate.settings.server;
    let limit = server.max_body_bytes;
    let declared = cx
        .head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(GateError::PayloadTooLarge { limit });
    }
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    let read = Limited::new(incoming, limit_usize).collect();
    match tokio::time::timeout(server.read_timeout, read).await {
        Err(_) => Err(GateError::RequestTimeout),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(GateError::PayloadTooLarge { limit }),
        Ok(Err(e)) => Err(GateError::BadPayload(format!(
            "body could not be read: {e}"
        ))),
    }
}
