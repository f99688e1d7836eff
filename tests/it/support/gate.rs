//! Starts the real gate in-process on port 0, through the same `start`
//! that `main` calls, and talks to it over real HTTP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use hookgate::provider::Scheme;
use hookgate::{Running, config};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A test secret, written to a file the config points at.
pub const SECRET: &str = "whsec_test_secret_do_not_log_5f3a9c";

/// A gate configured for tests: the store and providers vary, the rest is
/// fixed (port 0, the given upstream, short timeouts).
pub struct GateConfig {
    pub upstream: String,
    pub store: String,
    pub providers: String,
    pub extra: String,
}

impl GateConfig {
    pub fn new(upstream: &str, dir: &Path) -> Self {
        Self {
            upstream: format!("url = \"{upstream}\"\ntimeout = \"2s\"\n"),
            store: format!(
                "backend = \"sqlite\"\npath = \"{}\"\nlease = \"5s\"\n",
                dir.join("gate.db").display()
            ),
            providers: String::new(),
            extra: String::new(),
        }
    }

    pub fn toml(&self) -> String {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"2s\"\n{}\n[upstream]\n{}\n[store]\n{}\n{}\n",
            self.extra, self.upstream, self.store, self.providers
        )
    }
}

/// Writes `value` to a secret file in `dir` and returns its `file:` source.
pub fn secret_file(dir: &Path, name: &str, value: &str) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, value).unwrap();
    format!("file:{}", path.display())
}

/// A provider section.
pub fn provider(name: &str, scheme: &str, secrets: &[String], extra: &str) -> String {
    let list: Vec<String> = secrets.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "[providers.{name}]\nscheme = \"{scheme}\"\npath = \"/webhooks/{name}\"\nsecrets = [{}]\n{extra}\n",
        list.join(", ")
    )
}

pub async fn start(config: &GateConfig) -> Running {
    let settings = config::load(&config::figment_from_str(&config.toml()))
        .unwrap_or_else(|e| panic!("test config invalid:\n{e}\n---\n{}", config.toml()));
    hookgate::start(settings).await.expect("gate starts")
}

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
