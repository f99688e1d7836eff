//! Requests that are not deliveries (other paths, or handshake methods a
//! provider lists in `passthrough_methods`): proxied unchanged and streamed,
//! with no verification and no dedupe.

use std::future::Future;
use std::pin::Pin;

use http::{Request, Response, Version};
use hyper::body::Incoming;

use super::forward::prepare_headers;
use crate::body::{self, ProxyBody};
use crate::error::GateError;
use crate::gate::Gate;
use crate::server::Conn;
use crate::upstream::{UpstreamError, strip_hop_by_hop};

/// Proxies the request and streams the answer back.
///
/// The future is boxed: hyper keeps each connection's request handler
/// future for the connection's life, and this one (about 1.3 KiB) held
/// inline would make every connection that large, for a path most
/// deployments never take (docs/BENCHMARKS.md, finding 10).
pub fn forward(
    gate: &Gate,
    req: Request<Incoming>,
    conn: Conn,
) -> Pin<Box<dyn Future<Output = Response<ProxyBody>> + Send + '_>> {
    Box::pin(proxy(gate, req, conn))
}

async fn proxy(gate: &Gate, req: Request<Incoming>, conn: Conn) -> Response<ProxyBody> {
    match call(gate, req, conn).await {
        Ok(response) => response,
        Err(UpstreamError::Timeout(d)) => GateError::UpstreamTimeout(d).to_response(),
        Err(e) => {
            tracing::warn!(error = %e, "passthrough request failed");
            GateError::UpstreamUnreachable(e.to_string()).to_response()
        }
    }
}

async fn call(
    gate: &Gate,
    req: Request<Incoming>,
    conn: Conn,
) -> Result<Response<ProxyBody>, UpstreamError> {
    let (mut head, incoming) = req.into_parts();
    let pq = head.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let target = gate.upstream.target(pq)?;
    let authority = head.uri.authority().cloned();
    prepare_headers(&mut head.headers, conn, authority.as_ref());
    head.uri = target;
    head.version = Version::HTTP_11;
    let upstream_req = Request::from_parts(head, body::stream(incoming));
    let response = gate.upstream.call_streaming(upstream_req).await?;
    let (mut parts, incoming) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, body::stream(incoming)))
}
