//! `hookgate demo`: the gate on the embedded store in a temporary directory,
//! in front of an in-process echo app; one signed delivery sent twice and a
//! forged one, and a table of what happened to each.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;

use crate::provider::Scheme;
use crate::upstream::GateClient;

/// What the echo app saw: one body per call.
type Seen = Arc<Mutex<Vec<Bytes>>>;

/// Why the demo stopped early.
enum Stop {
    /// Whoever read the table stopped reading (`hookgate demo | head -3`):
    /// not a failure, nothing more to say.
    Closed,
    Failed(String),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::BrokenPipe => Self::Closed,
            _ => Self::Failed(format!("writing the table: {e}")),
        }
    }
}

impl From<String> for Stop {
    fn from(e: String) -> Self {
        Self::Failed(e)
    }
}

/// Runs the demo and prints its table; the error is a sentence for stderr.
/// The temporary directory is removed however the demo ends.
pub async fn run() -> Result<(), String> {
    let dir = TempDir::new()?;
    let seen: Seen = Arc::default();
    let app = echo_app(Arc::clone(&seen)).await?;
    let secret = format!("whsec_demo_{:032x}", rand::random::<u128>());
    let secret_path = dir.path().join("stripe-secret");
    std::fs::write(&secret_path, &secret).map_err(|e| format!("writing the demo secret: {e}"))?;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [upstream]\nurl = \"http://{app}\"\ntimeout = \"5s\"\n\
         [store]\nbackend = \"sqlite\"\npath = \"{db}\"\n\
         [providers.stripe]\nscheme = \"stripe\"\npath = \"/webhooks/stripe\"\nsecrets = [\"file:{secret}\"]\n",
        db = dir.path().join("hookgate.db").display(),
        secret = secret_path.display(),
    );
    let settings = crate::config::load(&crate::config::figment_from_str(&toml))
        .map_err(|e| format!("demo configuration: {e}"))?;
    let gate = crate::start(settings)
        .await
        .map_err(|e| format!("starting the gate: {e}"))?;
    let shown = show(
        &mut std::io::stdout(),
        gate.addr,
        app,
        dir.path(),
        &secret,
        &seen,
    )
    .await;
    gate.shutdown().await;
    match shown {
        Ok(()) | Err(Stop::Closed) => Ok(()),
        Err(Stop::Failed(e)) => Err(e),
    }
}

/// The deliveries and the table. Written to `out` with errors returned,
/// not `println!`, which panics when the reader has gone.
async fn show(
    out: &mut impl Write,
    gate: SocketAddr,
    app: SocketAddr,
    dir: &Path,
    secret: &str,
    seen: &Seen,
) -> Result<(), Stop> {
    writeln!(
        out,
        "hookgate demo: gate on {gate} (sqlite in {}), echo app on {app}\n",
        dir.display()
    )?;
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
    writeln!(
        out,
        "#  {:<32}{:<8}{:<20}app calls so far",
        "delivery", "status", "hookgate-result"
    )?;
    // The gate's own client type (`upstream::GateClient`): a second one
    // would be a second copy of hyper's client in the binary.
    let connector = crate::upstream::connector(None, CONNECT_TIMEOUT).map_err(|e| e.to_string())?;
    let client: GateClient = Client::builder(TokioExecutor::new()).build(connector);
    for (n, (label, headers)) in sends.iter().enumerate() {
        let (status, result) = post(&client, gate, headers, body).await?;
        let calls = seen.lock().unwrap_or_else(|p| p.into_inner()).len();
        writeln!(out, "{:<3}{label:<32}{status:<8}{result:<20}{calls}", n + 1)?;
    }
    let received = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    writeln!(
        out,
        "\nThe app received {} delivery(ies); byte for byte: {}.",
        received.len(),
        received.iter().all(|b| b.as_ref() == body)
    )?;
    out.flush()?;
    Ok(())
}

/// A directory under the system's temp dir, removed when dropped: on
/// success, on an error and on a panic alike.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, String> {
        let dir =
            std::env::temp_dir().join(format!("hookgate-demo-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(Self(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The echo app (crate::echo), remembering each body.
async fn echo_app(seen: Seen) -> Result<SocketAddr, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("starting the echo app: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(crate::echo::serve(listener, StatusCode::OK, move |r| {
        seen.lock().unwrap_or_else(|p| p.into_inner()).push(r.body);
    }));
    Ok(addr)
}

/// How long the demo's client waits to connect to its own gate, on the
/// loopback.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn post(
    client: &GateClient,
    gate: SocketAddr,
    headers: &[(String, String)],
    body: &'static [u8],
) -> Result<(u16, String), String> {
    let mut req = Request::post(format!("http://{gate}/webhooks/stripe"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req
        .body(crate::body::full(Bytes::from_static(body)))
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
