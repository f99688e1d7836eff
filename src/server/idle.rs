//! HTTP/2 connections that stop asking, or stop reading. hyper's HTTP/2
//! server times nothing, so the gate watches each connection itself:
//!
//! - it counts the open streams, from the request until its answer's body
//!   is done or dropped, and closes a connection that has had none open
//!   for as long as a request head may take (`server.read_timeout`);
//! - it notes each time hyper asks an answer's body for more, and drops a
//!   connection whose answers wait on the client (their data handed over,
//!   not asked for again: a client that reads nothing, or set its window
//!   to zero) with nothing asked for over `STALLED` of those periods.
//!
//! Otherwise a client could hold its connection slot until shutdown with
//! one request, or none, and silence. An answer that waits on the app (a
//! slow forward, a passthrough stream between events) is not stalled.
//! HTTP/1 needs none of this: hyper times the wait for each next head, and
//! a connection carries one request at a time.

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

/// Periods of `server.read_timeout` that answers may wait on a client that
/// asks for nothing before its connection is dropped.
const STALLED: u32 = 2;

/// One connection's streams: how many are open, whether any ever was, how
/// many answers have handed data over and wait to be asked again, how often
/// any was asked, and a wake-up for each opened or closed stream.
#[derive(Default)]
pub(super) struct Streams {
    open: AtomicUsize,
    asked: AtomicBool,
    handed: AtomicUsize,
    polls: AtomicUsize,
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
/// it is shut down gracefully (a GOAWAY: streams in flight finish, no new
/// one starts), and dropped, closing its socket, if it then has none open
/// for another `limit`. A connection that never asked anything is cut off
/// at `limit`, one whose answers wait on it (`STALLED`) at once; at the
/// shutdown it gets a GOAWAY and the gate's grace bounds the wait.
/// `watcher` is held until the end, so that the shutdown's drain waits for
/// this connection too.
pub(super) async fn serve<C>(
    mut conn: Pin<Box<C>>,
    streams: &Streams,
    limit: Duration,
    _watcher: Watcher,
    mut stopping: watch::Receiver<bool>,
) -> Result<(), BoxError>
where
    C: GracefulConnection<Error = BoxError>,
{
    let mut going_away = false;
    let mut polls = streams.polls.load(Ordering::SeqCst);
    let mut still = 0;
    loop {
        let quiet = streams.open.load(Ordering::SeqCst) == 0;
        // Biased: a stream the connection opens in this poll wakes
        // `changed` before the timer is looked at.
        tokio::select! {
            biased;
            ended = conn.as_mut() => return ended,
            () = stopped(&mut stopping) => {
                if !streams.asked.load(Ordering::SeqCst) {
                    return Ok(());
                }
                conn.as_mut().graceful_shutdown();
                return conn.await;
            }
            () = streams.changed.notified() => still = 0,
            () = tokio::time::sleep(limit) => {
                if quiet {
                    if !streams.asked.load(Ordering::SeqCst) {
                        return Err("no request within the read timeout".into());
                    }
                    if going_away {
                        return Err("no stream open since the GOAWAY, and still not closed".into());
                    }
                    conn.as_mut().graceful_shutdown();
                    going_away = true;
                    continue;
                }
                let now = streams.polls.load(Ordering::SeqCst);
                if now != polls || streams.handed.load(Ordering::SeqCst) == 0 {
                    (polls, still) = (now, 0);
                } else {
                    still += 1;
                    if still >= STALLED {
                        return Err("its answers wait on a client that reads nothing".into());
                    }
                }
            }
        }
    }
}

/// Once the gate is shutting down (or the flag's sender is gone).
async fn stopped(stopping: &mut watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
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
            Ok(response.map(|body| {
                Counted {
                    body,
                    open,
                    handed: false,
                }
                .boxed()
            }))
        })
    }
}

/// An answer's body that keeps its stream counted open while it lasts, and
/// says when it has handed data over and waits to be asked again.
struct Counted {
    body: ProxyBody,
    open: Open,
    handed: bool,
}

impl Counted {
    fn hand(&mut self, handed: bool) {
        if self.handed != handed {
            self.handed = handed;
            let count = &self.open.0.handed;
            if handed {
                count.fetch_add(1, Ordering::SeqCst);
            } else {
                count.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.hand(false);
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.open.0.polls.fetch_add(1, Ordering::Relaxed);
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        // Data handed over waits on the client; a pending body waits on
        // the app, an ended one on nothing.
        self.hand(matches!(frame, Poll::Ready(Some(Ok(_)))));
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
