//! The one thread that owns the store's serving connection.
//!
//! rusqlite is synchronous. Sending each operation to tokio's blocking pool
//! behind a `Mutex<Connection>` made every delivery in flight a thread
//! queueing on one lock: on two cores most of the store's time went to
//! futex wake-ups (docs/BENCHMARKS.md). One thread that owns the connection
//! and takes jobs from a queue does the same work in order without them.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::owned_thread::OwnedThread;
use crate::store::StoreError;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Work the thread does on its own, between jobs (the purge of expired
/// rows): one `round` every `every`, and the next round right after the
/// next job while a round reports more left to do. Rounds and jobs
/// alternate, so neither a long purge nor a busy queue starves the other.
pub(super) struct Chore {
    pub every: Duration,
    pub round: fn(&mut Connection) -> Result<bool, StoreError>,
    /// What the log says when a round fails.
    pub failure: &'static str,
}

pub(super) struct StoreThread {
    thread: OwnedThread<Job>,
}

impl StoreThread {
    pub(super) fn spawn(name: &str, conn: Connection, chore: Chore) -> Result<Self, StoreError> {
        let thread = OwnedThread::spawn(name, move |jobs| serve(conn, &jobs, &chore))
            .map_err(|e| StoreError::Unavailable(format!("sqlite: cannot start a thread: {e}")))?;
        Ok(Self { thread })
    }

    /// Runs `f` with the connection on the store's thread and returns its
    /// answer. A panic inside `f` answers an error and leaves the thread
    /// serving: it unwinds through rusqlite's `Transaction` drop, which
    /// rolls back, so the connection is left consistent.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // The caller gave up (the store's operation timeout): its answer
            // would be thrown away, and a claim nobody forwards would only
            // hold a lease. Skipping it also lets a backlog drain quickly.
            if answer.is_closed() {
                return;
            }
            let result = catch_unwind(AssertUnwindSafe(|| f(conn))).unwrap_or_else(|_| {
                tracing::error!("sqlite store: an operation panicked");
                Err(StoreError::Unavailable(
                    "sqlite: the operation panicked".into(),
                ))
            });
            let _ = answer.send(result);
        });
        self.thread.send(job).map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("sqlite: the store's thread has stopped".into())
}

/// The thread's loop: jobs in arrival order, the chore when due, until the
/// channel closes (the store was dropped) and the queue is empty.
fn serve(mut conn: Connection, jobs: &Receiver<Job>, chore: &Chore) {
    let mut due = Instant::now() + chore.every;
    loop {
        let now = Instant::now();
        if now >= due {
            let more = catch_unwind(AssertUnwindSafe(|| (chore.round)(&mut conn)));
            due = match more {
                Ok(Ok(true)) => Instant::now(),
                Ok(Ok(false)) => Instant::now() + chore.every,
                Ok(Err(error)) => {
                    tracing::warn!(%error, "{}", chore.failure);
                    Instant::now() + chore.every
                }
                Err(_) => {
                    tracing::error!("{} (panic)", chore.failure);
                    Instant::now() + chore.every
                }
            };
        }
        match jobs.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(job) => job(&mut conn),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle_chore() -> Chore {
        Chore {
            every: Duration::from_secs(3600),
            round: |_| Ok(false),
            failure: "test chore failed",
        }
    }

    #[tokio::test]
    async fn a_panicking_job_answers_an_error_and_the_thread_keeps_serving() {
        let conn = Connection::open_in_memory().unwrap();
        let thread = StoreThread::spawn("sqlite-t-panic", conn, idle_chore()).unwrap();
        let err = thread
            .run(|_| -> Result<(), StoreError> { panic!("boom") })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("panicked"), "{err}");
        let one: i64 = thread
            .run(|c| Ok(c.query_row("SELECT 1", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(one, 1);
    }

    #[tokio::test]
    async fn the_chore_runs_again_while_it_reports_more() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static ROUNDS: AtomicUsize = AtomicUsize::new(0);
        let chore = Chore {
            every: Duration::from_millis(10),
            // Three rounds back to back, then nothing for an hour.
            round: |_| Ok(ROUNDS.fetch_add(1, Ordering::SeqCst) < 2),
            failure: "test chore failed",
        };
        let conn = Connection::open_in_memory().unwrap();
        let thread = StoreThread::spawn("sqlite-t-chore", conn, chore).unwrap();
        while ROUNDS.load(Ordering::SeqCst) < 3 {
            thread.run(|_| Ok(())).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(ROUNDS.load(Ordering::SeqCst) >= 3);
    }

    /// Dropping the store ends its thread (no thread per opened store is
    /// left behind): the names of this process's threads tell.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn dropping_ends_the_thread() {
        let name = "sqlite-t-drop";
        let running = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|comm| comm.trim_end() == name)
                .count()
        };
        for _ in 0..20 {
            let conn = Connection::open_in_memory().unwrap();
            let thread = StoreThread::spawn(name, conn, idle_chore()).unwrap();
            thread.run(|_| Ok(())).await.unwrap();
            assert_eq!(running(), 1);
            drop(thread);
            assert_eq!(running(), 0);
        }
    }
}
