//! HTTP/2 connections that stop asking, or stop reading. hyper's HTTP/2
//! server times nothing, so the gate watches each connection itself, once
//! every `server.read_timeout` (a period):
//!
//! - A connection with no stream open for a whole period gets a GOAWAY
//!   (streams in flight finish, no new one starts), and is dropped, closing
//!   its socket, once it has had none open for `STALLED` periods more:
//!   time for h2 to send what it holds of the last answers. A stream is
//!   open from its request until the last slice of its answer is handed to
//!   h2, or it is dropped. A connection that asked nothing within its first period
//!   is cut off then.
//! - An answer that has handed data over and not been asked for more for
//!   `STALLED` whole periods waits on a client that takes nothing (reads
//!   nothing, or keeps its window at zero): its connection is dropped, as
//!   nginx's `send_timeout` does. Answers are handed over in slices of 16
//!   KiB (`SLICE`), so a reader that takes 16 KiB in that time is asked
//!   again; an answer that waits on the app (a slow forward, a passthrough
//!   stream between events) is not waiting on the client.
//!
//! Otherwise a client could hold its connection slot until shutdown with
//! one request, or none, and silence. HTTP/1 carries one request at a time
//! and hyper times the wait for each next head; a client that stops
//! reading an answer is found below HTTP, by a write to its socket that
//! waits `STALLED` periods (`super::send`).

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
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use crate::body::{BoxError, ProxyBody};

/// Periods an answer may wait on the client, and a connection with no
/// stream open may take to close after its GOAWAY, before it is dropped.
pub(super) const STALLED: usize = 2;

/// Answers waiting on the client are kept by the period in which they
/// started to: the `STALLED` last periods, the current one, and the one
/// checked at the next tick.
const RING: usize = STALLED + 2;

/// One connection's counts: streams open, whether one was open in this
/// period or ever, the period (counted from 0), and the answers that wait
/// on the client by the period they started to wait in (`RING`).
#[derive(Default)]
pub(super) struct Streams {
    open: AtomicUsize,
    active: AtomicBool,
    asked: AtomicBool,
    period: AtomicUsize,
    waiting: [AtomicUsize; RING],
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
        // The period a stream closes in had a stream open.
        self.0.active.store(true, Ordering::SeqCst);
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
    // Periods with no stream open since the GOAWAY, once it is sent.
    let mut since_goaway = None;
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
        // A new period; the answers that started to wait `STALLED` whole
        // periods before it still wait.
        let period = streams.period.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(then) = period.checked_sub(STALLED + 1)
            && streams.waiting[then % RING].load(Ordering::SeqCst) > 0
        {
            return Err("its answers wait on a client that takes nothing".into());
        }
        let active =
            streams.active.swap(false, Ordering::SeqCst) || streams.open.load(Ordering::SeqCst) > 0;
        since_goaway = match (active, since_goaway) {
            (true, Some(_)) => Some(0),
            (true, None) => None,
            (false, None) => {
                conn.as_mut().graceful_shutdown();
                Some(0)
            }
            (false, Some(quiet)) if quiet + 1 >= STALLED => {
                return Err("nothing open since its GOAWAY, and still not closed".into());
            }
            (false, Some(quiet)) => Some(quiet + 1),
        };
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
            Ok(response.map(|body| Counted::new(body, open).boxed()))
        })
    }
}

/// The most of an answer handed to h2 at once. h2 asks a body for more
/// only once the client's window covers what it was handed; in slices of
/// this size (h2's default frame size) a reader that takes anything is
/// asked again within a period, and the stream stays open until the last
/// slice is handed over.
const SLICE: usize = 16 * 1024;

/// An answer's body that keeps its stream counted open while it lasts,
/// hands its data over in slices (`SLICE`), and counts itself waiting on
/// the client from the period in which it handed a slice over until it is
/// asked for more.
struct Counted {
    body: ProxyBody,
    open: Open,
    /// What is left of the last data frame, after the slice handed over.
    rest: Bytes,
    waiting_since: Option<usize>,
}

impl Counted {
    fn new(body: ProxyBody, open: Open) -> Self {
        Self {
            body,
            open,
            rest: Bytes::new(),
            waiting_since: None,
        }
    }

    fn stop_waiting(&mut self) {
        if let Some(period) = self.waiting_since.take() {
            self.open.0.waiting[period % RING].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Hands a slice of `data` over, keeping the rest, and waits.
    fn hand(&mut self, mut data: Bytes) -> Frame<Bytes> {
        if data.len() > SLICE {
            self.rest = data.split_off(SLICE);
        }
        let streams = &self.open.0;
        let period = streams.period.load(Ordering::SeqCst);
        streams.waiting[period % RING].fetch_add(1, Ordering::SeqCst);
        self.waiting_since = Some(period);
        Frame::data(data)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.stop_waiting();
    }
}

impl Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Asked for more: whatever it handed over was taken.
        self.stop_waiting();
        if !self.rest.is_empty() {
            let rest = std::mem::take(&mut self.rest);
            return Poll::Ready(Some(Ok(self.hand(rest))));
        }
        // Data handed over waits on the client; a pending body waits on
        // the app, an ended one (or trailers) on nothing.
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Poll::Ready(Some(Ok(self.hand(data)))),
                Err(trailers) => Poll::Ready(Some(Ok(trailers))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.body.size_hint();
        let rest = self.rest.len() as u64;
        hint.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}
