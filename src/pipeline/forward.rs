//! Stage 7, forward: the delivery to the application, byte for byte, with
//! the original headers minus hop-by-hop ones and the gate's own headers.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::Authority;
use http::{Request as HttpRequest, Version};

use super::read::Request;
use crate::body;
use crate::server::Conn;
use crate::settings::ProviderSettings;
use crate::store::ScopedKey;
use crate::telemetry::trace::StageSpan;
use crate::upstream::{Buffered, Upstream, UpstreamError, strip_hop_by_hop};

pub const EVENT_KEY: HeaderName = HeaderName::from_static("hookgate-event-key");
pub const PROVIDER: HeaderName = HeaderName::from_static("hookgate-provider");
const VERIFIED: HeaderName = HeaderName::from_static("hookgate-verified");
const BATCH: HeaderName = HeaderName::from_static("hookgate-batch");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// A partial batch: the body is not the signed one, so the signature
/// headers go and the app is told who verified it and what was left out.
pub struct PartialBatch {
    pub body: Bytes,
    pub forwarded: usize,
    pub duplicates: usize,
}

/// What is sent: the signed body (under the event's key, for one event),
/// or a body other than the signed one (under its key, for one element).
pub enum Payload {
    Signed(Option<ScopedKey>),
    Partial(PartialBatch, Option<ScopedKey>),
}

/// Sends the delivery and reads the app's answer, within `upstream.timeout`.
/// With traces on, the app's `traceparent` names `trace`, the forward span.
pub async fn send(
    upstream: &Upstream,
    settings: &ProviderSettings,
    request: &Request,
    conn: Conn,
    payload: Payload,
    trace: &StageSpan,
) -> Result<Buffered, UpstreamError> {
    let uri = upstream.target(&target(settings, request))?;
    let (mut headers, body) = outgoing(settings, request, conn, payload);
    trace.propagate(&mut headers);
    let mut req = HttpRequest::new(body::full(body));
    *req.method_mut() = request.head.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    upstream.call_buffered(&settings.name, req).await
}

/// The path and query the app gets: the path the provider is configured
/// with, not the request's spelling of it (routing found them the same,
/// crate::route, and the app must route it the same way too).
pub fn target(settings: &ProviderSettings, request: &Request) -> String {
    let path = settings.upstream_path.as_ref().unwrap_or(&settings.path);
    match request.head.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.clone(),
    }
}

/// The headers and body the app gets for `payload`.
pub fn outgoing(
    settings: &ProviderSettings,
    request: &Request,
    conn: Conn,
    payload: Payload,
) -> (HeaderMap, Bytes) {
    let mut headers = request.head.headers.clone();
    prepare_headers(&mut headers, conn, request.head.uri.authority());
    let name = HeaderValue::try_from(settings.name.as_str()).ok();
    if let Some(v) = &name {
        headers.insert(PROVIDER, v.clone());
    }
    let (key, body) = match payload {
        Payload::Signed(key) => (key, request.body.clone()),
        Payload::Partial(batch, key) => {
            for signature in settings.scheme.signature_headers() {
                headers.remove(signature);
            }
            headers.remove(header::CONTENT_LENGTH);
            if let Some(v) = name {
                headers.insert(VERIFIED, v);
            }
            let counts = format!(
                "forwarded={};duplicates={}",
                batch.forwarded, batch.duplicates
            );
            if let Ok(v) = HeaderValue::try_from(counts) {
                headers.insert(BATCH, v);
            }
            (key, batch.body)
        }
    };
    // Keys are validated printable text, so this cannot fail.
    if let Some(v) = key.and_then(|k| HeaderValue::try_from(k.to_string()).ok()) {
        headers.insert(EVENT_KEY, v);
    }
    (headers, body)
}

/// The headers every forwarded request gets, delivery or passthrough: no
/// hop-by-hop headers, no sender-supplied `Hookgate-*` headers (the app
/// trusts those), `Host` kept (from the HTTP/2 authority when there is no
/// `Host`), and the `X-Forwarded-*` pair.
pub fn prepare_headers(headers: &mut HeaderMap, conn: Conn, authority: Option<&Authority>) {
    strip_hop_by_hop(headers);
    let spoofed: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("hookgate-"))
        .cloned()
        .collect();
    for name in spoofed {
        headers.remove(name);
    }
    if !headers.contains_key(header::HOST)
        && let Some(v) = authority.and_then(|a| HeaderValue::try_from(a.as_str()).ok())
    {
        headers.insert(header::HOST, v);
    }
    let peer = conn.peer.ip().to_string();
    let forwarded_for = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prior) => format!("{prior}, {peer}"),
        None => peer,
    };
    if let Ok(v) = HeaderValue::try_from(forwarded_for) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    let proto = if conn.tls { "https" } else { "http" };
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
}
