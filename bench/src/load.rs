//! The load engine: N keep-alive connections, each a task that takes the
//! next pre-signed request from a shared pool.
//!
//! Closed loop: every connection sends its next request as soon as the
//! previous answer is in (fixed concurrency, throughput is the result).
//! Open loop: request `i` is due at `start + i / rate` whatever happened
//! before (fixed rate, latency is the result). A connection that takes a due
//! request late because every connection was busy measures from the due
//! time, so a stall shows in the latency of every request it delayed (no
//! coordinated omission); one that had to wait for the due time measures
//! from when it actually sent, so the generator's timer slack is not blamed
//! on the server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::http1::Conn;
use crate::requests::Pool;

/// How requests are paced.
#[derive(Clone, Copy, Debug)]
pub enum Pacing {
    Closed,
    /// Requests per second, over all connections.
    Open(f64),
}

/// One measurement.
#[derive(Clone, Debug)]
pub struct Plan {
    pub addr: SocketAddr,
    pub connections: usize,
    pub pacing: Pacing,
    /// Sent but not recorded: connections open, caches and pools fill.
    pub warmup: Duration,
    pub duration: Duration,
    /// Runtime threads of the generator (1: a single-threaded runtime).
    pub threads: usize,
    /// A request without an answer by then counts as an error.
    pub timeout: Duration,
}

/// What a measurement saw in its measured phase.
pub struct Outcome {
    /// Answers received for requests sent in the measured phase.
    pub completed: u64,
    /// Of those, answers other than the expected one, plus failed exchanges.
    pub errors: u64,
    /// From the start of the measured phase to the last answer.
    pub elapsed: Duration,
    /// Latency in nanoseconds of every answer in `completed`.
    pub latency: Histogram<u64>,
    /// Answers over the whole run, warm-up included (for CPU per request).
    pub answered_total: u64,
    /// The pool of fresh events ran out before the end.
    pub exhausted: bool,
    pub first_error: Option<String>,
}

impl Outcome {
    pub fn per_second(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.completed as f64 / secs
        } else {
            0.0
        }
    }

    /// A latency quantile in milliseconds.
    pub fn ms(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1e6
    }
}

struct Shared {
    plan: Plan,
    pool: Arc<Pool>,
    next: AtomicUsize,
    start: Instant,
    measure_from: Instant,
    measure_until: Instant,
    completed: AtomicU64,
    answered_total: AtomicU64,
    errors: AtomicU64,
    exhausted: AtomicBool,
    latency: Mutex<Histogram<u64>>,
    last_answer: Mutex<Instant>,
    first_error: Mutex<Option<String>>,
}

/// Runs `plan` over `pool` on a runtime of its own and returns when every
/// connection has finished.
pub fn run(plan: &Plan, pool: Arc<Pool>) -> Outcome {
    let runtime = if plan.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(plan.threads)
            .enable_all()
            .build()
    }
    .expect("a tokio runtime for the load generator");
    runtime.block_on(run_async(plan.clone(), pool))
}

async fn run_async(plan: Plan, pool: Arc<Pool>) -> Outcome {
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let measure_until = measure_from + plan.duration;
    let latency = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let shared = Arc::new(Shared {
        plan: plan.clone(),
        pool,
        next: AtomicUsize::new(0),
        start,
        measure_from,
        measure_until,
        completed: AtomicU64::new(0),
        answered_total: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        exhausted: AtomicBool::new(false),
        latency: Mutex::new(latency),
        last_answer: Mutex::new(measure_from),
        first_error: Mutex::new(None),
    });
    let workers: Vec<_> = (0..plan.connections.max(1))
        .map(|_| tokio::spawn(worker(Arc::clone(&shared))))
        .collect();
    for w in workers {
        let _ = w.await;
    }
    let last = *shared.last_answer.lock().unwrap();
    let latency = std::mem::replace(
        &mut *shared.latency.lock().unwrap(),
        Histogram::new(3).unwrap(),
    );
    Outcome {
        completed: shared.completed.load(Ordering::Relaxed),
        errors: shared.errors.load(Ordering::Relaxed),
        answered_total: shared.answered_total.load(Ordering::Relaxed),
        elapsed: last.saturating_duration_since(measure_from),
        latency,
        exhausted: shared.exhausted.load(Ordering::Relaxed),
        first_error: shared.first_error.lock().unwrap().clone(),
    }
}

/// A request to send: its pool index and when it is due.
struct Due {
    index: usize,
    at: Option<Instant>,
}

impl Shared {
    /// The next request, or `None` when the run is over.
    fn take(&self) -> Option<Due> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed);
        let at = match self.plan.pacing {
            Pacing::Closed => {
                if Instant::now() >= self.measure_until {
                    return None;
                }
                None
            }
            Pacing::Open(rate) => {
                let due = self.start + Duration::from_secs_f64(slot as f64 / rate);
                if due >= self.measure_until {
                    return None;
                }
                Some(due)
            }
        };
        let len = self.pool.len();
        let index = if slot < len {
            slot
        } else if self.pool.cycle && len > 0 {
            slot % len
        } else {
            self.exhausted.store(true, Ordering::Relaxed);
            return None;
        };
        Some(Due { index, at })
    }

    fn error(&self, counted: bool, what: String) {
        if counted {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let mut first = self.first_error.lock().unwrap();
        if first.is_none() {
            *first = Some(what);
        }
    }
}

async fn worker(shared: Arc<Shared>) {
    let mut conn: Option<Conn> = None;
    while let Some(due) = shared.take() {
        let sent = match due.at {
            Some(at) if at > Instant::now() => {
                tokio::time::sleep_until(at.into()).await;
                Instant::now()
            }
            // Late: every connection was busy. Measure from the due time.
            Some(at) => at,
            None => Instant::now(),
        };
        let measured = sent >= shared.measure_from;
        if conn.is_none() {
            match Conn::connect(shared.plan.addr).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    shared.error(measured, format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        let (bytes, expect) = shared.pool.get(due.index);
        let exchange = tokio::time::timeout(shared.plan.timeout, c.exchange(bytes, expect)).await;
        let done = Instant::now();
        match exchange {
            Ok(Ok(answer)) => {
                shared.answered_total.fetch_add(1, Ordering::Relaxed);
                if answer.close {
                    conn = None;
                }
                if measured {
                    shared.completed.fetch_add(1, Ordering::Relaxed);
                    let ns = done.saturating_duration_since(sent).as_nanos();
                    shared
                        .latency
                        .lock()
                        .unwrap()
                        .saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
                    let mut last = shared.last_answer.lock().unwrap();
                    *last = (*last).max(done);
                }
                if !answer.as_expected {
                    shared.error(
                        measured,
                        format!(
                            "unexpected answer {} (wanted {} {:?})",
                            answer.status, expect.status, expect.result
                        ),
                    );
                }
            }
            Ok(Err(e)) => {
                conn = None;
                shared.error(measured, format!("exchange: {e}"));
            }
            Err(_) => {
                conn = None;
                shared.error(
                    measured,
                    format!("no answer within {:?}", shared.plan.timeout),
                );
            }
        }
    }
}
