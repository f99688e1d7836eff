//! Listeners: the accept loop, HTTP/1.1 and HTTP/2 on one port, and
//! graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use crate::body::ProxyBody;

/// Limits applied to every connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    /// How long a client may take to send the request head.
    pub header_read_timeout: Duration,
    /// How long in-flight requests get once shutdown starts.
    pub grace: Duration,
    /// Connections served at once; further ones wait in the backlog.
    pub max_connections: usize,
    /// The most a request head may take (HTTP/1 buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
}

/// Who is on the other end of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Conn {
    pub peer: SocketAddr,
    /// Whether the connection came in over TLS (`X-Forwarded-Proto`).
    pub tls: bool,
}

/// Serves `handler` on `listener` (over TLS when an acceptor is given)
/// until `shutdown` flips, then stops accepting and gives open connections
/// `grace` to finish.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    handler: F,
    mut shutdown: watch::Receiver<bool>,
    limits: ConnLimits,
) where
    F: Fn(Request<Incoming>, Conn) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        // At the connection limit, stop accepting: the kernel's backlog
        // holds the rest, which is gentler than accepting and dropping.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            _ = shutdown.changed() => break,
        };
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
                let conn = Conn { peer, tls: tls.is_some() };
                let handler = handler.clone();
                let service = service_fn(move |req| {
                    // The handler's future is made inside the block: one
                    // made outside and awaited inside would be held twice
                    // in hyper's per-connection state.
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(req, conn).await) }
                });
                let builder = builder.clone();
                let watcher = graceful.watcher();
                let tls = tls.clone();
                let handshake_timeout = limits.header_read_timeout;
                tokio::spawn(async move {
                    let result = match tls {
                        None => {
                            let conn = builder.serve_connection(TokioIo::new(stream), service);
                            watcher.watch(conn.into_owned()).await
                        }
                        Some(acceptor) => {
                            // A client that never finishes the handshake is
                            // cut off like one that never sends its head.
                            let accepted =
                                tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await;
                            match accepted {
                                Ok(Ok(stream)) => {
                                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                                    watcher.watch(conn.into_owned()).await
                                }
                                Ok(Err(e)) => Err(e.into()),
                                Err(_) => Err("TLS handshake timed out".into()),
                            }
                        }
                    };
                    if let Err(e) = result {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                    drop(slot);
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
