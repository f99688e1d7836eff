//! The delivery pipeline (SPEC section 1). Each stage takes what the one
//! before produced and returns a value; none reaches into the gate for
//! more than it is given.
//!
//! How a delivery flows, by stage and the type it hands on:
//!
//! | stage | file | takes | returns |
//! |---|---|---|---|
//! | route | `crate::route` | the path | [`Route`]: a provider, refused (`bad_path`), or passthrough |
//! | limit | `limit.rs` | the provider's and the source's buckets | `()` or 429 |
//! | read | `read.rs` | the head and the body stream | [`read::Request`]: head and raw bytes |
//! | verify | `verify.rs` | the provider, the request | [`Verified`](crate::provider::Verified): the matching secret, the signed time |
//! | plan | `plan.rs` | the provider's key settings, the request | [`plan::Plan`]: `Unkeyed`, or `Keyed` identities (a single key is a batch of one) |
//! | claim | `claim.rs` | the store, the identities | [`claim::Claimed`]: `Fresh` held claims (a guard) with the body to send, or `Replay` |
//! | forward | `forward.rs` | the upstream, the request, what to send | the app's answer ([`Buffered`](crate::upstream::Buffered)) or why there is none |
//! | finish | `finish.rs` | the marks, the held claims, the answer | the response and its [`Outcome`] |
//!
//! The runner below threads the values through and fills the delivery's
//! [`DeliveryRecord`] from them; the record alone writes the log line, the
//! counters and the delivery's span. Queue mode's `accept` is the terminal
//! stage in place of `claim`. With traces on, verify, claim (or accept),
//! forward and finish each get a span under the delivery's
//! ([`crate::telemetry::trace`]); the forward span's (and accept's)
//! context is what the app's `traceparent` names.

mod accept;
mod budget;
mod claim;
mod finish;
mod forward;
mod held;
mod limit;
mod passthrough;
mod plan;
mod read;
mod verify;

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use http::{Method, Request, Response, request};
use hyper::body::Incoming;
use tokio::sync::oneshot;

use self::accept::AcceptContext;
pub use self::budget::BodyBudget;
use self::claim::{ClaimContext, Claims};
pub use self::finish::Marks;
use self::forward::Payload;
use self::held::HeldClaims;
pub use self::held::Inflight;
use self::limit::Source;
use self::plan::Plan;
use crate::body::ProxyBody;
use crate::error::GateError;
use crate::gate::{Gate, Provider};
use crate::metrics::Metrics;
use crate::route::Route;
use crate::server::Conn;
use crate::settings::{Mode, ProviderSettings};
use crate::telemetry::trace::Stage;
use crate::telemetry::{DeliveryRecord, Outcome, Verification};

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
    // never left to expire with the app's work unrecorded. The future is
    // boxed first: tokio copies a task's whole stage (its future or its
    // output) by value when it spawns it, stores it and reads and drops
    // the output, and a delivery's future is some 4 KiB; boxed, the
    // stage is the size of the output, for one allocation.
    //
    // The response comes back on a channel of its own: the task runs on
    // after it, to mark what the app took (`finish::Settle`).
    let (respond, response) = oneshot::channel();
    tokio::spawn(Box::pin(deliver(gate, index, req, conn, respond)));
    match response.await {
        Ok(response) => response,
        // `deliver` contains its own panics, so this is a runtime shutting
        // down under it.
        Err(_) => GateError::Internal("the delivery's task was dropped".into()).to_response(),
    }
}

/// Runs the stages for one delivery, writes its log line, sends the
/// response, then makes the marks of an event the app took. A panic in a
/// stage is a defect: it is answered 500 `internal_error`, logged and
/// counted like any outcome, and its claims are released as the stages'
/// future unwinds (`held::HeldClaims`).
async fn deliver(
    gate: Arc<Gate>,
    index: usize,
    req: Request<Incoming>,
    conn: Conn,
    respond: oneshot::Sender<Response<ProxyBody>>,
) {
    let _delivering = crate::cores::Delivering::start();
    let provider = &gate.providers[index];
    let (head, incoming) = req.into_parts();
    let traceparent = head
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut record = DeliveryRecord::new(&provider.settings.name, traceparent);
    record.trace = gate
        .traces
        .as_ref()
        .map(|traces| traces.delivery(&provider.settings.name, &head.headers));
    let mut unfinished = Unfinished {
        record: Some(record),
        metrics: &gate.metrics,
    };
    let record = unfinished.record();
    let run = stages(&gate, provider, conn, head, incoming, record);
    let (response, settle) = match AssertUnwindSafe(run).catch_unwind().await {
        Ok(Ok(finished)) => (finished.response, finished.settle),
        Ok(Err(error)) => {
            record.fail(&error);
            (error.to_response(), None)
        }
        Err(panic) => {
            let error = GateError::Internal(panic_message(panic.as_ref()));
            record.fail(&error);
            (error.to_response(), None)
        }
    };
    // The line, the counters and the spans say what the sender is told,
    // and how long it waited for it.
    unfinished.emit();
    let _ = respond.send(response);
    if let Some(settle) = settle {
        mark_after_answer(&gate, provider, settle).await;
    }
}

/// Makes the marks of a delivery whose sender has been answered (SPEC
/// section 1, step 9: the answer does not wait on them). A redelivery
/// meanwhile waits for them (`held::Inflight::marking`).
async fn mark_after_answer(gate: &Gate, provider: &Provider, settle: finish::Settle) {
    // The connection's task writes the answer before the marks run: on a
    // core with nothing else in flight the sqlite store runs them inline
    // (`store::sqlite`), which would hold the answer back.
    tokio::task::yield_now().await;
    if let Some(delay) = gate.settings.faults.mark_delay {
        tokio::time::sleep(delay).await;
    }
    let marked = AssertUnwindSafe(settle.run(&gate.marks, &provider.settings));
    if let Err(panic) = marked.catch_unwind().await {
        tracing::error!(
            panic = panic_message(panic.as_ref()),
            "a delivery's marks panicked after its sender was answered; its claims are released"
        );
    }
}

/// What the stages end with: the sender's response, and the marks to make
/// once it has gone.
struct Finished {
    response: Response<ProxyBody>,
    settle: Option<finish::Settle>,
}

impl From<Response<ProxyBody>> for Finished {
    fn from(response: Response<ProxyBody>) -> Self {
        Self {
            response,
            settle: None,
        }
    }
}

/// A delivery's record until its line is written. The delivery's task is
/// dropped, stages and all, when its core stops under it: the shutdown's
/// grace ran out with the app still working or the body still coming.
/// Such a delivery still gets its line, is counted and its span ended, as
/// `internal_error`. Its claims are released once the cores have stopped
/// (`Gate::release_inflight`); only a claim whose answer the dropped task
/// never read (the store granted it as the task went) waits out its lease.
struct Unfinished<'a> {
    record: Option<DeliveryRecord>,
    metrics: &'a Metrics,
}

impl Unfinished<'_> {
    fn record(&mut self) -> &mut DeliveryRecord {
        let Some(record) = &mut self.record else {
            unreachable!("the record is taken only by `emit`, which consumes the guard");
        };
        record
    }

    /// Writes the finished delivery's line.
    fn emit(mut self) {
        if let Some(record) = self.record.take() {
            record.emit(self.metrics);
        }
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(mut record) = self.record.take() {
            record.fail(&GateError::Internal(
                "the gate stopped before the delivery finished (shutdown grace elapsed)".into(),
            ));
            record.emit(self.metrics);
        }
    }
}

/// The stages in order; the record learns each one's result.
async fn stages(
    gate: &Gate,
    provider: &Provider,
    conn: Conn,
    head: request::Parts,
    incoming: Incoming,
    record: &mut DeliveryRecord,
) -> Result<Finished, GateError> {
    let source = Source {
        limit: gate.source_limit.as_ref(),
        header: gate.settings.server.client_ip_header.as_ref(),
        peer: conn.peer.ip(),
    };
    limit::check(provider, &source, &head.headers)?;
    let request = read::read(&gate.settings.server, &gate.bodies, head, incoming).await?;
    let span = record.stage(Stage::Verify);
    let verified = span.end(verify::verify(provider, &request))?;
    record.verification = Verification::Ok;
    record.secret_index = Some(verified.secret_index);
    let settings = &provider.settings;
    let read = Read {
        gate,
        settings,
        request: &request,
        conn,
    };
    let identities = match plan::plan(settings, &request)? {
        // No key, forwarded without dedupe (in queue mode too: such
        // deliveries, Slack's url_verification say, want the app's answer).
        Plan::Unkeyed => return send(&read, None, Payload::Signed(None), record).await,
        Plan::Keyed(identities) => identities,
    };
    record.key = Some(Plan::label(&identities));
    if settings.mode == Mode::Queue {
        return queued(&read, &identities, record).await;
    }
    claimed(&read, &identities, record).await
}

/// A verified delivery, read whole, and where it goes: what the terminal
/// stages take.
struct Read<'a> {
    gate: &'a Gate,
    settings: &'a ProviderSettings,
    request: &'a read::Request,
    conn: Conn,
}

/// Queue mode's terminal stage: accept into the outbox, answer at once.
async fn queued(
    read: &Read<'_>,
    identities: &[plan::Identity],
    record: &mut DeliveryRecord,
) -> Result<Finished, GateError> {
    let span = record.stage(Stage::Accept);
    let cx = AcceptContext {
        store: &read.gate.store,
        queue: &read.gate.settings.queue,
        relay: &read.gate.relay_wakeup,
        trace: &span,
    };
    let accepted = accept::accept(&cx, read.settings, read.request, read.conn, identities).await;
    let accepted = span.end(accepted)?;
    record.dedupe = accepted.dedupe;
    record.mismatch = accepted.mismatch;
    record.outcome = if accepted.accepted {
        Outcome::Accepted
    } else {
        Outcome::Duplicate
    };
    Ok(accepted.response.into())
}

/// Forward mode: claim every key, then forward a fresh delivery (or answer
/// a duplicate from its stored response).
async fn claimed(
    read: &Read<'_>,
    identities: &[plan::Identity],
    record: &mut DeliveryRecord,
) -> Result<Finished, GateError> {
    let Read { gate, settings, .. } = read;
    let cx = ClaimContext {
        store: &gate.store,
        inflight: &gate.inflight,
        lease: gate.settings.dedupe.lease,
    };
    let span = record.stage(Stage::Claim);
    let claimed = span.end(claim::claim(&cx, settings, &read.request.body, identities).await)?;
    record.dedupe = claimed.dedupe;
    record.mismatch = claimed.mismatch;
    let (held, partial) = match claimed.claims {
        Claims::Replay(snapshot) => {
            record.outcome = Outcome::Duplicate;
            record.upstream_status = Some(snapshot.status);
            return Ok(finish::stored(snapshot, "duplicate").into());
        }
        Claims::Fresh { held, partial } => (held, partial),
    };
    fault_point(gate);
    let payload = match (partial, identities) {
        (Some(partial), _) => Payload::Partial(partial, None),
        (None, [one]) => Payload::Signed(Some(one.key.clone())),
        (None, _) => Payload::Signed(None),
    };
    send(read, Some(held), payload, record).await
}

/// The forward and finish stages.
async fn send(
    read: &Read<'_>,
    held: Option<HeldClaims>,
    payload: Payload,
    record: &mut DeliveryRecord,
) -> Result<Finished, GateError> {
    let span = record.stage(Stage::Forward);
    let Read { gate, settings, .. } = read;
    let answer = forward::send(
        &gate.upstream,
        settings,
        read.request,
        read.conn,
        payload,
        &span,
    );
    let answer = answer.await;
    span.answered(&answer);
    record.upstream_status = answer.as_ref().ok().map(|a| a.parts.status.as_u16());
    let span = record.stage(Stage::Finish);
    let finished = finish::finish(&gate.marks, settings, held, answer).await;
    let (response, outcome, settle) = span.end(finished)?;
    record.outcome = outcome;
    Ok(Finished { response, settle })
}

/// Where tests inject a defect (`Settings::faults`): claims are held.
fn fault_point(gate: &Gate) {
    if gate.settings.faults.panic_after_claim {
        panic!("injected fault: panic after claim");
    }
}

/// The text a panic carried, when it was a string (it usually is).
fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned())
}
