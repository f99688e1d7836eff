//! Logs: one typed record per delivery, written as one JSON line; and the
//! delivery's trace (`trace`).
//!
//! [`DeliveryRecord`] is the single place where a delivery's outcome is
//! reported, so the log line, the counters and the span cannot disagree.

use std::time::Instant;

use tracing_subscriber::EnvFilter;

mod core_log;
mod json_line;
mod timestamp;
pub mod trace;
pub use core_log::flush as flush_core_log;
use json_line::JsonLine;

use self::trace::{DeliverySpan, Stage, StageSpan};

use crate::error::{GateError, Side};
use crate::metrics::Metrics;

/// Installs the JSON log subscriber on stdout (through a buffer per core,
/// `core_log`); `RUST_LOG` sets the filter.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .event_format(JsonLine)
        .with_env_filter(filter)
        .with_writer(core_log::CoreLog)
        .try_init();
}

/// Whether the signature was checked, and how that went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verification {
    Ok,
    Invalid,
    Stale,
    /// Not reached (rate limited, body too large, ...).
    Skipped,
}

/// What the dedupe store said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dedupe {
    Fresh,
    Duplicate,
    InFlight,
    Mismatch,
    /// No claim: not reached, or no key and `on_missing_key = "forward"`.
    None,
}

/// How the delivery ended: the `outcome` label and log field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The app answered 2xx.
    Forwarded,
    /// Answered from the store.
    Duplicate,
    /// Queue mode: recorded for the relay.
    Accepted,
    /// The app answered, not 2xx; its answer was passed back.
    UpstreamError,
    /// The gate answered with the error of this code (SPEC section 2).
    Failed(&'static str),
}

impl Verification {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Invalid => "invalid",
            Self::Stale => "stale",
            Self::Skipped => "skipped",
        }
    }
}

impl Dedupe {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Duplicate => "duplicate",
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::None => "none",
        }
    }
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::Duplicate => "duplicate",
            Self::Accepted => "accepted",
            Self::UpstreamError => "upstream_error",
            Self::Failed(code) => code,
        }
    }
}

/// A known key that arrived with a different payload: both fingerprints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub key: String,
    pub stored: String,
    pub incoming: String,
}

/// Everything the delivery log says about one delivery. Holds no body and
/// no secret: only names, the key, outcomes and numbers. The pipeline's
/// runner fills it from the stages' results; nothing else writes it.
#[derive(Debug)]
pub struct DeliveryRecord {
    started: Instant,
    pub provider: String,
    pub key: Option<String>,
    pub verification: Verification,
    pub dedupe: Dedupe,
    pub outcome: Outcome,
    pub upstream_status: Option<u16>,
    pub secret_index: Option<usize>,
    pub traceparent: Option<String>,
    /// A payload mismatch seen on the way (reject or alert): an anomaly.
    pub mismatch: Option<Mismatch>,
    /// What went wrong, for operators: never shown to the sender.
    pub detail: Option<String>,
    /// Which side a failure came from.
    pub side: Option<Side>,
    /// The delivery's span, when traces are on.
    pub trace: Option<DeliverySpan>,
}

impl DeliveryRecord {
    pub fn new(provider: &str, traceparent: Option<String>) -> Self {
        Self {
            started: Instant::now(),
            provider: provider.to_owned(),
            key: None,
            verification: Verification::Skipped,
            dedupe: Dedupe::None,
            outcome: Outcome::Forwarded,
            upstream_status: None,
            secret_index: None,
            traceparent,
            mismatch: None,
            detail: None,
            side: None,
            trace: None,
        }
    }

    /// A span for `stage`, a child of the delivery's; nothing when traces
    /// are off.
    pub fn stage(&self, stage: Stage) -> StageSpan {
        match &self.trace {
            Some(span) => span.stage(stage),
            None => StageSpan::OFF,
        }
    }

    /// Records a failure that ends the delivery.
    pub fn fail(&mut self, error: &GateError) {
        self.outcome = Outcome::Failed(error.code());
        self.detail = Some(error.to_string());
        self.side = Some(error.side());
        match error {
            GateError::InvalidSignature { .. } => self.verification = Verification::Invalid,
            GateError::StaleTimestamp { .. } => self.verification = Verification::Stale,
            GateError::InFlight { .. } => self.dedupe = Dedupe::InFlight,
            GateError::PayloadMismatch {
                key,
                stored,
                incoming,
            } => {
                self.dedupe = Dedupe::Mismatch;
                self.mismatch = Some(Mismatch {
                    key: key.clone(),
                    stored: stored.clone(),
                    incoming: incoming.clone(),
                });
            }
            _ => {}
        }
    }

    /// Writes the delivery's log line (and a warning for an anomaly), counts
    /// it and ends its span.
    pub fn emit(mut self, metrics: &Metrics) {
        let elapsed = self.started.elapsed();
        if let Some(span) = self.trace.take() {
            span.end(&self);
        }
        let outcome = self.outcome.as_str();
        metrics.delivery(&self.provider, outcome, elapsed);
        if let Some(index) = self.secret_index {
            metrics.secret_match(&self.provider, index);
        }
        if let Some(m) = &self.mismatch {
            metrics.anomaly(&self.provider, "payload_mismatch");
            tracing::warn!(
                provider = self.provider.as_str(),
                key = m.key.as_str(),
                stored_fingerprint = m.stored.as_str(),
                incoming_fingerprint = m.incoming.as_str(),
                "payload mismatch: a known event id arrived with a different payload"
            );
        }
        let duration_ms = elapsed.as_secs_f64() * 1000.0;
        let duration_ms = (duration_ms * 1000.0).round() / 1000.0;
        // tracing needs a constant level at each call site: one macro
        // writes the shared fields at both levels.
        macro_rules! delivery_line {
            ($level:ident $(, $field:ident = $value:expr)*) => {
                tracing::$level!(
                    target: "hookgate::delivery",
                    provider = self.provider.as_str(),
                    key = self.key.as_deref(),
                    verification = self.verification.as_str(),
                    dedupe = self.dedupe.as_str(),
                    outcome,
                    upstream_status = self.upstream_status,
                    secret = self.secret_index,
                    duration_ms,
                    traceparent = self.traceparent.as_deref(),
                    $($field = $value,)*
                    "delivery"
                )
            };
        }
        if matches!(
            self.outcome,
            Outcome::Forwarded | Outcome::Duplicate | Outcome::Accepted
        ) {
            delivery_line!(info);
        } else {
            delivery_line!(
                warn,
                detail = self.detail.as_deref(),
                side = self.side.map(Side::as_str)
            );
        }
    }
}
