//! Listeners: the accept loop, HTTP/1.1 and HTTP/2 on one port, and
//! graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::body::ProxyBody;

/// Limits applied to every connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// How long a client may take to send the request head.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get once shutdown starts.
    pub grace: Duration,
}

/// Serves `handler` on `listener` until `shutdown` flips, then stops
/// accepting and gives open connections `grace` to finish.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    handler: F,
    mut shutdown: watch::Receiver<bool>,
    limits: ConnLimits,
) where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of descriptors and the like: back off, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let service = service_fn(move |req| {
                    let response = handler(req, peer);
                    async move { Ok::<_, Infallible>(response.await) }
                });
                let conn = graceful.watch(
                    builder.serve_connection(TokioIo::new(stream), service).into_owned(),
                );
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(limits.grace) => {
            tracing::warn!("shutdown grace elapsed with connections still open");
        }
    }
}
