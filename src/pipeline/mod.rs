//! The delivery pipeline: rate limit -> read -> verify -> window -> key -> claim ->
//! forward -> finish. Each phase is a small function in its own file; this
//! file routes requests and runs the phases in order.

mod batch;
mod claim;
mod finish;
mod forward;
mod limit;
mod passthrough;
mod read;
mod verify;

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, request};
use hyper::body::Incoming;

use crate::body::ProxyBody;
use crate::error::GateError;
use crate::gate::{Gate, Provider};
use crate::key::KeySource;
use crate::server::Conn;
use crate::telemetry::DeliveryRecord;

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
    let Some(index) = gate.route(req.uri().path()) else {
        return if gate.settings.upstream.passthrough {
            passthrough::forward(&gate, req, conn).await
        } else {
            GateError::UnknownRoute.to_response()
        };
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
        Err(e) => {
            tracing::error!(error = %e, "delivery task failed");
            GateError::UpstreamUnreachable("internal error".into()).to_response()
        }
    }
}

/// Runs the phases for one delivery and writes its log line.
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
    let response = match phases(&mut cx, incoming).await {
        Ok(response) => response,
        Err(error) => {
            cx.record.fail(&error);
            error.to_response()
        }
    };
    cx.record.emit(&cx.gate.metrics);
    response
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
            let held = vec![(identity.key, token)];
            cx.gate.track(&held);
            let answer = forward::send(cx, Some(&held[0].0)).await;
            let gate = Arc::clone(&cx.gate);
            let tokens: Vec<_> = held.iter().map(|(_, t)| t.clone()).collect();
            let result = finish::claimed(cx, held, answer).await;
            gate.untrack(&tokens);
            result
        }
        claim::Decision::Replay(snapshot) => Ok(finish::replay(snapshot)),
    }
}
