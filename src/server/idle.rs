//! HTTP/2 connections that stop asking. hyper's HTTP/2 server times
//! nothing, so the gate counts each connection's open streams itself, from
//! the request until its answer's body is done or dropped, and closes a
//! connection that has had none open for as long as a request head may
//! take (`server.read_timeout`): otherwise a client could hold its
//! connection slot until shutdown with one request, or none, and silence.
//! HTTP/1 needs none of this: hyper times the wait for each next head.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::Service;
use hyper_util::server::graceful::{GracefulConnection, Watcher};
use tokio::sync::{Notify, watch};

use crate::body::{BoxError, ProxyBody};

/// One connection's streams: how many are open, whether any ever was, and
/// a wake-up for each change.
#[derive(Default)]
pub(super) struct Streams {
    open: AtomicUsize,
    asked: AtomicBool,
    changed: Notify,
}

/// A stream counted open until dropped.
struct Open(Arc<Streams>);

impl Open {
    fn new(streams: Arc<Streams>) -> Self {
        streams.open.fetch_add(1, Ordering::SeqCst);
        streams.asked.store(true, Ordering::SeqCst);
        streams.changed.notify_one();
        Self(streams)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_one();
    }
}

/// Drives `conn` until it ends. Once no stream has been open for `limit`,
/// or at the shutdown, it is shut down gracefully (a GOAWAY: streams in
/// flight finish, no new one starts). A connection that never asked
/// anything is cut off at once; one that asked and then takes another
/// `limit` to end with nothing open is dropped, closing its socket; at the
/// shutdown the gate's grace bounds the wait. `watcher` is held until the
/// end, so that the shutdown's drain waits for this connection too.
pub(super) async fn serve<C>(
    mut conn: Pin<Box<C>>,
    streams: &Streams,
    limit: Duration,
    watcher: Watcher,
    mut stopping: watch::Receiver<bool>,
) -> Result<(), BoxError>
where
    C: GracefulConnection<Error = BoxError>,
{
    let shutting_down = loop {
        let quiet = streams.open.load(Ordering::SeqCst) == 0;
        tokio::select! {
            ended = conn.as_mut() => return ended,
            // A stream opened or closed: look again, the timer anew.
            () = streams.changed.notified() => {}
            () = tokio::time::sleep(limit), if quiet => break false,
            _ = stopping.wait_for(|stop| *stop) => break true,
        }
    };
    if !shutting_down && !streams.asked.load(Ordering::SeqCst) {
        return Err("no request within the read timeout".into());
    }
    conn.as_mut().graceful_shutdown();
    let ended = if shutting_down {
        conn.await
    } else {
        tokio::time::timeout(limit, conn).await.unwrap_or(Ok(()))
    };
    drop(watcher);
    ended
}

/// The gate's service, with each request counted open (`Streams`) until
/// its answer's body is done or dropped.
pub(super) struct Counting<S> {
    inner: S,
    streams: Arc<Streams>,
}

impl<S> Counting<S> {
    pub(super) fn new(inner: S, streams: Arc<Streams>) -> Self {
        Self { inner, streams }
    }
}

impl<S> Service<Request<Incoming>> for Counting<S>
where
    S: Service<Request<Incoming>, Response = Response<ProxyBody>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let open = Open::new(Arc::clone(&self.streams));
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| Counted { body, _open: open }.boxed()))
        })
    }
}

/// An answer's body that keeps its stream counted open while it lasts.
struct Counted {
    body: ProxyBody,
    _open: Open,
}

impl Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
