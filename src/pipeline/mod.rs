//! The delivery pipeline: rate limit -> read -> verify -> window -> key -> claim ->
//! forward -> finish. Each phase is a small function in its own file; this
//! file routes requests and runs the phases in order.

mod batch;
mod claim;
mod finish;
mod forward;
mod held;
mod limit;
mod passthrough;
mod read;
mod verify;

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Method, Request, Response, request};
use hyper::body::Incoming;

use crate::body::ProxyBody;
use crate::error::GateError;
use crate::gate::{Gate, Provider};
use crate::key::KeySource;
use crate::route::Route;
use crate::server::Conn;
use crate::telemetry::DeliveryRecord;
use held::HeldClaims;

/// What a phase hands on: the request head, its raw body and who sent it.
pub struct Context {
    pub gate: Arc<Gate>,
    pub provider: usize,
    pub head: request::Parts,
    pub body: Bytes,
    pub conn: Conn,
    pub record: DeliveryRecord,
}

impl Context {
    pub fn provider(&self) -> &Provider {
        &self.gate.providers[self.provider]
    }
}

/// Entry point for every request on the public listener.
pub async fn handle(gate: Arc<Gate>, req: Request<Incoming>, conn: Conn) -> Response<ProxyBody> {
    let index = match gate.route(req.uri().path()) {
        Route::Provider(index) => index,
        Route::Refused => {
            tracing::warn!(
                path = req.uri().path(),
                "refused a path that reaches a provider only through an ambiguous spelling"
            );
            return GateError::BadPath.to_response();
        }
        Route::Other if gate.settings.upstream.passthrough => {
            return passthrough::forward(&gate, req, conn).await;
        }
        Route::Other => return GateError::UnknownRoute.to_response(),
    };
    let provider = &gate.providers[index].settings;
    if req.method() != Method::POST {
        return if provider.passthrough_methods.contains(req.method()) {
            passthrough::forward(&gate, req, conn).await
        } else {
            GateError::MethodNotAllowed.to_response()
        };
    }
    // The delivery runs in a task of its own: if the sender hangs up after
    // the claim, the forward and its mark still complete, so the claim is
    // never left to expire with the app's work unrecorded.
    let task = tokio::spawn(deliver(gate, index, req, conn));
    match task.await {
        Ok(response) => response,
        // `deliver` contains its own panics, so this is a runtime shutting
        // down under it.
        Err(e) => GateError::Internal(e.to_string()).to_response(),
    }
}

/// Runs the phases for one delivery and writes its log line. A panic in a
/// phase is a defect: it is answered 500 `internal_error`, logged and
/// counted like any outcome, and its claims are released as the phases'
/// future unwinds (`HeldClaims`).
async fn deliver(
    gate: Arc<Gate>,
    provider: usize,
    req: Request<Incoming>,
    conn: Conn,
) -> Response<ProxyBody> {
    let (head, incoming) = req.into_parts();
    let traceparent = head
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let record = DeliveryRecord::new(&gate.providers[provider].settings.name, traceparent);
    let mut cx = Context {
        gate,
        provider,
        head,
        body: Bytes::new(),
        conn,
        record,
    };
    let outcome = AssertUnwindSafe(phases(&mut cx, incoming))
        .catch_unwind()
        .await;
    let response = match outcome {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            cx.record.fail(&error);
            error.to_response()
        }
        Err(panic) => {
            let error = GateError::Internal(panic_message(panic.as_ref()));
            cx.record.fail(&error);
            error.to_response()
        }
    };
    cx.record.emit(&cx.gate.metrics);
    response
}

/// The text a panic carried, when it was a string (it usually is).
fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned())
}

async fn phases(cx: &mut Context, incoming: Incoming) -> Result<Response<ProxyBody>, GateError> {
    limit::check(cx)?;
    let body = read::body(cx, incoming).await?;
    cx.body = read::unshare(&mut cx.head, body);
    let verified = verify::signature(cx)?;
    verify::window(cx, verified.timestamp)?;
    if let Some(KeySource::Batch(pointer)) = &cx.provider().settings.key {
        let pointer = pointer.clone();
        return batch::run(cx, &pointer).await;
    }
    let Some(identity) = claim::identify(cx)? else {
        // No key and on_missing_key = "forward": no dedupe for this one.
        let answer = forward::send(cx, None).await;
        return finish::unclaimed(cx, answer);
    };
    match claim::claim(cx, &identity).await? {
        claim::Decision::Fresh(token) => {
            let held = HeldClaims::new(&cx.gate, vec![(identity.key, token)]);
            fault_point(cx);
            let key = held.claims()[0].0.clone();
            let answer = forward::send(cx, Some(&key)).await;
            finish::claimed(cx, held, answer).await
        }
        claim::Decision::Replay(snapshot) => Ok(finish::replay(snapshot)),
    }
}

/// Where tests inject a defect (`Settings::faults`): claims are held.
fn fault_point(cx: &Context) {
    if cx.gate.settings.faults.panic_after_claim {
        panic!("injected fault: panic after claim");
    }
}
