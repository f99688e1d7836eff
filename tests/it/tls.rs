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

use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::gate::stripe_event;

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

/// A client that trusts exactly `pem` and reports the certificate it saw.
async fn post_tls(
    port: u16,
    pem: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> (u16, http::HeaderMap) {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
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
