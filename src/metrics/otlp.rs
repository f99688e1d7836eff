//! OTLP export: the same instruments as `/metrics`, recorded through the
//! OpenTelemetry SDK and pushed as OTLP/HTTP protobuf every
//! `telemetry.otlp_interval`, with a last push at shutdown.
//!
//! Names are SPEC section 6's, so a Prometheus receiving OTLP shows the
//! same series as a scrape. The standard `OTEL_EXPORTER_OTLP_HEADERS`
//! variable adds headers (a collector's token, say) without putting them
//! in the config file.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{
    Counter, Gauge, Histogram, InstrumentBuilder, Meter, MeterProvider as _,
};
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{MetricExporter, Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use tokio::runtime::Handle;

use super::Recorder;
use super::catalog::{ALL, Descriptor, Kind, Measurement};
use super::labels::Key;
use crate::settings::OtlpSettings;

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
    /// One per entry of the catalog, at its `index`.
    instruments: Vec<Instrument>,
}

enum Instrument {
    Counter(Counter<u64>),
    Histogram(Histogram<f64>),
    Gauge(Gauge<u64>),
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
        Ok(Self::with_reader(reader))
    }

    fn with_reader(reader: PeriodicReader<impl PushMetricExporter>) -> Self {
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(Resource::builder().with_service_name("hookgate").build())
            .build();
        let meter = provider.meter("hookgate");
        let instruments = ALL.iter().map(|m| Instrument::new(&meter, m)).collect();
        Self {
            provider,
            instruments,
        }
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

impl Instrument {
    fn new(meter: &Meter, metric: &Descriptor) -> Self {
        match metric.kind {
            Kind::Counter => {
                Self::Counter(described(meter.u64_counter(metric.name), metric).build())
            }
            Kind::Histogram => Self::Histogram(
                meter
                    .f64_histogram(metric.name)
                    .with_description(metric.help)
                    .with_unit(metric.unit())
                    .with_boundaries(metric.buckets.to_vec())
                    .build(),
            ),
            Kind::Gauge => Self::Gauge(described(meter.u64_gauge(metric.name), metric).build()),
        }
    }
}

/// A counter or gauge builder given the metric's help and unit.
fn described<'a, T>(
    builder: InstrumentBuilder<'a, T>,
    metric: &Descriptor,
) -> InstrumentBuilder<'a, T> {
    builder
        .with_description(metric.help)
        .with_unit(metric.unit())
}

impl Recorder for Otlp {
    fn record(&self, labels: &Key<'_>, measurements: &[Measurement]) {
        let names = labels.names();
        let labels = labels.to_labels();
        let attribute = |i: usize, value: &Cow<'static, str>| {
            KeyValue::new(names.get(i).copied().unwrap_or(""), value.clone())
        };
        // One per `MAX_LABELS`; the padding is cut off below. Only a copied
        // name is copied again.
        let [first, second] = labels.padded();
        let attributes = [attribute(0, first), attribute(1, second)];
        let attributes = &attributes[..names.len()];
        for measurement in measurements {
            match (measurement, &self.instruments[measurement.metric().index]) {
                (Measurement::Add(_, n), Instrument::Counter(counter)) => {
                    counter.add(*n, attributes);
                }
                (Measurement::Observe(_, value), Instrument::Histogram(histogram)) => {
                    histogram.record(*value, attributes);
                }
                (Measurement::Set(_, value), Instrument::Gauge(gauge)) => {
                    gauge.record(*value, attributes);
                }
                _ => unreachable!("{measurement:?}: the catalog types each metric by its kind"),
            }
        }
    }
}

/// The exporters' HTTP client (metrics here, traces in
/// `crate::telemetry::trace`): the gate's own hyper client (rustls, system
/// roots), driven on the gate's runtime.
///
/// The SDK exports from its own thread and polls the export future with a
/// plain executor, where a hyper call (which needs tokio's reactor) cannot
/// run; so each call is spawned onto the runtime and only its result
/// awaited there. opentelemetry-http's own hyper client assumes the caller
/// is already inside tokio, and its reqwest clients would add a second HTTP
/// stack to the binary.
pub(crate) struct ExportClient {
    runtime: Handle,
    client: crate::upstream::GateClient,
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
    pub(crate) fn new(timeout: Duration) -> Result<Self, OtlpError> {
        let runtime = Handle::try_current()
            .map_err(|_| OtlpError::Exporter("must start inside the tokio runtime".into()))?;
        let connector = crate::upstream::connector(None, timeout)?;
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
            let response =
                tokio::time::timeout(timeout, client.request(request.map(crate::body::full)))
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

/// An exporter that keeps what it is handed, for tests.
#[cfg(test)]
pub(super) mod capture {
    use std::sync::{Arc, Mutex};

    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::metrics::Temporality;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};

    use super::*;

    /// One exported metric, with the attribute names of each data point.
    #[derive(Debug)]
    pub struct Exported {
        pub name: String,
        pub description: String,
        pub unit: String,
        pub points: Vec<Vec<String>>,
    }

    #[derive(Clone, Default)]
    pub struct Capture(Arc<Mutex<Vec<Exported>>>);

    impl Capture {
        /// An [`Otlp`] that exports here, when [`Capture::take`] asks.
        pub fn otlp(&self) -> Otlp {
            let reader = PeriodicReader::builder(self.clone())
                .with_interval(Duration::from_secs(3600))
                .build();
            Otlp::with_reader(reader)
        }

        pub fn take(&self, otlp: &Otlp) -> Vec<Exported> {
            otlp.provider.force_flush().expect("an export");
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    fn points<T>(data: &MetricData<T>) -> Vec<Vec<String>> {
        let names =
            |a: &mut dyn Iterator<Item = &KeyValue>| a.map(|kv| kv.key.to_string()).collect();
        match data {
            MetricData::Gauge(g) => g
                .data_points()
                .map(|p| names(&mut p.attributes()))
                .collect(),
            MetricData::Sum(s) => s
                .data_points()
                .map(|p| names(&mut p.attributes()))
                .collect(),
            MetricData::Histogram(h) => h
                .data_points()
                .map(|p| names(&mut p.attributes()))
                .collect(),
            MetricData::ExponentialHistogram(_) => unreachable!("not declared"),
        }
    }

    impl PushMetricExporter for Capture {
        async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
            let exported = metrics
                .scope_metrics()
                .flat_map(|s| s.metrics())
                .map(|m| Exported {
                    name: m.name().to_owned(),
                    description: m.description().to_owned(),
                    unit: m.unit().to_owned(),
                    points: match m.data() {
                        AggregatedMetrics::F64(d) => points(d),
                        AggregatedMetrics::U64(d) => points(d),
                        AggregatedMetrics::I64(d) => points(d),
                    },
                });
            *self.0.lock().unwrap() = exported.collect();
            Ok(())
        }

        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }

        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }

        fn temporality(&self) -> Temporality {
            Temporality::Cumulative
        }
    }
}
