//! The one body type the gate sends and receives, and helpers to build it.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};

/// Errors of a boxed body: hyper's for streamed bodies, none for buffered ones.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request or response body: buffered deliveries and streamed passthrough
/// traffic share it, so one client and one server serve both.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A buffered body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// A streamed body, passed on as it arrives.
pub fn stream(body: hyper::body::Incoming) -> ProxyBody {
    body.map_err(BoxError::from).boxed()
}
