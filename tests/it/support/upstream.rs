//! A real upstream on port 0 that records what it receives and can be told
//! to fail or stall (svix's `TestReceiver`, in spirit).

use std::convert::Infallible;
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
}

/// How the app answers the next requests.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// Answer `status` with a JSON body naming the call number.
    Status(u16),
    /// Wait, then answer 200.
    Stall(Duration),
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    behavior: Option<Behavior>,
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
}

async fn answer(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (n, behavior) = {
        let mut s = state.lock().unwrap();
        s.received.push(Received {
            method: parts.method,
            uri: parts.uri.to_string(),
            headers: parts.headers,
            body,
        });
        (s.received.len(), s.behavior.clone())
    };
    let status = match behavior.unwrap_or(Behavior::Status(200)) {
        Behavior::Status(s) => s,
        Behavior::Stall(d) => {
            tokio::time::sleep(d).await;
            200
        }
    };
    let body = format!("{{\"call\":{n},\"status\":{status}}}");
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
