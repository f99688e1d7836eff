//! The application behind the gate: a pooled hyper-util client, hop-by-hop
//! header handling, target URLs and timeouts.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use crate::body::ProxyBody;
use crate::cores::PerCore;
use crate::metrics::Metrics;
use crate::settings::UpstreamSettings;
use crate::tls::TlsError;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};

/// The most of an upstream answer the gate buffers for a delivery. Webhook
/// answers are small; the rest of a larger one is not read (the answer
/// counts as cut, its status still stands).
const MAX_BUFFERED_RESPONSE: usize = 8 * 1024 * 1024;

/// Why a call to the application failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connect failed: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("call failed: {0}")]
    Other(String),
}

/// An upstream answer: its head, and its body as far as it was read.
pub struct Buffered {
    pub parts: http::response::Parts,
    pub body: Bytes,
    /// Why the body is not whole, when it is not: over the read limit,
    /// broken off, or not finished within the timeout. The head stands
    /// (SPEC section 1, finish: the status decides).
    pub cut: Option<String>,
}

/// The gate's one HTTP client type, for http and https targets: the
/// upstream's lanes, the OTLP exporters and `hookgate demo` all call
/// through it, so that hyper's client (HTTP/1 and HTTP/2) and its pool
/// are compiled once, not once for each (docs/BENCHMARKS.md, Memory, "The
/// binary's code, compiled twice").
pub(crate) type GateClient = Client<Connector, ProxyBody>;

/// How a [`GateClient`] connects.
pub(crate) type Connector = HttpsConnector<HttpConnector>;

/// A connector for http and https targets that trusts the system's roots
/// and `ca_file`, with Nagle's delay off and a `connect_timeout`.
pub(crate) fn connector(
    ca_file: Option<&Path>,
    connect_timeout: Duration,
) -> Result<Connector, TlsError> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http.enforce_http(false);
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(crate::tls::client_config(ca_file)?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

pub struct Upstream {
    /// One pool per core, and one for the main runtime: a pooled
    /// connection's task runs on the runtime that opened it, so a core that
    /// used another core's connection would wake that core's thread for
    /// every read.
    lanes: PerCore<Lane>,
    base: Uri,
    timeout: Duration,
    /// Where each delivery's upstream time is recorded.
    metrics: Arc<Metrics>,
    /// One permit per delivery call in flight, for the whole gate.
    /// hyper-util's pool opens a new connection whenever every pooled one is
    /// busy and has no cap per host, so without this a burst of N deliveries
    /// holds N upstream connections (and their buffers) and hits the app N
    /// at once.
    calls: Semaphore,
}

/// A core's way to the app: its pool, and its share of the call slots.
struct Lane {
    /// Keeps up to `max_connections` idle, for passthrough requests (which
    /// take no slot) as well.
    client: GateClient,
    /// A core's share of `Upstream::calls`: `max_connections` over the
    /// serving cores, rounded up (the gate's semaphore trims the total). A
    /// pool grows to the most calls its core ever had in flight at once:
    /// with only the gate's slots, taken first come first served, the
    /// cores' shares drifted and each core's pool grew towards the whole cap
    /// (128 connections for 64 slots on two cores: docs/BENCHMARKS.md,
    /// The overhead work). The lane off the cores (the relay's) has all of
    /// them, so only the gate's semaphore caps it.
    calls: Semaphore,
}

impl Upstream {
    /// A client for http and https upstreams (system roots plus
    /// `upstream.ca_file`), with a lane for each of `cores` serving cores
    /// (`cores::serving`) and one for the rest.
    pub fn new(
        settings: &UpstreamSettings,
        cores: usize,
        metrics: Arc<Metrics>,
    ) -> Result<Self, TlsError> {
        let connector = connector(settings.ca_file.as_deref(), settings.timeout)?;
        let share = settings.max_connections.div_ceil(cores.max(1));
        let lanes = PerCore::new(|core| {
            let off_the_cores = core == 0;
            Lane {
                client: Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(30))
                    .pool_max_idle_per_host(settings.max_connections)
                    .build(connector.clone()),
                calls: Semaphore::new(if off_the_cores {
                    settings.max_connections
                } else {
                    share
                }),
            }
        });
        Ok(Self {
            lanes,
            base: settings.url.clone(),
            timeout: settings.timeout,
            metrics,
            calls: Semaphore::new(settings.max_connections),
        })
    }

    /// The target for `path_and_query`: the upstream's scheme, authority and
    /// base path, then the request's path and query.
    pub fn target(&self, path_and_query: &str) -> Result<Uri, UpstreamError> {
        let base = self.base.path().trim_end_matches('/');
        let pq = [base, path_and_query].concat();
        Uri::builder()
            .scheme(self.base.scheme_str().unwrap_or("http"))
            .authority(self.base.authority().map_or("", |a| a.as_str()))
            .path_and_query(pq)
            .build()
            .map_err(|e| UpstreamError::Other(e.to_string()))
    }

    /// Sends a delivery and reads the answer, all within the timeout, which
    /// includes waiting for a call slot (one of the core's share of
    /// `max_connections`, then one of the gate's). Once
    /// the head has arrived the call has an answer: a body that then breaks
    /// off, runs past the timeout or past the read limit is returned as far
    /// as it came, marked cut.
    /// The time it takes is recorded for `provider`.
    pub async fn call_buffered(
        &self,
        provider: &str,
        req: Request<ProxyBody>,
    ) -> Result<Buffered, UpstreamError> {
        let started = tokio::time::Instant::now();
        let result = self.exchange(started + self.timeout, req).await;
        self.metrics.upstream(provider, started.elapsed());
        result
    }

    async fn exchange(
        &self,
        deadline: tokio::time::Instant,
        req: Request<ProxyBody>,
    ) -> Result<Buffered, UpstreamError> {
        let lane = self.lanes.get();
        let head = async {
            let closed = |_| UpstreamError::Other("the gate is shutting down".into());
            let lane_slot = lane.calls.acquire().await.map_err(closed)?;
            let gate_slot = self.calls.acquire().await.map_err(closed)?;
            let response = lane.client.request(req).await.map_err(classify)?;
            Ok(((lane_slot, gate_slot), response))
        };
        let (_slots, response) = tokio::time::timeout_at(deadline, head)
            .await
            .unwrap_or(Err(UpstreamError::Timeout(self.timeout)))?;
        let (parts, body) = response.into_parts();
        let (body, cut) = read_capped(body, MAX_BUFFERED_RESPONSE, deadline).await;
        Ok(Buffered { parts, body, cut })
    }

    /// Sends a passthrough request; the answer streams back as it comes.
    pub async fn call_streaming(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        tokio::time::timeout(self.timeout, self.lanes.get().client.request(req))
            .await
            .map_err(|_| UpstreamError::Timeout(self.timeout))?
            .map_err(classify)
    }
}

/// Reads a body up to `limit` bytes until `deadline`: what came, and why it
/// stopped early if it did.
async fn read_capped(
    mut body: Incoming,
    limit: usize,
    deadline: tokio::time::Instant,
) -> (Bytes, Option<String>) {
    let mut buf = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return (buf.freeze(), Some("the body did not finish in time".into())),
            Ok(None) => return (buf.freeze(), None),
            Ok(Some(Err(e))) => {
                return (
                    buf.freeze(),
                    Some(format!("the body broke off: {}", error_chain(&e))),
                );
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if buf.len() + data.len() > limit {
            buf.extend_from_slice(&data[..limit - buf.len()]);
            return (
                buf.freeze(),
                Some(format!("the body is over {limit} bytes")),
            );
        }
        buf.extend_from_slice(&data);
    }
}

fn classify(e: hyper_util::client::legacy::Error) -> UpstreamError {
    if e.is_connect() {
        UpstreamError::Connect(error_chain(&e))
    } else {
        UpstreamError::Other(error_chain(&e))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Headers meaningful only for one connection (RFC 9110 section 7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes hop-by-hop headers, including any the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_the_ones_connection_names_go() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert("stripe-signature", "t=1,v1=ab".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("stripe-signature"));
    }

    #[test]
    fn targets_join_base_path_and_request() {
        let settings = UpstreamSettings {
            url: Uri::from_static("http://127.0.0.1:3000/app/"),
            timeout: Duration::from_secs(1),
            passthrough: true,
            ca_file: None,
            max_connections: 4,
        };
        let up = Upstream::new(&settings, 2, Arc::default()).unwrap();
        assert_eq!(
            up.target("/hooks?a=1").unwrap().to_string(),
            "http://127.0.0.1:3000/app/hooks?a=1"
        );
    }
}
