//! Commands of concurrent deliveries to one redis server, written as one
//! pipeline while the previous one is in flight.
//!
//! The crate's multiplexed connection writes whatever is queued when its
//! driver task runs: at 64 connections, about 8 commands per read of
//! redis-server's, each read, write and event-loop turn paid on both
//! sides. Here the next commands wait while a batch is out and go together
//! when it is answered (no timer: an idle gate sends at once), so more of
//! them share each turn: 6% less gate CPU and 12% less redis-server CPU
//! per fresh event (docs/BENCHMARKS.md). Written by hand because the crate
//! has no such mode: its pipelines hold one caller's commands.
//!
//! Replies go back as they came, server errors included (`query_async`
//! turns those into errors, and a script's `NOSCRIPT` into a load and a
//! retry), and a failed batch fails each of its commands with the batch's
//! error. A command whose caller has given up (the store's timeout) is
//! not sent: after an outage, the queue does not replay stale claims.
//! Should the task be gone (its runtime shut down), commands go to the
//! manager one by one, as without batching.

use std::sync::{Arc, Mutex, PoisonError};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};

/// The most commands in one batch: enough to gather a burst, small enough
/// that one batch's replies do not hold up the next for long.
const MOST: usize = 64;

/// The manager that `Link::renew` may replace; each batch uses the current one.
pub(super) type Shared = Arc<Mutex<ConnectionManager>>;

struct Request {
    cmd: Cmd,
    reply: oneshot::Sender<RedisResult<Value>>,
}

/// A handle to the task that writes the batches; cloning it is cheap.
#[derive(Clone)]
pub(super) struct Batcher {
    requests: mpsc::UnboundedSender<Request>,
    manager: Shared,
}

impl Batcher {
    /// Starts the batching task on the current runtime; it ends when the
    /// last handle is dropped.
    pub(super) fn spawn(manager: Shared) -> Self {
        let (requests, queue) = mpsc::unbounded_channel();
        tokio::spawn(drive(queue, Arc::clone(&manager)));
        Self { requests, manager }
    }

    /// The current manager, for what is not batched.
    pub(super) fn manager(&self) -> ConnectionManager {
        current(&self.manager)
    }

    /// Sends `cmd` with the next batch and waits for its reply.
    pub(super) async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            cmd: cmd.clone(),
            reply,
        };
        if self.requests.send(request).is_err() {
            return self.manager().req_packed_command(cmd).await;
        }
        answer.await.map_err(|_| stopped())?
    }
}

/// The lock only guards the swap in `Link::renew`; a poisoned one still
/// holds a usable manager.
fn current(manager: &Shared) -> ConnectionManager {
    manager
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

async fn drive(mut queue: mpsc::UnboundedReceiver<Request>, manager: Shared) {
    let mut batch = Vec::with_capacity(MOST);
    let mut replies = Vec::with_capacity(MOST);
    while queue.recv_many(&mut batch, MOST).await > 0 {
        batch.retain(|request| !request.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let mut conn = current(&manager);
        if batch.len() == 1
            && let Some(Request { cmd, reply }) = batch.pop()
        {
            // The caller may have given up (its own timeout): nothing to do.
            let _ = reply.send(conn.req_packed_command(&cmd).await);
            continue;
        }
        let mut pipeline = redis::pipe();
        for Request { cmd, reply } in batch.drain(..) {
            pipeline.add_command(cmd);
            replies.push(reply);
        }
        match conn.req_packed_commands(&pipeline, 0, replies.len()).await {
            Ok(values) if values.len() == replies.len() => {
                for (reply, value) in replies.drain(..).zip(values) {
                    let _ = reply.send(Ok(value));
                }
            }
            Ok(_) => answer_all(&mut replies, &short()),
            Err(err) => answer_all(&mut replies, &err),
        }
    }
}

fn answer_all(replies: &mut Vec<oneshot::Sender<RedisResult<Value>>>, err: &RedisError) {
    for reply in replies.drain(..) {
        let _ = reply.send(Err(err.clone()));
    }
}

fn stopped() -> RedisError {
    RedisError::from((ErrorKind::Io, "the redis batching task stopped"))
}

fn short() -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "redis answered a batch with fewer replies than commands",
    ))
}
