//! The application every row talks to: reads the whole body and answers
//! 200 `{"ok":true}`. A plain hyper HTTP/1.1 server, as small as an app can
//! be, so that the rows differ only in what sits in front of it.
//!
//! It counts the POSTs it answers (what queue mode's relay delivered), and
//! one started with `--hold` keeps every POST waiting until it is released:
//! the relay's drain is timed from the release. Two paths of its own, which
//! are neither counted nor held:
//!
//! - `GET /_bench/stats`: `count retries last_ns arrived` (POSTs answered,
//!   those with `Hookgate-Attempt` other than 1, the nanoseconds from the
//!   release, or from the start when never held, to the last answered
//!   POST, and the POSTs received, held ones included);
//! - `POST /_bench/release`: answers every held POST, holds no more.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

const ANSWER: &[u8] = br#"{"ok":true}"#;
pub const STATS: &str = "/_bench/stats";
pub const RELEASE: &str = "/_bench/release";

struct State {
    count: AtomicU64,
    arrived: AtomicU64,
    retries: AtomicU64,
    /// Nanoseconds from the release (or the start) to the latest POST.
    last_ns: AtomicU64,
    start: Instant,
    /// Nanoseconds from `start` to the release.
    released_at: AtomicU64,
    /// POSTs wait for the release (the fast path of an app never held).
    held: AtomicBool,
    released: watch::Sender<bool>,
}

fn nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Serves until the process is killed.
pub fn serve(listen: SocketAddr, threads: usize, hold: bool) -> std::io::Result<()> {
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    let state = Arc::new(State {
        count: AtomicU64::new(0),
        arrived: AtomicU64::new(0),
        retries: AtomicU64::new(0),
        last_ns: AtomicU64::new(0),
        start: Instant::now(),
        released_at: AtomicU64::new(0),
        held: AtomicBool::new(hold),
        released: watch::Sender::new(!hold),
    });
    runtime.block_on(async move {
        let listener = TcpListener::bind(listen).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let service = service_fn(move |req| answer(Arc::clone(&state), req));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

async fn answer(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let first_attempt = req
        .headers()
        .get("hookgate-attempt")
        .is_none_or(|v| v.as_bytes() == b"1");
    // An app reads what it is sent; a failed read still gets its answer.
    let _ = req.into_body().collect().await;
    match (method, path.as_str()) {
        (Method::GET, STATS) => {
            let text = format!(
                "{} {} {} {}\n",
                state.count.load(Ordering::SeqCst),
                state.retries.load(Ordering::SeqCst),
                state.last_ns.load(Ordering::SeqCst),
                state.arrived.load(Ordering::SeqCst),
            );
            return Ok(Response::new(Full::new(Bytes::from(text))));
        }
        (Method::POST, RELEASE) => {
            state
                .released_at
                .store(nanos(state.start), Ordering::SeqCst);
            state.last_ns.store(0, Ordering::SeqCst);
            state.held.store(false, Ordering::SeqCst);
            state.released.send_replace(true);
            return Ok(Response::new(Full::new(Bytes::from_static(b"released\n"))));
        }
        (Method::POST, _) => {
            state.arrived.fetch_add(1, Ordering::SeqCst);
            if state.held.load(Ordering::SeqCst) {
                let mut released = state.released.subscribe();
                let _ = released.wait_for(|r| *r).await;
            }
            let ns = nanos(state.start).saturating_sub(state.released_at.load(Ordering::SeqCst));
            state.last_ns.fetch_max(ns, Ordering::SeqCst);
            if !first_attempt {
                state.retries.fetch_add(1, Ordering::SeqCst);
            }
            state.count.fetch_add(1, Ordering::SeqCst);
        }
        _ => {}
    }
    let mut response = Response::new(Full::new(Bytes::from_static(ANSWER)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
