//! HTTP/2 connections that stop asking, or stop reading. hyper's HTTP/2
//! server times nothing, so the gate watches each connection itself, once
//! every `server.read_timeout` (a period):
//!
//! - A connection with no stream open and nothing written for a whole
//!   period gets a GOAWAY (streams in flight finish, no new one starts);
//!   after another such period it is dropped, closing its socket. A stream
//!   is open from its request until its answer's body is handed to h2 in
//!   full or dropped; what h2 still has to send counts as written when it
//!   reaches the socket. A connection that asked nothing within its first
//!   period is cut off then.
//! - A connection whose answers wait on the client (their data handed
//!   over, the next part not asked for) and that writes nothing for
//!   `STALLED` periods is dropped: a client that reads nothing, or keeps
//!   its window at zero. An answer that waits on the app (a slow forward, a
//!   passthrough stream between events) does not count; a slow reader
//!   writes, so it does not either.
//!
//! Otherwise a client could hold its connection slot until shutdown with
//! one request, or none, and silence. What this does not bound: a client
//! that reads one answer keeps the others on its connection (32 streams at
//! most) open as long as it reads. HTTP/1 carries one request at a time,
//! and hyper times the wait for each next head; a client that stops
//! reading an HTTP/1 answer is bounded by TCP alone.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper::service::Service;
use hyper_util::server::graceful::{GracefulConnection, Watcher};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use crate::body::{BoxError, ProxyBody};

/// Periods in which answers may wait on a client that takes nothing before
/// its connection is dropped.
const STALLED: u32 = 2;

/// One connection's counts: streams open, whether one was open in this
/// period or ever, answers that wait on the client, bytes written.
#[derive(Default)]
pub(super) struct Streams {
    open: AtomicUsize,
    active: AtomicBool,
    asked: AtomicBool,
    handed: AtomicUsize,
    written: AtomicU64,
}

/// A stream counted open until dropped.
struct Open(Arc<Streams>);

impl Open {
    fn new(streams: Arc<Streams>) -> Self {
        streams.open.fetch_add(1, Ordering::SeqCst);
        streams.active.store(true, Ordering::SeqCst);
        streams.asked.store(true, Ordering::SeqCst);
        Self(streams)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Drives `conn` until it ends, looking at it once every `limit` (see the
/// module doc). At the shutdown a connection that never asked is let go at
/// once, any other gets a GOAWAY and the gate's grace bounds the wait.
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
    let mut tick = tokio::time::interval_at(Instant::now() + limit, limit);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut written = streams.written.load(Ordering::SeqCst);
    let mut going_away = false;
    let mut still = 0;
    loop {
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
            _ = tick.tick() => {}
        }
        if !streams.asked.load(Ordering::SeqCst) {
            return Err("no request within the read timeout".into());
        }
        let now = streams.written.load(Ordering::SeqCst);
        let wrote = now != written;
        written = now;
        if streams.handed.load(Ordering::SeqCst) > 0 && !wrote {
            still += 1;
            if still >= STALLED {
                return Err("its answers wait on a client that takes nothing".into());
            }
        } else {
            still = 0;
        }
        let active =
            streams.active.swap(false, Ordering::SeqCst) || streams.open.load(Ordering::SeqCst) > 0;
        if active || wrote {
            continue;
        }
        if going_away {
            return Err("nothing open or written since its GOAWAY, and still not closed".into());
        }
        conn.as_mut().graceful_shutdown();
        going_away = true;
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
/// says when it has handed data over and waits to be asked for more.
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

/// A connection's socket, counting the bytes written to it (`Streams`).
pub(super) struct Written<I> {
    io: I,
    streams: Arc<Streams>,
}

impl<I> Written<I> {
    pub(super) fn new(io: I, streams: Arc<Streams>) -> Self {
        Self { io, streams }
    }

    fn count(&self, written: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = written {
            self.streams.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
    }
}

impl<I: Read + Unpin> Read for Written<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: Write + Unpin> Write for Written<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.count(&written);
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.count(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
