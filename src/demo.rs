//! `hookgate demo`: the gate on the embedded store in a temporary directory,
//! in front of an in-process echo app; one signed delivery sent twice and a
//! forged one, and a table of what happened to each.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::provider::Scheme;

/// What the echo app saw: one body per call.
type Seen = Arc<Mutex<Vec<Bytes>>>;

/// Runs the demo and prints its table; the error is a sentence for stderr.
pub async fn run() -> Result<(), String> {
    let dir = tempfile_dir()?;
    let seen: Seen = Arc::default();
    let app = echo_app(Arc::clone(&seen)).await?;
    let secret = format!("whsec_demo_{:032x}", rand::random::<u128>());
    let secret_path = dir.join("stripe-secret");
    std::fs::write(&secret_path, &secret).map_err(|e| format!("writing the demo secret: {e}"))?;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [upstream]\nurl = \"http://{app}\"\ntimeout = \"5s\"\n\
         [store]\nbackend = \"sqlite\"\npath = \"{db}\"\n\
         [providers.stripe]\nscheme = \"stripe\"\npath = \"/webhooks/stripe\"\nsecrets = [\"file:{secret}\"]\n",
        db = dir.join("hookgate.db").display(),
        secret = secret_path.display(),
    );
    let settings = crate::config::load(&crate::config::figment_from_str(&toml))
        .map_err(|e| format!("demo configuration: {e}"))?;
    let gate = crate::start(settings)
        .await
        .map_err(|e| format!("starting the gate: {e}"))?;
    println!(
        "hookgate demo: gate on {} (sqlite in {}), echo app on {app}\n",
        gate.addr,
        dir.display()
    );

    let body = br#"{"id":"evt_demo_1","object":"event","type":"invoice.paid"}"#;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let genuine = Scheme::Stripe.sign(secret.as_bytes(), body, "", now);
    let forged = Scheme::Stripe.sign(b"whsec_guessed_by_an_attacker", body, "", now);
    let sends = [
        ("evt_demo_1, signed", &genuine),
        ("evt_demo_1 again (a retry)", &genuine),
        ("evt_demo_1, forged signature", &forged),
    ];
    println!(
        "#  {:<32}{:<8}{:<20}app calls so far",
        "delivery", "status", "hookgate-result"
    );
    for (n, (label, headers)) in sends.iter().enumerate() {
        let (status, result) = post(gate.addr, headers, body).await?;
        let calls = seen.lock().unwrap_or_else(|p| p.into_inner()).len();
        println!("{:<3}{label:<32}{status:<8}{result:<20}{calls}", n + 1);
    }
    let received = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!(
        "\nThe app received {} delivery(ies); byte for byte: {}.",
        received.len(),
        received.iter().all(|b| b.as_ref() == body)
    );
    gate.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("hookgate-demo-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

/// An app that answers 200 and remembers each body.
async fn echo_app(seen: Seen) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("starting the echo app: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            let service = service_fn(move |req: Request<Incoming>| {
                let seen = Arc::clone(&seen);
                async move {
                    let body = req.into_body().collect().await.map(|b| b.to_bytes());
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(body.unwrap_or_default());
                    let mut answer = Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}")));
                    answer.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, Infallible>(answer)
                }
            });
            tokio::spawn(
                auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned(),
            );
        }
    });
    Ok(addr)
}

async fn post(
    gate: SocketAddr,
    headers: &[(String, String)],
    body: &'static [u8],
) -> Result<(u16, String), String> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut req = Request::post(format!("http://{gate}/webhooks/stripe"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::from_static(body)))
        .map_err(|e| e.to_string())?;
    let answer = client
        .request(req)
        .await
        .map_err(|e| format!("sending to the gate: {e}"))?;
    let result = answer
        .headers()
        .get(crate::error::RESULT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    Ok((answer.status().as_u16(), result))
}
