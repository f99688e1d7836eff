//! Runtime settings: the validated, typed form of the configuration, built
//! by `config::build` and consumed by the gate. Nothing here is optional
//! that has a default; nothing here is a string that still needs parsing.

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};

pub use crate::config::file::{FingerprintMode, Mode, OnMismatch, OnMissingKey};
use crate::key::KeySource;
use crate::provider::Scheme;
use crate::ratelimit::Rate;
use crate::secret::SecretSpec;
use crate::store::StoreSettings;
use crate::tls::TlsFiles;

#[derive(Clone, Debug)]
pub struct Settings {
    pub server: ServerSettings,
    pub upstream: UpstreamSettings,
    pub store: StoreSettings,
    pub dedupe: DedupeSettings,
    pub telemetry: TelemetrySettings,
    pub queue: QueueSettings,
    pub providers: Vec<ProviderSettings>,
    #[doc(hidden)]
    pub faults: Faults,
}

/// Defects injected by tests, to prove how the gate contains them. Never
/// read from configuration: only code that builds `Settings` can set them.
#[doc(hidden)]
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Panic in the delivery task once its claims are held.
    pub panic_after_claim: bool,
    /// Hold each delivery's marks back this long once its sender has the
    /// answer.
    pub mark_delay: Option<std::time::Duration>,
}

#[derive(Clone, Debug, Default)]
pub struct TelemetrySettings {
    /// OTLP export of the metrics, besides `/metrics`.
    pub otlp: Option<OtlpSettings>,
    /// OTLP export of the delivery traces; `None` is off, and then no span
    /// is made.
    pub traces: Option<TraceSettings>,
}

#[derive(Clone, Debug)]
pub struct TraceSettings {
    /// The full traces URL (`.../v1/traces`).
    pub endpoint: Uri,
    /// The share of new traces kept, in (0, 1]; a sender's sampled or
    /// unsampled trace is followed whatever it is.
    pub sample_ratio: f64,
    pub timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct OtlpSettings {
    /// The full metrics URL (`.../v1/metrics`).
    pub endpoint: Uri,
    pub interval: Duration,
    pub timeout: Duration,
}

#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub max_body_bytes: u64,
    /// Request bodies held at once, over every connection.
    pub max_body_bytes_in_flight: u64,
    pub read_timeout: Duration,
    pub shutdown_grace: Duration,
    pub client_ip_header: Option<HeaderName>,
    pub per_source_rate_limit: Option<Rate>,
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub tls: Option<TlsFiles>,
    /// Required by the admin listener's queue endpoints (`GET /queue`,
    /// `POST /queue/replay`).
    pub admin_token: Option<SecretSpec>,
    /// `hookgate run` may serve with no provider (a plain pass-through).
    pub allow_no_providers: bool,
}

#[derive(Clone, Debug)]
pub struct UpstreamSettings {
    /// Scheme and authority of the application, with an optional base path.
    pub url: Uri,
    pub timeout: Duration,
    pub passthrough: bool,
    /// Extra trust roots for an https upstream.
    pub ca_file: Option<std::path::PathBuf>,
    /// Deliveries forwarded at once; more wait (within `timeout`).
    pub max_connections: usize,
}

/// Store-wide dedupe parameters that providers may override.
#[derive(Clone, Debug)]
pub struct DedupeSettings {
    pub retention: Duration,
    pub lease: Duration,
    pub max_response_bytes: usize,
}

/// Queue mode: the accept answer and the relay's retry policy.
#[derive(Clone, Debug)]
pub struct QueueSettings {
    pub accept_status: StatusCode,
    pub max_attempts: u32,
    pub max_age: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// The fraction by which a retry's delay varies either way.
    pub jitter: f64,
    /// How long a relay owns a job it took; past it another relay may.
    pub lease: Duration,
    /// Jobs in flight at once, per gate.
    pub concurrency: usize,
    /// Statuses that go straight to the dead letter.
    pub dead_on: Vec<StatusCode>,
}

#[derive(Clone, Debug)]
pub struct ProviderSettings {
    pub name: String,
    pub scheme: Scheme,
    pub path: String,
    pub mode: Mode,
    pub secrets: Vec<SecretSpec>,
    pub tolerance: Duration,
    pub future_tolerance: Duration,
    /// `None` only when the scheme has no default and the user set none,
    /// which validation refuses; kept optional for `on_missing_key`.
    pub key: Option<KeySource>,
    pub on_missing_key: OnMissingKey,
    pub fingerprint: FingerprintMode,
    pub volatile_fields: Vec<String>,
    pub on_mismatch: OnMismatch,
    pub retention: Duration,
    pub reject_status: StatusCode,
    pub rate_limit: Option<Rate>,
    pub upstream_path: Option<String>,
    pub passthrough_methods: Vec<Method>,
    /// Route on the path's exact ASCII case (it is folded by default).
    pub case_sensitive_path: bool,
}
