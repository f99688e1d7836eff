//! Traces (SPEC section 6): one span per delivery, with a child span per
//! stage (verify; claim, or accept in queue mode; forward; finish), and one
//! span per relay attempt; W3C trace context in and out; exported as
//! OTLP/HTTP protobuf by the SDK's batch processor.
//!
//! The delivery span continues the sender's `traceparent` (and keeps its
//! `tracestate`); the app gets a `traceparent` whose parent is the forward
//! span (or, in queue mode, the relay attempt's), since the gate is a hop.
//! Sampling is parent-based: a sender's sampled trace is kept, an unsampled
//! one is not, and a new trace is kept at `telemetry.trace_sample_ratio`.
//!
//! Attributes are names, codes, numbers and the event key (the id the app
//! gets in `Hookgate-Event-Key`, and the delivery log's `key`): never a
//! secret, a signature, a header's value or the body.
//!
//! With traces off the gate holds no [`Traces`], every [`StageSpan`] is
//! `StageSpan(None)`, and a delivery allocates nothing for them; the
//! sender's `traceparent` then reaches the app unchanged.

use std::borrow::Cow;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt as _, TraceFlags, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::HeaderExtractor;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, Span};

use super::DeliveryRecord;
use crate::error::{GateError, Side};
use crate::metrics::{ExportClient, OtlpError};
use crate::settings::TraceSettings;
use crate::upstream::{Buffered, UpstreamError};

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The tracer, while traces are on.
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

/// The stages that get a span of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Verify,
    /// Forward mode's claim in the dedupe store.
    Claim,
    /// Queue mode's claim: the dedupe entries and jobs, written at once.
    Accept,
    Forward,
    Finish,
}

/// The delivery's span, the parent of its stages' spans. Ended with the
/// delivery record's attributes ([`DeliveryRecord::emit`]).
pub struct DeliverySpan {
    tracer: SdkTracer,
    /// Holds the delivery span.
    cx: Context,
}

/// A stage's or relay attempt's span; `None` when traces are off. Ended
/// when dropped, if not before (a stage that panics still ends its span).
/// Boxed: the SDK's span is about 300 bytes, and stage spans live across
/// the awaits of every delivery's future, traced or not.
pub struct StageSpan(Option<Box<Span>>);

impl std::fmt::Debug for DeliverySpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let span = self.cx.span();
        let cx = span.span_context();
        f.debug_struct("DeliverySpan")
            .field("trace_id", &cx.trace_id())
            .field("span_id", &cx.span_id())
            .finish()
    }
}

impl Traces {
    /// Starts the batch exporter. Must run inside the tokio runtime.
    pub fn start(settings: &TraceSettings) -> Result<Self, OtlpError> {
        let exporter = SpanExporter::builder()
            .with_http()
            .with_http_client(ExportClient::new(settings.timeout)?)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(settings.endpoint.to_string())
            .with_timeout(settings.timeout)
            .build()
            .map_err(|e| OtlpError::Exporter(e.to_string()))?;
        let root = if settings.sample_ratio >= 1.0 {
            Sampler::AlwaysOn
        } else {
            Sampler::TraceIdRatioBased(settings.sample_ratio)
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_sampler(Sampler::ParentBased(Box::new(root)))
            .with_resource(Resource::builder().with_service_name("hookgate").build())
            .build();
        let tracer = provider.tracer("hookgate");
        Ok(Self { provider, tracer })
    }

    /// Opens a delivery's span, in the sender's trace when its
    /// `traceparent` is valid, else at the root of a new trace.
    pub fn delivery(&self, provider: &str, headers: &HeaderMap) -> DeliverySpan {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        let span = self
            .tracer
            .span_builder("delivery")
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("hookgate.provider", provider.to_owned())])
            .start_with_context(&self.tracer, &parent);
        DeliverySpan {
            tracer: self.tracer.clone(),
            cx: Context::new().with_span(span),
        }
    }

    /// Opens a relay attempt's span, as a child of the span whose context
    /// the job's headers carry (the accept stage's), and puts its own
    /// context there for the app.
    pub fn relay_attempt(
        &self,
        provider: &str,
        key: &str,
        attempt: u32,
        headers: &mut HeaderMap,
    ) -> StageSpan {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        let span = self
            .tracer
            .span_builder("relay attempt")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("hookgate.provider", provider.to_owned()),
                KeyValue::new("hookgate.event_key", key.to_owned()),
                KeyValue::new("hookgate.attempt", i64::from(attempt)),
            ])
            .start_with_context(&self.tracer, &parent);
        let span = StageSpan(Some(Box::new(span)));
        span.propagate(headers);
        span
    }

    /// Exports what is left and stops the exporter's thread, from a
    /// blocking-pool thread (as `metrics::Otlp::shutdown`, for the same
    /// reason).
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "OTLP: last trace export failed"),
            Err(e) => tracing::warn!(error = %e, "OTLP: trace shutdown did not finish"),
        }
    }
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Self::Verify => "verify",
            Self::Claim => "claim",
            Self::Accept => "accept",
            Self::Forward => "forward",
            Self::Finish => "finish",
        }
    }

    fn kind(self) -> SpanKind {
        match self {
            Self::Forward => SpanKind::Client,
            _ => SpanKind::Internal,
        }
    }
}

impl DeliverySpan {
    pub fn stage(&self, stage: Stage) -> StageSpan {
        let span = self
            .tracer
            .span_builder(stage.name())
            .with_kind(stage.kind())
            .start_with_context(&self.tracer, &self.cx);
        StageSpan(Some(Box::new(span)))
    }

    /// Ends the span with what the record says of the delivery. Server
    /// span conventions: the sender's mistakes (4xx) are not errors of the
    /// gate; the app's, the store's and the gate's failures are.
    pub(super) fn end(self, record: &DeliveryRecord) {
        let span = self.cx.span();
        let outcome = record.outcome.as_str();
        span.set_attribute(KeyValue::new("hookgate.outcome", outcome));
        span.set_attribute(KeyValue::new(
            "hookgate.verification",
            record.verification.as_str(),
        ));
        span.set_attribute(KeyValue::new("hookgate.dedupe", record.dedupe.as_str()));
        if let Some(key) = &record.key {
            span.set_attribute(KeyValue::new("hookgate.event_key", key.clone()));
        }
        if let Some(status) = record.upstream_status {
            span.set_attribute(KeyValue::new("hookgate.upstream_status", i64::from(status)));
        }
        let failed = match record.side {
            Some(Side::Upstream | Side::Internal) => true,
            Some(Side::Downstream) => false,
            None => record.upstream_status.is_some_and(|s| s >= 500),
        };
        if failed {
            span.set_attribute(KeyValue::new("error.type", outcome));
            span.set_status(Status::error(outcome));
        }
        span.end();
    }
}

impl StageSpan {
    /// Traces are off.
    pub const OFF: Self = Self(None);

    /// Ends a stage's span with its result: an error's code, never its
    /// detail (which may name a key's fingerprint or a URL).
    pub fn end<T>(self, result: Result<T, GateError>) -> Result<T, GateError> {
        if let (Some(mut span), Err(e)) = (self.0, &result) {
            span.set_attribute(KeyValue::new("error.type", e.code()));
            span.set_status(Status::error(e.code()));
            span.end();
        }
        result
    }

    /// Ends a forward span (or a relay attempt's) with the app's status,
    /// or why there is none. The app's 4xx and 5xx are errors of this call.
    pub fn answered(self, answer: &Result<Buffered, UpstreamError>) {
        let Some(mut span) = self.0 else { return };
        match answer {
            Ok(answer) => {
                let status = answer.parts.status.as_u16();
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
                if status >= 400 {
                    span.set_status(Status::error(Cow::Owned(status.to_string())));
                }
            }
            Err(e) => {
                let kind = match e {
                    UpstreamError::Timeout(_) => "timeout",
                    UpstreamError::Connect(_) => "connect",
                    UpstreamError::Other(_) => "other",
                };
                span.set_attribute(KeyValue::new("error.type", kind));
                span.set_status(Status::error(kind));
            }
        }
        span.end();
    }

    /// Records how a relay attempt was settled.
    pub fn settled(&mut self, outcome: &'static str) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new("hookgate.outcome", outcome));
        }
    }

    /// Puts this span's context in `traceparent` (and the trace's state in
    /// `tracestate`, or none when it has none), replacing the sender's: the
    /// next hop's parent is this span. Off, the headers stay as they are.
    pub fn propagate(&self, headers: &mut HeaderMap) {
        let Some(span) = &self.0 else { return };
        let cx = span.span_context();
        if !cx.is_valid() {
            return;
        }
        let parent = format!(
            "00-{}-{}-{:02x}",
            cx.trace_id(),
            cx.span_id(),
            cx.trace_flags() & TraceFlags::SAMPLED
        );
        if let Ok(v) = HeaderValue::try_from(parent) {
            headers.insert(TRACEPARENT, v);
        }
        // The propagator would write an empty `tracestate`; none is added.
        match HeaderValue::try_from(cx.trace_state().header()) {
            Ok(v) if !v.is_empty() => {
                headers.insert(TRACESTATE, v);
            }
            _ => {
                headers.remove(TRACESTATE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off, a stage's span is a null pointer in the delivery's future: no
    /// allocation, nothing to drop.
    #[test]
    fn a_span_of_traces_off_costs_a_word() {
        assert_eq!(
            std::mem::size_of::<StageSpan>(),
            std::mem::size_of::<usize>()
        );
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static("00-ab-cd-01"));
        StageSpan::OFF.propagate(&mut headers);
        assert_eq!(
            headers[TRACEPARENT], "00-ab-cd-01",
            "left as the sender sent it"
        );
        assert_eq!(StageSpan::OFF.end(Ok::<_, GateError>(7)).unwrap(), 7);
    }
}
