//! The admin listener: `/healthz` (the process runs) and `/readyz` (the
//! store answers).

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;

use crate::body::{ProxyBody, full};
use crate::gate::Gate;
use crate::store::Backend;

pub async fn handle(gate: Arc<Gate>, req: Request<Incoming>) -> Response<ProxyBody> {
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/metrics" => {
            let mut response = Response::new(full(gate.metrics.encode()));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        "/readyz" => match gate.store.ping().await {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(e) => {
                tracing::warn!(error = %e, "not ready: store unavailable");
                text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
            }
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
