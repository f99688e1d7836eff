//! The admin listener: `/healthz` (the process runs), `/readyz` (the store
//! answers), `/metrics`, and queue mode's `GET /queue` and
//! `POST /queue/replay`. The queue's endpoints require `server.admin_token`
//! as a bearer token and answer 401 without it (or when none is set): a
//! replay changes state, and a listing shows event ids and the app's
//! errors. The probes and `/metrics` stay open, as the kubelet and a
//! Prometheus scrape expect.

mod ready;

pub use ready::Readiness;

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::body::{ProxyBody, full};
use crate::gate::Gate;
use crate::store::Backend;
use crate::store::outbox::{JobFilter, JobState, JobSummary, Outbox};

pub async fn handle(gate: Arc<Gate>, req: Request<Incoming>) -> Response<ProxyBody> {
    match (req.method(), req.uri().path()) {
        (_, "/healthz") => text(StatusCode::OK, "ok\n"),
        (_, "/metrics") => {
            let mut response = Response::new(full(gate.metrics.encode()));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            response
        }
        (_, "/readyz") => {
            let store = Arc::clone(&gate.store);
            if gate
                .readiness
                .check(async move { store.ping().await })
                .await
            {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
            }
        }
        (_, "/queue" | "/queue/replay") if !authorized(&gate, &req) => {
            let mut refused = json(
                StatusCode::UNAUTHORIZED,
                serde_json::json!({"error": "unauthorized",
                    "message": "This endpoint needs server.admin_token as a bearer token."}),
            );
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            refused
        }
        (&Method::GET, "/queue") => list(&gate, &req).await,
        (&Method::POST, "/queue/replay") => replay(&gate, &req).await,
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// The bearer token matches `server.admin_token`, compared in constant
/// time by their SHA-256 digests, so that not even the token's length
/// shows in the time taken. The scheme's name is case-insensitive (RFC
/// 9110, section 11.1).
fn authorized(gate: &Gate, req: &Request<Incoming>) -> bool {
    let Some(token) = &gate.admin_token else {
        return false;
    };
    let Some(given) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()))
    else {
        return false;
    };
    let given = Sha256::digest(given);
    token
        .active(SystemTime::now())
        .iter()
        .any(|secret| bool::from(Sha256::digest(secret.value.expose()).ct_eq(&given)))
}

/// The credentials of a `Bearer` authorization (`1*SP` after the scheme).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    let credentials = rest.trim_ascii_start();
    (scheme.eq_ignore_ascii_case(b"bearer ") && !credentials.is_empty()).then_some(credentials)
}

fn query(req: &Request<Incoming>) -> Vec<(String, String)> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `GET /queue?state=dead&provider=stripe`: at most 100 jobs, newest first.
async fn list(gate: &Gate, req: &Request<Incoming>) -> Response<ProxyBody> {
    let q = query(req);
    let state = match param(&q, "state").map(JobState::parse) {
        None => None,
        Some(Some(state)) => Some(state),
        // A misspelt state would otherwise list every job as if it matched.
        Some(None) => return bad_request("The state is pending, delivered or dead."),
    };
    let filter = JobFilter {
        state,
        provider: param(&q, "provider").map(str::to_owned),
        ..JobFilter::default()
    };
    match gate.store.jobs(filter, 100).await {
        Ok(jobs) => json(
            StatusCode::OK,
            serde_json::json!({ "jobs": jobs.iter().map(job_json).collect::<Vec<_>>() }),
        ),
        Err(e) => store_error(&e),
    }
}

/// `POST /queue/replay?provider=P&key=K` or `?dead=true[&provider=P]`.
async fn replay(gate: &Gate, req: &Request<Incoming>) -> Response<ProxyBody> {
    let q = query(req);
    let provider = param(&q, "provider").map(str::to_owned);
    let filter = match (param(&q, "key"), param(&q, "dead")) {
        (Some(key), None) if provider.is_some() => JobFilter {
            provider,
            key: Some(key.trim().to_lowercase()),
            ..JobFilter::default()
        },
        (None, Some("true")) => JobFilter {
            state: Some(JobState::Dead),
            provider,
            ..JobFilter::default()
        },
        _ => {
            return bad_request(
                "Replay one event (provider and key) or the dead letter (dead=true).",
            );
        }
    };
    match gate.store.replay(filter).await {
        Ok(n) => {
            gate.relay_wakeup.notify_one();
            json(StatusCode::OK, serde_json::json!({ "replayed": n }))
        }
        Err(e) => store_error(&e),
    }
}

fn job_json(job: &JobSummary) -> serde_json::Value {
    let stamp = |t| humantime::format_rfc3339_millis(t).to_string();
    serde_json::json!({
        "id": job.id,
        "provider": job.key.provider,
        "key": job.key.key,
        "state": job.state.as_str(),
        "attempts": job.attempts,
        "received_at": stamp(job.received_at),
        "due_at": stamp(job.due_at),
        "last_status": job.last_status,
        "last_error": job.last_error,
    })
}

fn store_error(e: &crate::store::StoreError) -> Response<ProxyBody> {
    tracing::warn!(error = %e, "admin: store error");
    json(
        StatusCode::SERVICE_UNAVAILABLE,
        serde_json::json!({"error": "store_unavailable", "message": "The store is unavailable."}),
    )
}

fn bad_request(message: &'static str) -> Response<ProxyBody> {
    json(
        StatusCode::BAD_REQUEST,
        serde_json::json!({"error": "bad_request", "message": message}),
    )
}

fn json(status: StatusCode, body: serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(full(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn text(status: StatusCode, body: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(full(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn a_bearer_scheme_is_matched_in_any_case() {
        assert_eq!(bearer(b"Bearer s3cret"), Some(&b"s3cret"[..]));
        assert_eq!(bearer(b"bEARER s3cret"), Some(&b"s3cret"[..]));
        assert_eq!(bearer(b"Bearer   s3cret"), Some(&b"s3cret"[..]));
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Basic czNjcmV0"), None);
        assert_eq!(bearer(b"Bearer"), None);
        assert_eq!(bearer(b"Bearers3cret"), None);
    }
}
