//! What the user writes: the TOML file and `HOOKGATE_...` variables, as is.
//!
//! Durations and other parsed values stay strings here, so that `build`
//! can report every bad value at once, naming its key, instead of stopping
//! at serde's first error.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// A size in bytes as written: an integer (`1048576`) or a string with a
/// unit (`"1MiB"`, `"512KiB"`, `"1MB"`), parsed by `build`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeFile {
    Bytes(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for SizeFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = SizeFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: bytes, or a string like \"512KiB\" or \"1MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SizeFile, E> {
                Ok(SizeFile::Bytes(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SizeFile, E> {
                u64::try_from(v)
                    .map(SizeFile::Bytes)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SizeFile, E> {
                Ok(SizeFile::Text(v.to_owned()))
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerFile {
    pub listen: String,
    pub admin_listen: String,
    pub max_body_bytes: SizeFile,
    /// Unset: 64 MiB, or `max_body_bytes` when that is larger.
    pub max_body_bytes_in_flight: Option<SizeFile>,
    pub read_timeout: String,
    pub shutdown_grace: String,
    pub client_ip_header: Option<String>,
    pub per_source_rate_limit: Option<RateFile>,
    pub max_connections: usize,
    pub max_header_bytes: SizeFile,
    pub tls: Option<TlsFile>,
    /// The secret (a source, like provider secrets) that the admin
    /// listener's queue endpoints require as a bearer token.
    pub admin_token: Option<SecretFile>,
    /// Serve with no provider at all, as a plain pass-through proxy. Off by
    /// default: a gate that verifies nothing should be a decision.
    pub allow_no_providers: bool,
}

/// `tls = { cert = "/etc/hookgate/tls.crt", key = "/etc/hookgate/tls.key" }`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    pub cert: String,
    pub key: String,
}

/// `{ per_second = 50, burst = 100 }`; `burst` defaults to `per_second`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateFile {
    pub per_second: u32,
    pub burst: Option<u32>,
}

impl Default for ServerFile {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:8080".into(),
            admin_listen: "0.0.0.0:9090".into(),
            max_body_bytes: SizeFile::Bytes(1024 * 1024),
            max_body_bytes_in_flight: None,
            read_timeout: "10s".into(),
            shutdown_grace: "20s".into(),
            client_ip_header: None,
            per_source_rate_limit: None,
            max_connections: 4096,
            max_header_bytes: SizeFile::Bytes(64 * 1024),
            tls: None,
            admin_token: None,
            allow_no_providers: false,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamFile {
    pub url: String,
    pub timeout: String,
    pub passthrough: bool,
    pub ca_file: Option<String>,
    pub max_connections: usize,
}

impl Default for UpstreamFile {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:3000".into(),
            timeout: "10s".into(),
            passthrough: true,
            ca_file: None,
            max_connections: 64,
        }
    }
}

/// `[telemetry]`: where metrics go besides `/metrics`, and traces.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryFile {
    /// An OTLP/HTTP collector, e.g. `http://otel-collector:4318`.
    pub otlp_endpoint: Option<String>,
    pub otlp_interval: String,
    pub otlp_timeout: String,
    /// Where traces go when not beside the metrics (`otlp_endpoint` with a
    /// path of its own).
    pub otlp_traces_endpoint: Option<String>,
    /// The share of deliveries without a sender's trace that are traced;
    /// 0 turns traces off.
    pub trace_sample_ratio: f64,
}

impl Default for TelemetryFile {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            otlp_interval: "60s".into(),
            otlp_timeout: "10s".into(),
            otlp_traces_endpoint: None,
            trace_sample_ratio: 1.0,
        }
    }
}

/// `[queue]`: how queue-mode deliveries are accepted and relayed.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueFile {
    pub accept_status: u16,
    pub max_attempts: u32,
    pub max_age: String,
    pub retry_initial: String,
    pub retry_max: String,
    pub jitter: f64,
    pub lease: String,
    pub concurrency: usize,
    pub dead_on: Vec<u16>,
}

impl Default for QueueFile {
    fn default() -> Self {
        Self {
            accept_status: 202,
            max_attempts: 12,
            max_age: "3d".into(),
            retry_initial: "1s".into(),
            retry_max: "1h".into(),
            jitter: 0.2,
            lease: "60s".into(),
            concurrency: 16,
            dead_on: vec![400, 401, 403, 404, 410, 422],
        }
    }
}

/// How a provider's deliveries reach the app.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Forwarded while the sender waits; its answer is the app's.
    #[default]
    Forward,
    /// Accepted into the outbox (the sender gets 202), relayed with retries.
    Queue,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Sqlite,
    Redis,
    Postgres,
    Memory,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreFile {
    pub backend: BackendKind,
    pub path: String,
    pub url: Option<String>,
    pub prefix: String,
    pub retention: String,
    pub lease: String,
    pub timeout: String,
    pub max_response_bytes: SizeFile,
    pub memory_capacity: usize,
    /// The redis `url` is a node of a Redis Cluster.
    pub cluster: bool,
}

impl Default for StoreFile {
    fn default() -> Self {
        Self {
            backend: BackendKind::Sqlite,
            path: "hookgate.db".into(),
            url: None,
            prefix: "hookgate".into(),
            retention: "4d".into(),
            lease: "30s".into(),
            timeout: "2s".into(),
            max_response_bytes: SizeFile::Bytes(64 * 1024),
            memory_capacity: 100_000,
            cluster: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemeKind {
    Stripe,
    Github,
    Slack,
    Twilio,
    Sendgrid,
    Shopify,
    Standard,
    Hmac,
}

/// A secret entry: `"env:NAME"`, `"file:/path"`, or a table with `not_after`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum SecretFile {
    Source(String),
    Table(SecretTable),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretTable {
    pub source: String,
    pub not_after: Option<String>,
}

/// `key = "json:/id"` or `key = ["form:MessageSid", "form:MessageStatus"]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum KeyFile {
    One(String),
    Parts(Vec<String>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMissingKey {
    Reject,
    Forward,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMismatch {
    Reject,
    Alert,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FingerprintMode {
    Canonical,
    Raw,
    None,
}

/// Every key is optional here, `scheme` and `path` included: a missing or
/// misspelt one is reported by `build`, beside the provider's other errors,
/// instead of failing the whole table at the first one.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderFile {
    pub scheme: Option<SchemeKind>,
    pub path: Option<String>,
    pub mode: Option<Mode>,
    #[serde(default)]
    pub secrets: Vec<SecretFile>,
    pub tolerance: Option<String>,
    pub future_tolerance: Option<String>,
    pub key: Option<KeyFile>,
    pub on_missing_key: Option<OnMissingKey>,
    pub fingerprint: Option<FingerprintMode>,
    #[serde(default)]
    pub volatile_fields: Vec<String>,
    pub on_mismatch: Option<OnMismatch>,
    pub retention: Option<String>,
    pub reject_status: Option<u16>,
    pub rate_limit: Option<RateFile>,
    pub upstream_path: Option<String>,
    #[serde(default)]
    pub passthrough_methods: Vec<String>,
    /// Match the path's ASCII case exactly instead of folding it.
    #[serde(default)]
    pub case_sensitive_path: bool,
    // The `twilio` scheme's parameter: the external URL of `path`.
    pub public_url: Option<String>,
    // The `hmac` scheme's parameters.
    pub signature_header: Option<String>,
    pub signature_prefix: Option<String>,
    pub encoding: Option<crate::provider::Encoding>,
    pub algorithm: Option<crate::provider::Algorithm>,
    pub timestamp_header: Option<String>,
    pub signed_payload: Option<String>,
}
