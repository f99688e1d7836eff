//! The one place that maps failures to HTTP (SPEC section 2).
//!
//! The sender sees a generic JSON body and a `Hookgate-Result` header; the
//! delivery log sees the detail. No message carries a secret, an expected
//! signature or payload contents.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::body::{ProxyBody, full};
use crate::provider::VerifyError;
use crate::store::StoreError;

/// Which side of the gate a failure came from (pingora's `ErrorSource`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The sender: bad signature, bad payload, too much traffic.
    Downstream,
    /// The application behind the gate.
    Upstream,
    /// The gate's own dependencies: the store.
    Internal,
}

impl Side {
    /// The delivery log's `side` field: who to look at first.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Downstream => "downstream",
            Self::Upstream => "upstream",
            Self::Internal => "internal",
        }
    }
}

/// Everything that ends a delivery with a response produced by the gate.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("signature rejected: {source}")]
    InvalidSignature {
        status: StatusCode,
        source: VerifyError,
    },
    #[error("signed timestamp is {skew_secs} s away from now")]
    StaleTimestamp { skew_secs: i64 },
    #[error("no idempotency key in the delivery")]
    MissingKey,
    #[error("payload does not parse: {0}")]
    BadPayload(String),
    #[error("the path reaches a provider only through an ambiguous spelling")]
    BadPath,
    #[error("no provider path matches")]
    UnknownRoute,
    #[error("method not allowed on a provider path")]
    MethodNotAllowed,
    #[error("another delivery of this event is in flight")]
    InFlight { retry_after: Duration },
    #[error("body larger than {limit} bytes")]
    PayloadTooLarge { limit: u64 },
    #[error("body not received within the read timeout")]
    RequestTimeout,
    #[error("payload fingerprint {incoming} differs from stored {stored}")]
    PayloadMismatch {
        key: String,
        stored: String,
        incoming: String,
    },
    #[error("rate limit exceeded")]
    RateLimited { retry_after: Duration },
    #[error("request bodies in flight at server.max_body_bytes_in_flight")]
    Overloaded,
    #[error("upstream unreachable: {0}")]
    UpstreamUnreachable(String),
    #[error("store unavailable: {0}")]
    StoreUnavailable(#[from] StoreError),
    #[error("upstream did not answer within {0:?}")]
    UpstreamTimeout(Duration),
    #[error("defect in the gate: {0}")]
    Internal(String),
}

/// A code and its body, `{"error":"<code>","message":"<sentence>"}`, as
/// `serde_json` would write them (keys in order, no spaces). Neither may
/// hold a quote or a backslash: a unit test checks every body against
/// `serde_json`'s own writing of it.
macro_rules! told {
    ($code:literal, $message:literal) => {
        (
            $code,
            concat!("{\"error\":\"", $code, "\",\"message\":\"", $message, "\"}"),
        )
    };
}

impl GateError {
    /// The stable code of SPEC section 2, also the metric's `outcome` label.
    pub fn code(&self) -> &'static str {
        self.told().0
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidSignature { status, .. } => *status,
            Self::StaleTimestamp { .. }
            | Self::MissingKey
            | Self::BadPayload(_)
            | Self::BadPath => StatusCode::BAD_REQUEST,
            Self::UnknownRoute => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::InFlight { .. } => StatusCode::CONFLICT,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::PayloadMismatch { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::UpstreamUnreachable(_) => StatusCode::BAD_GATEWAY,
            Self::Overloaded | Self::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn side(&self) -> Side {
        match self {
            Self::UpstreamUnreachable(_) | Self::UpstreamTimeout(_) => Side::Upstream,
            // The gate's own memory: bodies held by slow senders, or by
            // deliveries a slow app or store keeps in flight.
            Self::Overloaded | Self::StoreUnavailable(_) | Self::Internal(_) => Side::Internal,
            _ => Side::Downstream,
        }
    }

    /// What the sender is told: the code, and the JSON body with it and one
    /// human sentence; fixed text, so nothing leaks. A table, one row a
    /// variant. The bodies are written out at compile time (`told!`): a
    /// rejected delivery's answer costs no serialization.
    #[rustfmt::skip]
    fn told(&self) -> (&'static str, &'static str) {
        match self {
            Self::InvalidSignature { .. } => told!("invalid_signature",    "The webhook signature is missing or does not verify."),
            Self::StaleTimestamp { .. } =>   told!("stale_timestamp",      "The signed timestamp is outside the accepted window."),
            Self::MissingKey =>              told!("missing_key",          "The delivery carries no idempotency key."),
            Self::BadPayload(_) =>           told!("bad_payload",          "The payload could not be parsed to find its idempotency key."),
            Self::BadPath =>                 told!("bad_path",             "The path is an ambiguous spelling of a webhook path."),
            Self::UnknownRoute =>            told!("unknown_route",        "No webhook provider is configured for this path."),
            Self::MethodNotAllowed =>        told!("method_not_allowed",   "Webhook deliveries must use POST."),
            Self::InFlight { .. } =>         told!("in_flight",            "This event is being processed; retry later."),
            Self::PayloadTooLarge { .. } =>  told!("payload_too_large",    "The body is larger than the gate accepts."),
            Self::RequestTimeout =>          told!("request_timeout",      "The body did not arrive in time."),
            Self::PayloadMismatch { .. } =>  told!("payload_mismatch",     "This event id was already seen with a different payload."),
            Self::RateLimited { .. } =>      told!("rate_limited",         "Too many deliveries; retry later."),
            Self::Overloaded =>              told!("overloaded",           "The gate holds as many request bodies as it may; retry later."),
            Self::UpstreamUnreachable(_) =>  told!("upstream_unreachable", "The application could not be reached."),
            Self::StoreUnavailable(_) =>     told!("store_unavailable",    "The dedupe store is unavailable; retry later."),
            Self::UpstreamTimeout(_) =>      told!("upstream_timeout",     "The application did not answer in time."),
            Self::Internal(_) =>             told!("internal_error",       "The gate failed on this delivery; retry later."),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after } | Self::RateLimited { retry_after } => {
                Some(*retry_after)
            }
            Self::StoreUnavailable(_) => Some(Duration::from_secs(5)),
            Self::Overloaded => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// The response the sender gets.
    pub fn to_response(&self) -> Response<ProxyBody> {
        let (code, body) = self.told();
        let mut response = Response::new(full(Bytes::from_static(body.as_bytes())));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(RESULT_HEADER, HeaderValue::from_static(code));
        if let Some(after) = self.retry_after() {
            // Whole seconds, rounded up: Retry-After has no fractions.
            let secs = after.as_millis().div_ceil(1000).max(1);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
        }
        response
    }
}

/// The header that tells the sender (and tests) what the gate did.
pub const RESULT_HEADER: &str = "hookgate-result";

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn error_body_is_the_generic_json_with_code_header() {
        let err = GateError::InFlight {
            retry_after: Duration::from_millis(1500),
        };
        let resp = err.to_response();
        assert_eq!(resp.status(), StatusCode::CONFLICT);
        assert_eq!(resp.headers()[RESULT_HEADER], "in_flight");
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"], "in_flight");
        assert!(v["message"].as_str().unwrap().ends_with('.'));
    }

    /// Every variant once, for the test that walks the whole table. A
    /// variant added to `GateError` stops the match below from compiling
    /// until it is listed here too.
    fn one_of_each() -> Vec<GateError> {
        vec![
            GateError::InvalidSignature {
                status: StatusCode::UNAUTHORIZED,
                source: VerifyError::NoMatch,
            },
            GateError::StaleTimestamp { skew_secs: 301 },
            GateError::MissingKey,
            GateError::BadPayload("x".into()),
            GateError::BadPath,
            GateError::UnknownRoute,
            GateError::MethodNotAllowed,
            GateError::InFlight {
                retry_after: Duration::from_secs(1),
            },
            GateError::PayloadTooLarge { limit: 1 },
            GateError::RequestTimeout,
            GateError::PayloadMismatch {
                key: "k".into(),
                stored: "a".into(),
                incoming: "b".into(),
            },
            GateError::RateLimited {
                retry_after: Duration::from_secs(1),
            },
            GateError::Overloaded,
            GateError::UpstreamUnreachable("x".into()),
            GateError::StoreUnavailable(StoreError::Timeout(Duration::ZERO)),
            GateError::UpstreamTimeout(Duration::ZERO),
            GateError::Internal("x".into()),
        ]
    }

    #[tokio::test]
    async fn every_body_is_what_serde_json_writes_for_its_code_and_sentence() {
        let errors = one_of_each();
        for error in &errors {
            match error {
                GateError::InvalidSignature { .. }
                | GateError::StaleTimestamp { .. }
                | GateError::MissingKey
                | GateError::BadPayload(_)
                | GateError::BadPath
                | GateError::UnknownRoute
                | GateError::MethodNotAllowed
                | GateError::InFlight { .. }
                | GateError::PayloadTooLarge { .. }
                | GateError::RequestTimeout
                | GateError::PayloadMismatch { .. }
                | GateError::RateLimited { .. }
                | GateError::Overloaded
                | GateError::UpstreamUnreachable(_)
                | GateError::StoreUnavailable(_)
                | GateError::UpstreamTimeout(_)
                | GateError::Internal(_) => {}
            }
        }
        let codes: std::collections::HashSet<_> = errors.iter().map(GateError::code).collect();
        assert_eq!(codes.len(), errors.len(), "a code is used twice");
        for error in errors {
            let body = error.to_response().into_body().collect().await.unwrap();
            let body = body.to_bytes();
            // No escape at all: `told!` writes its text as it is.
            assert!(!body.contains(&b'\\'), "{}", error.code());
            let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(parsed["error"], error.code());
            let sentence = parsed["message"].as_str().unwrap();
            assert!(sentence.ends_with('.'), "{sentence}");
            let written = serde_json::json!({ "error": error.code(), "message": sentence });
            assert_eq!(body, written.to_string().as_bytes(), "{}", error.code());
        }
    }

    #[test]
    fn sides_decide_who_failed() {
        assert_eq!(
            GateError::UpstreamTimeout(Duration::ZERO).side(),
            Side::Upstream
        );
        assert_eq!(
            GateError::StoreUnavailable(StoreError::Timeout(Duration::ZERO)).side(),
            Side::Internal
        );
        assert_eq!(GateError::MissingKey.side(), Side::Downstream);
    }
}
