//! TLS: the listener serves a certificate from files (reloaded when they
//! change), and https upstreams are trusted through `upstream.ca_file`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::support::fixture::{Gate, GateFixture, StoreConfig};
use crate::support::gate::{assert_raw_forwarded, raw_head, stripe_event};
use crate::support::upstream::Behavior;

/// Writes a self-signed certificate for `localhost`; returns its PEM.
fn write_cert(dir: &Path) -> String {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let pem = generated.cert.pem();
    std::fs::write(dir.join("tls.crt"), &pem).unwrap();
    std::fs::write(dir.join("tls.key"), generated.signing_key.serialize_pem()).unwrap();
    pem
}

fn tls_section(dir: &Path) -> String {
    format!(
        "tls = {{ cert = \"{}\", key = \"{}\" }}\n",
        dir.join("tls.crt").display(),
        dir.join("tls.key").display()
    )
}

/// A Stripe gate serving TLS with a fresh self-signed certificate, `extra`
/// in its `[server]`; the certificate's PEM.
async fn tls_gate(extra: &str) -> (Gate, String) {
    let fixture = GateFixture::stripe();
    let dir = fixture.dir().to_owned();
    let pem = write_cert(&dir);
    let server = format!("{}{extra}", tls_section(&dir));
    (fixture.server_extra(&server).start().await, pem)
}

/// A client's TLS settings, trusting exactly `pem`.
fn trusting(pem: &str) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pem.as_bytes()).unwrap())
        .unwrap();
    rustls::ClientConfig::builder_with_provider(Arc::new(hookgate::tls::provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A client that trusts exactly `pem` and reports the certificate it saw.
async fn post_tls(
    port: u16,
    pem: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> (u16, http::HeaderMap) {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(trusting(pem))
        .https_only()
        .enable_http1()
        .build();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let mut req = http::Request::post(format!("https://localhost:{port}/webhooks/stripe"));
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let response = client
        .request(req.body(Full::new(Bytes::copy_from_slice(body))).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let _ = response.into_body().collect().await;
    (status, headers)
}

#[tokio::test]
async fn the_listener_serves_tls_and_reloads_its_certificate() {
    let fixture = GateFixture::stripe();
    let dir = fixture.dir().to_owned();
    let first_pem = write_cert(&dir);
    let gate = fixture.server_extra(&tls_section(&dir)).start().await;
    let port = gate.addr.port();

    let body = stripe_event("evt_tls");
    let (status, headers) = post_tls(port, &first_pem, &gate.sign(&body), &body).await;
    assert_eq!(status, 200);
    assert_eq!(headers["hookgate-result"], "forwarded");
    assert_eq!(
        gate.upstream().received()[0].headers["x-forwarded-proto"],
        "https"
    );

    // Rotate the files: new connections get the new certificate.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second_pem = write_cert(&dir);
    let mut result = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let body = stripe_event("evt_tls_2");
        let headers = gate.sign(&body);
        let attempt = tokio::spawn({
            let pem = second_pem.clone();
            async move { post_tls(port, &pem, &headers, &body).await }
        });
        if let Ok((status, _)) = attempt.await {
            result = status;
            break;
        }
    }
    assert_eq!(result, 200, "the reloaded certificate is served");
    gate.shutdown().await;
}

#[tokio::test]
async fn https_upstreams_are_trusted_through_ca_file() {
    // A TLS front for the app: a gate with no provider, that only passes
    // through.
    let front = GateFixture::new();
    write_cert(front.dir());
    let cert = front.dir().join("tls.crt");
    let tls = tls_section(front.dir());
    let front = front
        .server_extra(&tls)
        .store(StoreConfig::memory())
        .start()
        .await;
    let app = front.upstream();
    let https = format!("https://localhost:{}", front.addr.port());

    let gate = GateFixture::stripe()
        .upstream_url(&https)
        .upstream_extra(&format!("ca_file = \"{}\"", cert.display()))
        .start()
        .await;
    let body = stripe_event("evt_https_up");
    let answer = gate.deliver(&body).await;
    assert_eq!(answer.result(), "forwarded", "{answer:?}");
    assert_eq!(app.received()[0].body.as_ref(), body.as_slice());

    // Without the CA the upstream is not trusted: 502, the key released.
    let other = GateFixture::stripe()
        .upstream_url(&https)
        .store(StoreConfig::memory())
        .start()
        .await;
    let body = stripe_event("evt_https_untrusted");
    let answer = other.deliver(&body).await;
    assert_eq!(answer.status, 502);
    assert_eq!(app.count(), 1);
    for g in [gate, other, front] {
        g.shutdown().await;
    }
}

/// Over TLS with `alpn` offered (nothing when empty): sends `request`,
/// reads until the gate closes. What came back, and how long the gate
/// kept the connection after the handshake.
async fn tls_exchange(port: u16, pem: &str, alpn: &[&[u8]], request: &[u8]) -> (Vec<u8>, Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut config = trusting(pem);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let started = std::time::Instant::now();
    tls.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), tls.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the gate kept the connection open");
    (answer, started.elapsed())
}

#[tokio::test]
async fn a_tls_client_without_alpn_is_served_http1() {
    let (gate, pem) = tls_gate("").await;
    let body = stripe_event("evt_tls_no_alpn");
    let head = raw_head(
        "/webhooks/stripe",
        "connection: close\r\n",
        &gate.sign(&body),
        body.len(),
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&body);
    let (answer, _) = tls_exchange(gate.addr.port(), &pem, &[], &bytes).await;
    assert_raw_forwarded(&String::from_utf8_lossy(&answer));
    gate.shutdown().await;
}

#[tokio::test]
async fn a_tls_client_that_negotiates_h2_and_asks_nothing_is_cut_off() {
    let (gate, pem) = tls_gate("read_timeout = \"1s\"").await;
    for sent in [&b""[..], b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"] {
        let (_, kept) = tls_exchange(gate.addr.port(), &pem, &[b"h2"], sent).await;
        assert!(
            kept >= Duration::from_millis(800),
            "cut off after {kept:?}, before the read timeout"
        );
    }
    gate.shutdown().await;
}

/// The write timeout holds beneath TLS: a client that asks for an 8 MiB
/// answer over TLS and reads none of it for 5 s (two read timeouts are 2 s)
/// is dropped before it has the whole answer (tests/it/slow_clients.rs has
/// the plain HTTP/1 and HTTP/2 cases).
#[tokio::test]
async fn a_tls_client_that_reads_nothing_is_dropped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const LARGE: usize = 8 << 20;
    let (gate, pem) = tls_gate("read_timeout = \"1s\"").await;
    gate.upstream().set(Behavior::Large {
        status: 200,
        bytes: LARGE,
    });
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let tcp = socket
        .connect(([127, 0, 0, 1], gate.addr.port()).into())
        .await
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(trusting(&pem)));
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET /download HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut got = 0;
    let mut buf = vec![0; 64 * 1024];
    let read = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) => break None,
                Ok(n) => got += n,
                Err(e) => break Some(e),
            }
        }
    })
    .await;
    let ended = read.expect("the gate kept the connection open");
    assert!(
        got < LARGE,
        "the whole answer ({got} bytes) waited 5 s for a client that read none of it"
    );
    let error = ended.expect("closed without a reset, leaving the rest queued");
    assert!(crate::support::is_reset(&error), "{error:?}");
    gate.shutdown().await;
}
