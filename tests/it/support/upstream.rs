//! A real upstream on port 0 that records what it receives and can be told
//! to fail or stall (svix's `TestReceiver`, in spirit).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// One request as the app saw it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The status the app answered (decided when the request arrived).
    pub status: u16,
}

/// How the app answers the next requests.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// Answer `status` with a JSON body naming the call number.
    Status(u16),
    /// Wait, then answer 200.
    Stall(Duration),
    /// Answer `status` with a body of `bytes` bytes of `x`.
    Large { status: u16, bytes: usize },
    /// A flaky app, for chaos tests: `fail_percent` of calls answer 500 at
    /// once, `stall_percent` wait `stall` and then answer 503 (the app gave
    /// up on work the gate had already timed out on), the rest answer 200.
    /// Which call does what is a fixed pseudo-random function of its number.
    Random {
        fail_percent: u64,
        stall_percent: u64,
        stall: Duration,
    },
    /// Down: every connection is closed without an answer, new ones at
    /// once, kept-alive ones at their next request. Nothing is recorded.
    Down,
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    behavior: Option<Behavior>,
    in_flight: usize,
    peak_in_flight: usize,
}

/// The recording upstream; dropped with the test.
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Upstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                if matches!(shared.lock().unwrap().behavior, Some(Behavior::Down)) {
                    continue;
                }
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |req| answer(Arc::clone(&state), req));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, behavior: Behavior) {
        self.state.lock().unwrap().behavior = Some(behavior);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    pub fn count(&self) -> usize {
        self.state.lock().unwrap().received.len()
    }

    /// The most requests the app was handling at once.
    pub fn peak_in_flight(&self) -> usize {
        self.state.lock().unwrap().peak_in_flight
    }
}

/// The app's answer; an error closes the connection unanswered (`Down`).
async fn answer(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    if matches!(state.lock().unwrap().behavior, Some(Behavior::Down)) {
        return Err(std::io::Error::other("the app is down"));
    }
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (n, status, stall) = {
        let mut s = state.lock().unwrap();
        let n = s.received.len() + 1;
        let (status, stall) = match s.behavior.clone().unwrap_or(Behavior::Status(200)) {
            Behavior::Status(status) | Behavior::Large { status, .. } => (status, None),
            // Checked before the body was read; it went down meanwhile.
            Behavior::Down => (503, None),
            Behavior::Stall(d) => (200, Some(d)),
            Behavior::Random {
                fail_percent,
                stall_percent,
                stall,
            } => match scramble(n as u64) % 100 {
                r if r < fail_percent => (500, None),
                r if r < fail_percent + stall_percent => (503, Some(stall)),
                _ => (200, None),
            },
        };
        s.received.push(Received {
            method: parts.method,
            uri: parts.uri.to_string(),
            headers: parts.headers,
            body,
            status,
        });
        s.in_flight += 1;
        s.peak_in_flight = s.peak_in_flight.max(s.in_flight);
        (n, status, stall)
    };
    if let Some(d) = stall {
        tokio::time::sleep(d).await;
    }
    state.lock().unwrap().in_flight -= 1;
    let body = match state.lock().unwrap().behavior {
        Some(Behavior::Large { bytes, .. }) => "x".repeat(bytes),
        _ => format!("{{\"call\":{n},\"status\":{status}}}"),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
        .headers_mut()
        .insert("x-app", "recorded".parse().unwrap());
    Ok(response)
}

/// A fixed bijective scramble of the call number (splitmix64's finalizer):
/// spreads `Behavior::Random`'s failures evenly without a random source.
fn scramble(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
