//! Talking to a gate over real HTTP, and signing what is sent to it as a
//! real sender would. (`fixture` sets gates up.)

use std::net::SocketAddr;

use bytes::Bytes;
use hookgate::provider::Scheme;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The test secret `GateFixture::stripe()` configures and signs with.
pub const SECRET: &str = "whsec_test_secret_do_not_log_5f3a9c";

/// An HTTP answer, fully read.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The `Hookgate-Result` header.
    pub fn result(&self) -> &str {
        self.headers
            .get("hookgate-result")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(String, String)],
    body: impl Into<Bytes>,
) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req.body(Full::new(body.into())).unwrap();
    let response = client().request(req).await.expect("the gate answers");
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

pub async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Answer {
    send(
        addr,
        Method::POST,
        path,
        headers,
        Bytes::copy_from_slice(body),
    )
    .await
}

/// The head of an HTTP/1.1 POST to `path` as it goes on the wire, for
/// tests that write to the socket themselves: `host`, `content-length`,
/// `extra` (header lines, each ending in CRLF), then `headers`.
pub fn raw_head(
    path: &str,
    extra: &str,
    headers: &[(String, String)],
    content_length: usize,
) -> String {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: gate\r\ncontent-length: {content_length}\r\n{extra}"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// Asserts that a raw HTTP/1.1 answer is a 200 that the app answered.
pub fn assert_raw_forwarded(answer: &str) {
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("hookgate-result: forwarded"),
        "{answer:?}"
    );
}

/// A delivery of `body` to `path` that stops halfway: its head, asking for
/// `100 Continue` (so that the gate is known to be reading the body once
/// it comes), then half the body. The caller hangs up by dropping the
/// connection, or holds it open. Blocking: call it off the runtime.
pub fn half_sent(
    addr: SocketAddr,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> std::net::TcpStream {
    use std::io::{Read, Write};

    let head = raw_head(path, "expect: 100-continue\r\n", headers, body.len());
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut byte = [0; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = stream
            .read(&mut byte)
            .expect("the gate answers 100 Continue once it reads the body");
        assert_eq!(n, 1, "closed: {:?}", String::from_utf8_lossy(&got));
        got.push(byte[0]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    stream.write_all(&body[..body.len() / 2]).unwrap();
    stream
}

/// Headers a real sender of `scheme` would attach, signed now (or at `at`).
pub fn signed(
    scheme: &Scheme,
    secret: &str,
    body: &[u8],
    id: &str,
    at: Option<i64>,
) -> Vec<(String, String)> {
    let now = at.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    });
    let mut headers = scheme.sign(secret.as_bytes(), body, id, now);
    headers.push(("content-type".into(), "application/json".into()));
    headers
}

/// A Stripe-like event body.
pub fn stripe_event(id: &str) -> Vec<u8> {
    format!("{{\n  \"id\": \"{id}\",\n  \"object\": \"event\",\n  \"type\": \"charge.succeeded\",\n  \"data\": {{\"amount\": 4200}}\n}}\n").into_bytes()
}
