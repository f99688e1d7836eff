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
//!
//! With a pause ([`run_with`]) the warm-up is a phase of its own: once its
//! last answer is in, every connection stays open and idle while the pause
//! runs (callgrind's collection is switched on there), then the measured
//! phase starts on the same connections. The server's work in the measured
//! phase is then the measured requests' and nothing else.

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
    /// The first pool slot of this phase (an open loop's schedule starts
    /// there).
    first_slot: usize,
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
    run_with(plan, pool, None)
}

/// [`run`], with `pause` called between the warm-up and the measured phase
/// when every connection is idle (no request in flight).
pub fn run_with(plan: &Plan, pool: Arc<Pool>, pause: Option<&mut dyn FnMut()>) -> Outcome {
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
    let Some(pause) = pause else {
        let idle = (0..plan.connections.max(1)).map(|_| None).collect();
        return runtime.block_on(phase(plan.clone(), pool, 0, idle)).outcome;
    };
    let warmup = Plan {
        duration: Duration::ZERO,
        ..plan.clone()
    };
    let idle = (0..plan.connections.max(1)).map(|_| None).collect();
    let warm = runtime.block_on(phase(warmup, Arc::clone(&pool), 0, idle));
    pause();
    let measured = Plan {
        warmup: Duration::ZERO,
        ..plan.clone()
    };
    let run = runtime.block_on(phase(measured, pool, warm.next_slot, warm.conns));
    let (warm, mut outcome) = (warm.outcome, run.outcome);
    outcome.answered_total += warm.answered_total;
    outcome.exhausted |= warm.exhausted;
    outcome.first_error = warm.first_error.or(outcome.first_error);
    outcome
}

/// What one phase leaves: its outcome, the first pool slot it did not use
/// and its connections (each still open, or `None`).
struct Phase {
    outcome: Outcome,
    next_slot: usize,
    conns: Vec<Option<Conn>>,
}

/// Sends `plan` from the pool's `first_slot` on, one worker per connection
/// of `conns`, and returns when every worker has finished.
async fn phase(plan: Plan, pool: Arc<Pool>, first_slot: usize, conns: Vec<Option<Conn>>) -> Phase {
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let measure_until = measure_from + plan.duration;
    let latency = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    let shared = Arc::new(Shared {
        plan: plan.clone(),
        pool,
        first_slot,
        next: AtomicUsize::new(first_slot),
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
    let workers: Vec<_> = conns
        .into_iter()
        .map(|conn| tokio::spawn(worker(Arc::clone(&shared), conn)))
        .collect();
    let mut conns = Vec::with_capacity(workers.len());
    for w in workers {
        conns.push(w.await.ok().flatten());
    }
    let last = *shared.last_answer.lock().unwrap();
    let latency = std::mem::replace(
        &mut *shared.latency.lock().unwrap(),
        Histogram::new(3).unwrap(),
    );
    let outcome = Outcome {
        completed: shared.completed.load(Ordering::Relaxed),
        errors: shared.errors.load(Ordering::Relaxed),
        answered_total: shared.answered_total.load(Ordering::Relaxed),
        elapsed: last.saturating_duration_since(measure_from),
        latency,
        exhausted: shared.exhausted.load(Ordering::Relaxed),
        first_error: shared.first_error.lock().unwrap().clone(),
    };
    Phase {
        outcome,
        next_slot: shared.next.load(Ordering::Relaxed),
        conns,
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
                let nth = slot - self.first_slot;
                let due = self.start + Duration::from_secs_f64(nth as f64 / rate);
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

/// Sends requests on `conn` (or a new connection) until the phase is over;
/// the connection, if still open.
async fn worker(shared: Arc<Shared>, mut conn: Option<Conn>) -> Option<Conn> {
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
    conn
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use super::*;
    use crate::requests::{Answerer, Builder, Mix};

    /// A blocking server that answers every request 200 and counts the
    /// connections it accepted and the requests it answered.
    fn counting_server() -> (SocketAddr, Arc<AtomicU64>, Arc<AtomicU64>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, answered) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (a, n) = (Arc::clone(&accepted), Arc::clone(&answered));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                a.fetch_add(1, Ordering::SeqCst);
                let n = Arc::clone(&n);
                std::thread::spawn(move || serve(stream.unwrap(), &n));
            }
        });
        (addr, accepted, answered)
    }

    fn serve(mut s: TcpStream, answered: &AtomicU64) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(head)) = req.parse(&buf) {
                let len: usize = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |h| {
                        std::str::from_utf8(h.value).unwrap().parse().unwrap()
                    });
                if buf.len() >= head + len {
                    buf.drain(..head + len);
                    answered.fetch_add(1, Ordering::SeqCst);
                    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .unwrap();
                    continue;
                }
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    #[test]
    fn a_pause_finds_nothing_in_flight_and_the_connections_stay_open() {
        let (addr, accepted, answered) = counting_server();
        let mut pool =
            Builder::new(addr.port(), Answerer::Upstream, "p").mixed(100, Mix::FRESH, None);
        pool.cycle = true;
        let plan = Plan {
            addr,
            connections: 4,
            pacing: Pacing::Closed,
            warmup: Duration::from_millis(200),
            duration: Duration::from_millis(200),
            threads: 1,
            timeout: Duration::from_secs(5),
        };
        let mut at_pause = None;
        let pause: &mut dyn FnMut() = &mut || {
            let before = answered.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            // Nothing arrives while paused: no request was in flight.
            assert_eq!(answered.load(Ordering::SeqCst), before);
            at_pause = Some(before);
        };
        let outcome = run_with(&plan, Arc::new(pool), Some(pause));
        let at_pause = at_pause.expect("the pause ran");
        assert!(at_pause > 0 && outcome.completed > 0);
        // The server answered in the window exactly the measured requests.
        assert_eq!(
            answered.load(Ordering::SeqCst),
            at_pause + outcome.completed
        );
        assert_eq!(outcome.answered_total, answered.load(Ordering::SeqCst));
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
        assert_eq!(outcome.errors, 0);
    }
}
