//! Logs: one typed record per delivery, written as one JSON line.
//!
//! [`DeliveryRecord`] is the single place where a delivery's outcome is
//! reported, so the log line and the counters cannot disagree.

use std::time::Instant;

use tracing_subscriber::EnvFilter;

mod json_line;
use json_line::JsonLine;

use crate::error::GateError;
use crate::metrics::Metrics;

/// Installs the JSON log subscriber on stdout; `RUST_LOG` sets the filter.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .event_format(JsonLine)
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .try_init();
}

/// Everything the delivery log says about one delivery. Holds no body and
/// no secret: only names, the key, outcomes and numbers.
#[derive(Debug)]
pub struct DeliveryRecord {
    started: Instant,
    pub provider: String,
    pub key: Option<String>,
    /// `ok`, `invalid`, `stale` or `skipped`.
    pub verification: &'static str,
    /// `fresh`, `duplicate`, `in_flight`, `mismatch` or `none`.
    pub dedupe: &'static str,
    /// A code of SPEC section 2, `forwarded`, `duplicate` or `upstream_error`.
    pub outcome: &'static str,
    pub upstream_status: Option<u16>,
    pub secret_index: Option<usize>,
    pub traceparent: Option<String>,
    /// What went wrong, for operators: never shown to the sender.
    pub detail: Option<String>,
}

impl DeliveryRecord {
    pub fn new(provider: &str, traceparent: Option<String>) -> Self {
        Self {
            started: Instant::now(),
            provider: provider.to_owned(),
            key: None,
            verification: "skipped",
            dedupe: "none",
            outcome: "forwarded",
            upstream_status: None,
            secret_index: None,
            traceparent,
            detail: None,
        }
    }

    /// Records a failure that ends the delivery.
    pub fn fail(&mut self, error: &GateError) {
        self.outcome = error.code();
        self.detail = Some(error.to_string());
        match error {
            GateError::InvalidSignature { .. } => self.verification = "invalid",
            GateError::StaleTimestamp { .. } => self.verification = "stale",
            GateError::InFlight { .. } => self.dedupe = "in_flight",
            GateError::PayloadMismatch { .. } => self.dedupe = "mismatch",
            _ => {}
        }
    }

    /// Writes the delivery's log line and counts it.
    pub fn emit(self, metrics: &Metrics) {
        let elapsed = self.started.elapsed();
        metrics.delivery(&self.provider, self.outcome, elapsed);
        if let Some(index) = self.secret_index {
            metrics.secret_match(&self.provider, index);
        }
        let duration_ms = elapsed.as_secs_f64() * 1000.0;
        let duration_ms = (duration_ms * 1000.0).round() / 1000.0;
        if self.outcome == "forwarded" || self.outcome == "duplicate" {
            tracing::info!(
                target: "hookgate::delivery",
                provider = self.provider.as_str(),
                key = self.key.as_deref(),
                verification = self.verification,
                dedupe = self.dedupe,
                outcome = self.outcome,
                upstream_status = self.upstream_status,
                secret = self.secret_index,
                duration_ms,
                traceparent = self.traceparent.as_deref(),
                "delivery"
            );
        } else {
            tracing::warn!(
                target: "hookgate::delivery",
                provider = self.provider.as_str(),
                key = self.key.as_deref(),
                verification = self.verification,
                dedupe = self.dedupe,
                outcome = self.outcome,
                upstream_status = self.upstream_status,
                secret = self.secret_index,
                duration_ms,
                traceparent = self.traceparent.as_deref(),
                detail = self.detail.as_deref(),
                "delivery"
            );
        }
    }
}
