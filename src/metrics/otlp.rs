//! OTLP export: the same instruments as `/metrics`, recorded through the
//! OpenTelemetry SDK and pushed as OTLP/HTTP protobuf every
//! `telemetry.otlp_interval`, with a last push at shutdown.
//!
//! Names are SPEC section 6's, so a Prometheus receiving OTLP shows the
//! same series as a scrape. The standard `OTEL_EXPORTER_OTLP_HEADERS`
//! variable adds headers (a collector's token, say) without putting them
//! in the config file.

use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, MeterProvider as _};
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{MetricExporter, Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use tokio::runtime::Handle;

use super::{LATENCY_BUCKETS, Recorder};
use crate::settings::OtlpSettings;
use crate::store::PartitionHealth;

/// The most of a collector's answer read (it is only checked for success).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    #[error("OTLP exporter: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

pub struct Otlp {
    provider: SdkMeterProvider,
    deliveries: Counter<u64>,
    request_duration: Histogram<f64>,
    upstream_duration: Histogram<f64>,
    store_duration: Histogram<f64>,
    secret_matches: Counter<u64>,
    mark_retries: Counter<u64>,
    anomalies: Counter<u64>,
    estimated_rows: Gauge<u64>,
    oldest_age_seconds: Gauge<u64>,
    ahead: Gauge<u64>,
    last_maintenance: Gauge<u64>,
}

impl Otlp {
    /// Starts the periodic exporter. Must run inside the tokio runtime.
    pub fn start(settings: &OtlpSettings) -> Result<Self, OtlpError> {
        let exporter = MetricExporter::builder()
            .with_http()
            .with_http_client(ExportClient::new(settings.timeout)?)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(settings.endpoint.to_string())
            .with_timeout(settings.timeout)
            .build()
            .map_err(|e| OtlpError::Exporter(e.to_string()))?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(settings.interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(Resource::builder().with_service_name("hookgate").build())
            .build();
        let meter = provider.meter("hookgate");
        Ok(Self {
            deliveries: meter
                .u64_counter("hookgate_deliveries_total")
                .with_description("Deliveries by provider and outcome")
                .build(),
            request_duration: latency(
                &meter,
                "hookgate_request_duration_seconds",
                "Time from the request head to the answer, by provider and outcome",
            ),
            upstream_duration: latency(
                &meter,
                "hookgate_upstream_duration_seconds",
                "Time the application took to answer a delivery",
            ),
            store_duration: latency(
                &meter,
                "hookgate_store_operation_duration_seconds",
                "Dedupe store operations by backend and operation",
            ),
            secret_matches: meter
                .u64_counter("hookgate_secret_matches_total")
                .with_description("Verified deliveries by the index of the secret that matched")
                .build(),
            mark_retries: meter
                .u64_counter("hookgate_mark_retries_total")
                .with_description("Background retries of a failed completion mark")
                .build(),
            anomalies: meter
                .u64_counter("hookgate_anomalies_total")
                .with_description(
                    "Deliveries a sender should never make, by kind (payload_mismatch)",
                )
                .build(),
            estimated_rows: meter.u64_gauge("hookgate_postgres_estimated_rows").build(),
            oldest_age_seconds: meter
                .u64_gauge("hookgate_postgres_oldest_partition_age_seconds")
                .with_unit("s")
                .build(),
            ahead: meter
                .u64_gauge("hookgate_postgres_partitions_ahead")
                .build(),
            last_maintenance: meter
                .u64_gauge("hookgate_postgres_last_maintenance_timestamp_seconds")
                .with_unit("s")
                .build(),
            provider,
        })
    }

    /// Exports what is left and stops the exporter's thread. The SDK blocks
    /// while it exports through [`ExportClient`], which needs the runtime:
    /// so it blocks on a blocking-pool thread, never on a worker.
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "OTLP: last export at shutdown failed"),
            Err(e) => tracing::warn!(error = %e, "OTLP: shutdown did not finish"),
        }
    }
}

fn latency(meter: &Meter, name: &'static str, description: &'static str) -> Histogram<f64> {
    meter
        .f64_histogram(name)
        .with_description(description)
        .with_unit("s")
        .with_boundaries(LATENCY_BUCKETS.to_vec())
        .build()
}

fn provider_label(provider: &str) -> KeyValue {
    KeyValue::new("provider", provider.to_owned())
}

fn seconds_since_epoch(t: Option<std::time::SystemTime>) -> u64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

impl Recorder for Otlp {
    fn delivery(&self, provider: &str, outcome: &'static str, elapsed: Duration) {
        let labels = [provider_label(provider), KeyValue::new("outcome", outcome)];
        self.deliveries.add(1, &labels);
        self.request_duration.record(elapsed.as_secs_f64(), &labels);
    }

    fn secret_match(&self, provider: &str, index: usize) {
        let labels = [
            provider_label(provider),
            KeyValue::new("secret", index.to_string()),
        ];
        self.secret_matches.add(1, &labels);
    }

    fn upstream(&self, provider: &str, elapsed: Duration) {
        self.upstream_duration
            .record(elapsed.as_secs_f64(), &[provider_label(provider)]);
    }

    fn store(&self, backend: &'static str, operation: &'static str, elapsed: Duration) {
        self.store_duration.record(
            elapsed.as_secs_f64(),
            &[
                KeyValue::new("backend", backend),
                KeyValue::new("operation", operation),
            ],
        );
    }

    fn mark_retry(&self, provider: &str) {
        self.mark_retries.add(1, &[provider_label(provider)]);
    }

    fn anomaly(&self, provider: &str, kind: &'static str) {
        self.anomalies
            .add(1, &[provider_label(provider), KeyValue::new("kind", kind)]);
    }

    fn partition_health(&self, health: &PartitionHealth) {
        self.estimated_rows.record(health.estimated_rows, &[]);
        self.oldest_age_seconds
            .record(health.oldest_partition_age.map_or(0, |a| a.as_secs()), &[]);
        self.ahead.record(u64::from(health.partitions_ahead), &[]);
        self.last_maintenance
            .record(seconds_since_epoch(health.last_maintenance), &[]);
    }
}

/// The exporter's HTTP client: the gate's own hyper client (rustls, system
/// roots), driven on the gate's runtime.
///
/// The SDK exports from its own thread and polls the export future with a
/// plain executor, where a hyper call (which needs tokio's reactor) cannot
/// run; so each call is spawned onto the runtime and only its result
/// awaited there. opentelemetry-http's own hyper client assumes the caller
/// is already inside tokio, and its reqwest clients would add a second HTTP
/// stack to the binary.
struct ExportClient {
    runtime: Handle,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl fmt::Debug for ExportClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ExportClient {
    fn new(timeout: Duration) -> Result<Self, OtlpError> {
        let runtime = Handle::try_current()
            .map_err(|_| OtlpError::Exporter("must start inside the tokio runtime".into()))?;
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        http.enforce_http(false);
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(crate::tls::client_config(None)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Self {
            runtime,
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let timeout = self.timeout;
        let call = async move {
            let response = tokio::time::timeout(timeout, client.request(request.map(Full::new)))
                .await
                .map_err(|_| format!("no answer within {timeout:?}"))??;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES).collect().await?;
            Ok::<_, HttpError>(Response::from_parts(parts, body.to_bytes()))
        };
        let result = self.runtime.spawn(call).await?;
        match &result {
            Ok(response) if !response.status().is_success() => {
                tracing::warn!(status = response.status().as_u16(), "OTLP export refused");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "OTLP export failed"),
        }
        result
    }
}
