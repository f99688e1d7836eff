//! The one thread that owns the store's serving connection.
//!
//! rusqlite is synchronous. Sending each operation to tokio's blocking pool
//! behind a `Mutex<Connection>` made every delivery in flight a thread
//! queueing on one lock: on two cores most of the store's time went to
//! futex wake-ups (docs/BENCHMARKS.md). One thread that owns the connection
//! and takes jobs from a queue does the same work in order without them.
//!
//! Group commit: when jobs are waiting, the thread runs up to `MAX_BATCH` of
//! them in one write transaction, each inside a savepoint of its own (a job
//! that fails or panics rolls back to its savepoint only), and answers them
//! once the transaction has committed. One WAL append and one lock round
//! then serve the batch; a job alone still runs in its own transaction.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::owned_thread::{OwnedThread, Queue};
use crate::store::Result;
use crate::store::StoreError;

/// Answers a job's caller, given whether its transaction committed and
/// whether the job ran in a batch.
type Reply = Box<dyn FnOnce(Result<(), &StoreError>, Batched) + Send>;

/// Whether a job ran with others. A batch's answers reach a core through
/// its inbox, one wake-up of the core for all of them (`cores::Inbox`); a
/// job alone wakes its task directly, without the inbox courier's hop,
/// which at a low rate (a job at a time) added to each claim's wait.
#[derive(Clone, Copy)]
struct Batched(bool);

/// What a job did: whether it succeeded (its savepoint is kept) and how to
/// answer its caller once its transaction's fate is known.
struct Ran {
    ok: bool,
    reply: Reply,
}

/// `None`: the caller had given up, nothing was done.
type Job = Box<dyn FnOnce(&mut Connection) -> Option<Ran> + Send>;

/// Jobs run in one transaction at most. Bounded so that one commit never
/// holds the answers of a long queue.
const MAX_BATCH: usize = 64;

/// Jobs waiting for the thread at most (16 batches). Past it, a burst waits
/// to be queued (an async wait, bounded by the store's operation timeout)
/// instead of growing memory without limit.
const QUEUE_CAPACITY: usize = 1024;

/// Work the thread does on its own, between jobs (the purge of expired
/// rows): one `round` every `every`, and the next round right after the
/// next job while a round reports more left to do. Rounds and jobs
/// alternate, so neither a long purge nor a busy queue starves the other.
pub(super) struct Chore {
    pub every: Duration,
    pub round: fn(&mut Connection) -> Result<bool>,
    /// What the log says when a round fails.
    pub failure: &'static str,
}

pub(super) struct StoreThread {
    thread: OwnedThread<Job>,
}

impl StoreThread {
    pub(super) fn spawn(name: &str, conn: Connection, chore: Chore) -> Result<Self> {
        let serving = move |jobs: Queue<Job>| serve(conn, &jobs, &chore);
        let thread = OwnedThread::spawn(name, QUEUE_CAPACITY, serving)
            .map_err(|e| StoreError::Unavailable(format!("sqlite: cannot start a thread: {e}")))?;
        Ok(Self { thread })
    }

    /// Runs `f` with the connection on the store's thread and returns its
    /// answer, once what `f` wrote is committed. `f` may run inside a
    /// transaction the thread opened (see `is_autocommit`). A panic inside
    /// `f` answers an error and leaves the thread serving: its savepoint, or
    /// rusqlite's `Transaction` drop, rolls back what it wrote. While
    /// `QUEUE_CAPACITY` jobs wait, the caller waits for a place first.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (answer, answered) = oneshot::channel();
        let inbox = crate::cores::inbox();
        let job: Job = Box::new(move |conn| {
            // The caller gave up (the store's operation timeout): its answer
            // would be thrown away, and a claim nobody forwards would only
            // hold a lease. Skipping it also lets a backlog drain quickly.
            if answer.is_closed() {
                return None;
            }
            let result = catch_unwind(AssertUnwindSafe(|| f(conn))).unwrap_or_else(|_| {
                tracing::error!("sqlite store: an operation panicked");
                Err(StoreError::Unavailable(
                    "sqlite: the operation panicked".into(),
                ))
            });
            Some(Ran {
                ok: result.is_ok(),
                reply: Box::new(move |committed, Batched(batched)| {
                    let result = match committed {
                        Ok(()) => result,
                        Err(e) => Err(StoreError::Unavailable(format!(
                            "sqlite: the commit failed: {e}"
                        ))),
                    };
                    let send = move || {
                        let _ = answer.send(result);
                    };
                    match inbox {
                        Some(inbox) if batched => inbox.leave(send),
                        _ => send(),
                    }
                }),
            })
        });
        self.thread.send(job).await.map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("sqlite: the store's thread has stopped".into())
}

/// The thread's loop: jobs in arrival order, the chore when due, until the
/// channel closes (the store was dropped) and the queue is empty.
fn serve(mut conn: Connection, jobs: &Queue<Job>, chore: &Chore) {
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
            Ok(job) => {
                let mut batch = vec![job];
                while batch.len() < MAX_BATCH {
                    match jobs.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                run_batch(&mut conn, batch);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Runs `batch` and answers every job. One job runs on its own (in its own
/// transactions, if it opens any); several share one `BEGIN IMMEDIATE`.
fn run_batch(conn: &mut Connection, batch: Vec<Job>) {
    if batch.len() == 1 || fixed(conn, "BEGIN IMMEDIATE").is_err() {
        // Alone, or the write lock is not to be had: one at a time, each job
        // answering with what it did.
        for job in batch {
            if let Some(ran) = job(conn) {
                (ran.reply)(Ok(()), Batched(false));
            }
        }
        return;
    }
    let mut replies = Vec::with_capacity(batch.len());
    let mut jobs = batch.into_iter();
    for job in jobs.by_ref() {
        if let Err(e) = fixed(conn, "SAVEPOINT job") {
            // Answered below as part of the failed transaction; the job
            // itself waits for the next batch.
            tracing::warn!(error = %e, "sqlite store: cannot open a savepoint");
            let rest: Vec<Job> = std::iter::once(job).chain(jobs).collect();
            finish(conn, replies, Some(StoreError::from(e)));
            run_batch(conn, rest);
            return;
        }
        let Some(ran) = job(conn) else {
            let _ = fixed(conn, "RELEASE job");
            continue;
        };
        let kept = if ran.ok {
            fixed(conn, "RELEASE job")
        } else {
            conn.execute_batch("ROLLBACK TO job; RELEASE job")
        };
        replies.push(ran.reply);
        if kept.is_err() || conn.is_autocommit() {
            // SQLite rolled the whole transaction back (a full disk, an I/O
            // error): what ran so far is lost and says so; the rest of the
            // batch runs afresh.
            let rest: Vec<Job> = jobs.collect();
            let lost = StoreError::Unavailable("the transaction was rolled back".into());
            finish(conn, replies, Some(lost));
            if !rest.is_empty() {
                run_batch(conn, rest);
            }
            return;
        }
    }
    finish(conn, replies, None);
}

/// Runs one of the batch's fixed statements from the connection's
/// statement cache: parsed once, not for every batch and every job in it
/// (`execute_batch` parses its text each time).
fn fixed(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Commits the batch's transaction (or rolls it back after `failed`) and
/// answers each job with the outcome.
fn finish(conn: &mut Connection, replies: Vec<Reply>, failed: Option<StoreError>) {
    let outcome = match failed {
        Some(e) => Err(e),
        None => fixed(conn, "COMMIT").map_err(StoreError::from),
    };
    if outcome.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    for reply in replies {
        reply(outcome.as_ref().map(|_| ()), Batched(true));
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
            .run(|_| -> Result<()> { panic!("boom") })
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
    async fn queued_jobs_commit_together_and_a_failing_one_rolls_back_alone() {
        use std::sync::Arc;
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER)").unwrap();
        let thread = Arc::new(StoreThread::spawn("sqlite-t-batch", conn, idle_chore()).unwrap());
        // Hold the thread so that the next jobs queue up behind this one.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let held = Arc::clone(&thread);
        let blocker = tokio::spawn(async move {
            held.run(move |_| {
                let _ = released.recv();
                Ok(())
            })
            .await
        });
        let inserts: Vec<_> = (1..=5)
            .map(|n: i64| {
                let thread = Arc::clone(&thread);
                tokio::spawn(async move {
                    thread
                        .run(move |c| {
                            let in_batch = !c.is_autocommit();
                            c.execute("INSERT INTO t VALUES (?1)", [n])?;
                            if n == 3 {
                                return Err(StoreError::Corrupt("three".into()));
                            }
                            Ok(in_batch)
                        })
                        .await
                })
            })
            .collect();
        // A current-thread runtime: a few yields let every task send its job.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        blocker.await.unwrap().unwrap();

        for (n, insert) in (1..=5).zip(inserts) {
            match insert.await.unwrap() {
                Ok(in_batch) => assert!(in_batch && n != 3, "job {n} ran alone"),
                Err(e) => assert_eq!((n, e.to_string().contains("three")), (3, true)),
            }
        }
        let rows: Vec<i64> = thread
            .run(|c| {
                let mut stmt = c.prepare("SELECT n FROM t ORDER BY n")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
            .unwrap();
        assert_eq!(rows, [1, 2, 4, 5]);
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
            // The join has returned, but the kernel lists a thread in
            // /proc until it has finished exiting, a moment later.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while running() > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(running(), 0, "the thread outlived its store");
        }
    }
}
