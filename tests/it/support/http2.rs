//! HTTP/2 clients of the gate (prior knowledge), and requests for them.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::fixture::Gate;
use super::gate::stripe_event;

/// A client that speaks HTTP/2 only (prior knowledge): one connection for
/// every request it sends.
pub fn http2_client() -> H2Client {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

pub type H2Client = Client<HttpConnector, Full<Bytes>>;

/// `body` signed for the gate's first provider, to its path.
pub fn signed_request(gate: &Gate, body: &[u8]) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::post(format!("http://{}{}", gate.addr, gate.path()));
    for (k, v) in gate.sign(body) {
        req = req.header(k, v);
    }
    req.body(Full::new(Bytes::copy_from_slice(body))).unwrap()
}

/// One HTTP/2 connection (prior knowledge) to the gate, driven by a task of
/// its own, which ends when the connection does.
pub async fn http2_connection(
    gate: &Gate,
) -> (
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<hyper::Result<()>>,
) {
    let tcp = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    (send, tokio::spawn(conn))
}

/// Sends `n` signed events (ids `{prefix}0`, `{prefix}1`, ...) at once over
/// `client`'s one connection and asserts that each was forwarded.
pub async fn forward_all_at_once(client: &H2Client, gate: &Gate, prefix: &str, n: usize) {
    let sends = (0..n)
        .map(|i| client.request(signed_request(gate, &stripe_event(&format!("{prefix}{i}")))));
    for response in futures_util::future::join_all(sends).await {
        let response = response.expect("an answer over HTTP/2");
        assert_eq!(response.headers()["hookgate-result"], "forwarded");
        let _ = response.into_body().collect().await.unwrap();
    }
}
