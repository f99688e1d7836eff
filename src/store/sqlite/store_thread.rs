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
//! that fails or panics rolls back to its savepoint only) unless it writes
//! nothing but on success (`Job::atomic`), and answers them once the
//! transaction has committed. One WAL append and one lock round
//! then serve the batch; a job alone still runs in its own transaction.
//!
//! At a low rate there is no batch to gather, and the thread's wake-up is
//! most of a job's wait: a delivery alone on its core runs its claim, mark
//! or release there, on a second connection (`run_here_when_alone`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::owned_thread::{OwnedThread, Queue};
use crate::cores::{Answer, Inbox};
use crate::store::Result;
use crate::store::StoreError;

/// Whether a job ran with others. A batch's answers reach a core through
/// its inbox, one wake-up of the core for all of them (`cores::Inbox`); a
/// job alone wakes its task directly, without the inbox courier's hop,
/// which at a low rate (a job at a time) added to each claim's wait.
#[derive(Clone, Copy)]
struct Batched(bool);

/// An operation queued for the store's thread, with its caller's answer.
///
/// A job is one allocation besides its oneshot, both made by the
/// caller's core, and the thread hands the whole of it back (`answer`)
/// instead of dropping it: the operation's captures (key, fingerprint,
/// snapshot) and the job itself are freed by the core that allocated
/// them, and the answer needs no allocation of its own. Freed on the store's thread, memory from the
/// cores' glibc arenas was a quarter of that thread's time per duplicate
/// (docs/BENCHMARKS.md, The profile at `5134c02`).
trait Job: Send {
    /// Runs the operation. `None`: the caller had given up, nothing was
    /// done; else whether it succeeded (and what it wrote is kept).
    fn run(&mut self, conn: &mut Connection) -> Option<bool>;

    /// Whether the job writes no row unless it succeeds (one statement:
    /// SQLite undoes a statement that fails), so that inside a batch it
    /// needs no savepoint of its own. The jobs `run_here_when_alone` takes
    /// are such jobs already, since a core may have to give one up.
    fn atomic(&self) -> bool;

    /// Hands the job back to its caller, once its transaction's fate is
    /// known.
    fn answer(self: Box<Self>, committed: Result<(), &StoreError>, batched: Batched);
}

/// `Job` for an operation `f` answering `T`.
struct Operation<F, T> {
    f: F,
    result: Option<Result<T>>,
    /// Where the job goes back to; taken when it does.
    caller: Option<oneshot::Sender<Box<Self>>>,
    /// The caller's core's, if the caller runs on a core.
    inbox: Option<Arc<Inbox>>,
    atomic: bool,
}

impl<F, T> Job for Operation<F, T>
where
    F: FnMut(&mut Connection) -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    fn run(&mut self, conn: &mut Connection) -> Option<bool> {
        // The caller gave up (the store's operation timeout): its answer
        // would be thrown away, and a claim nobody forwards would only
        // hold a lease. Skipping it also lets a backlog drain quickly.
        if self.caller.as_ref().is_none_or(oneshot::Sender::is_closed) {
            return None;
        }
        let f = &mut self.f;
        let result = catch_unwind(AssertUnwindSafe(|| f(conn))).unwrap_or_else(|_| {
            tracing::error!("sqlite store: an operation panicked");
            Err(StoreError::Unavailable(
                "sqlite: the operation panicked".into(),
            ))
        });
        let ok = result.is_ok();
        self.result = Some(result);
        Some(ok)
    }

    fn atomic(&self) -> bool {
        self.atomic
    }

    fn answer(mut self: Box<Self>, committed: Result<(), &StoreError>, Batched(batched): Batched) {
        if let Err(e) = committed {
            self.result = Some(Err(StoreError::Unavailable(format!(
                "sqlite: the commit failed: {e}"
            ))));
        }
        match self.inbox.take() {
            Some(inbox) if batched => inbox.leave(self),
            _ => self.deliver(),
        }
    }
}

/// The hand-back itself, on the caller's core when the job went through
/// its inbox.
impl<F, T> Answer for Operation<F, T>
where
    F: Send,
    T: Send,
{
    fn deliver(mut self: Box<Self>) {
        if let Some(caller) = self.caller.take() {
            let _ = caller.send(self);
        }
    }
}

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
    thread: OwnedThread<Box<dyn Job>>,
    /// A second connection to the file, without a busy handler, for the
    /// jobs a lone delivery runs on its own core (`run_here_when_alone`).
    here: Mutex<Connection>,
}

impl StoreThread {
    /// `here` must have no busy handler: a core never waits for a lock.
    pub(super) fn spawn(
        name: &str,
        conn: Connection,
        here: Connection,
        chore: Chore,
    ) -> Result<Self> {
        let serving = move |jobs: Queue<Box<dyn Job>>| serve(conn, &jobs, &chore);
        let thread = OwnedThread::spawn(name, QUEUE_CAPACITY, serving)
            .map_err(|e| StoreError::Unavailable(format!("sqlite: cannot start a thread: {e}")))?;
        Ok(Self {
            thread,
            here: Mutex::new(here),
        })
    }

    /// Runs `f` on the caller's own core when no other delivery is in
    /// flight there (`cores::alone`), on the second connection; else, or
    /// when that attempt fails, on the store's thread (`run`).
    ///
    /// At a low rate nearly every job finds the store's thread asleep, and
    /// waking it, then the caller's task, is most of what a claim waits
    /// for: 16.5 to 18.9 µs on average, and 0.3 ms or more for a few jobs
    /// in ten thousand (docs/BENCHMARKS.md, What makes a request slow). A
    /// core with other deliveries in flight queues its jobs, so that under
    /// load the thread still commits them in batches; a job run here holds
    /// the core's other connections (their reads and answers) for as long
    /// as it takes, the `fsync` of the first commit after a WAL restart
    /// (a few tenths of a millisecond) included.
    ///
    /// The connection has no busy handler: a write lock held elsewhere (a
    /// batch, a checkpoint, another process) fails the attempt at once
    /// rather than parking the core. `f` must therefore write nothing
    /// unless it succeeds (one statement, or one transaction), so that the
    /// store's thread can run it again from the start. A panic in `f` here
    /// reaches the delivery (answered as an internal error, its
    /// transaction rolled back) and poisons the connection's lock: later
    /// jobs then all go to the store's thread. What the attempt cannot
    /// bound is the disk: a write that stalls (a hung volume) stalls the
    /// core's thread with it, where on the store's thread the delivery
    /// would have been answered 503 at the store's timeout. The other
    /// cores find the connection locked meanwhile and queue.
    ///
    /// Queued, such a job runs inside the store's batch without a savepoint
    /// of its own (`Job::atomic`): there (`is_autocommit` false) it must
    /// write in one statement at most.
    pub(super) async fn run_here_when_alone<T: Send + 'static>(
        &self,
        mut f: impl FnMut(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        if crate::cores::alone()
            && let Ok(mut here) = self.here.try_lock()
            && here.is_autocommit()
        {
            match f(&mut here) {
                Ok(answer) => return Ok(answer),
                Err(error) => {
                    tracing::debug!(%error, "sqlite store: a job on the core failed; queued");
                    // A rollback that failed leaves a transaction open: a
                    // job would run inside it (as inside a batch) and never
                    // commit. Close it, or the next attempt skips `here`.
                    if !here.is_autocommit() {
                        let _ = here.execute_batch("ROLLBACK");
                    }
                }
            }
        }
        self.queue(f, true).await
    }

    /// Runs `f` with the connection on the store's thread and returns its
    /// answer, once what `f` wrote is committed. `f` may run inside a
    /// transaction the thread opened (see `is_autocommit`). A panic inside
    /// `f` answers an error and leaves the thread serving: its savepoint, or
    /// the guard of the transaction it opened (`immediate`'s), rolls back
    /// what it wrote. While
    /// `QUEUE_CAPACITY` jobs wait, the caller waits for a place first.
    /// `f` runs once; it is `FnMut` so that what it captured stays in the
    /// job and comes back with it (see `Operation`).
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl FnMut(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.queue(f, false).await
    }

    /// `run`, for a job that is `atomic` (`Job::atomic`) or not.
    async fn queue<T: Send + 'static>(
        &self,
        f: impl FnMut(&mut Connection) -> Result<T> + Send + 'static,
        atomic: bool,
    ) -> Result<T> {
        let (caller, answered) = oneshot::channel();
        let job = Box::new(Operation {
            f,
            result: None,
            caller: Some(caller),
            inbox: crate::cores::inbox(),
            atomic,
        });
        self.thread.send(job).await.map_err(|_| stopped())?;
        let done = answered.await.map_err(|_| stopped())?;
        done.result.unwrap_or_else(|| Err(stopped()))
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("sqlite: the store's thread has stopped".into())
}

/// The thread's loop: jobs in arrival order, the chore when due, until the
/// channel closes (the store was dropped) and the queue is empty.
fn serve(mut conn: Connection, jobs: &Queue<Box<dyn Job>>, chore: &Chore) {
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
fn run_batch(conn: &mut Connection, batch: Vec<Box<dyn Job>>) {
    if batch.len() == 1 || fixed(conn, "BEGIN IMMEDIATE").is_err() {
        // Alone, or the write lock is not to be had: one at a time, each job
        // answering with what it did.
        for mut job in batch {
            if job.run(conn).is_some() {
                job.answer(Ok(()), Batched(false));
            }
        }
        return;
    }
    let mut ran = Vec::with_capacity(batch.len());
    let mut jobs = batch.into_iter();
    while let Some(mut job) = jobs.next() {
        if job.atomic() {
            // Nothing to roll back if it fails: SQLite undoes a failed
            // statement, or the whole transaction (checked below).
            let before = conn.total_changes();
            let Some(ok) = job.run(conn) else {
                continue;
            };
            ran.push(job);
            // One that wrote a row, then failed, broke its rule: what it
            // wrote cannot be undone alone, so the whole batch is
            // (`finish`). SQLite counts rows written, not other writes.
            let broke_the_rule = !ok && conn.total_changes() != before;
            if broke_the_rule {
                tracing::error!("sqlite store: a job wrote and then failed; its batch is undone");
            }
            if broke_the_rule || conn.is_autocommit() {
                let rest: Vec<Box<dyn Job>> = jobs.collect();
                rolled_back(conn, ran, rest);
                return;
            }
            continue;
        }
        if let Err(e) = fixed(conn, "SAVEPOINT job") {
            // Answered below as part of the failed transaction; the job
            // itself waits for the next batch.
            tracing::warn!(error = %e, "sqlite store: cannot open a savepoint");
            let rest: Vec<Box<dyn Job>> = std::iter::once(job).chain(jobs).collect();
            finish(conn, ran, Some(StoreError::from(e)));
            run_batch(conn, rest);
            return;
        }
        let Some(ok) = job.run(conn) else {
            let _ = fixed(conn, "RELEASE job");
            continue;
        };
        let kept = if ok {
            fixed(conn, "RELEASE job")
        } else {
            conn.execute_batch("ROLLBACK TO job; RELEASE job")
        };
        ran.push(job);
        if kept.is_err() || conn.is_autocommit() {
            let rest: Vec<Box<dyn Job>> = jobs.collect();
            rolled_back(conn, ran, rest);
            return;
        }
    }
    finish(conn, ran, None);
}

/// The batch's transaction is lost: SQLite rolled it back (a full disk, an
/// I/O error), or a job broke its rule and `finish` rolls it back. What ran
/// so far says so; the rest of the batch runs afresh.
fn rolled_back(conn: &mut Connection, ran: Vec<Box<dyn Job>>, rest: Vec<Box<dyn Job>>) {
    let lost = StoreError::Unavailable("the transaction was rolled back".into());
    finish(conn, ran, Some(lost));
    if !rest.is_empty() {
        run_batch(conn, rest);
    }
}

/// Runs one of the batch's fixed statements from the connection's
/// statement cache: parsed once, not for every batch and every job in it
/// (`execute_batch` parses its text each time).
pub(super) fn fixed(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// Commits the batch's transaction (or rolls it back after `failed`) and
/// answers each job that ran with the outcome.
fn finish(conn: &mut Connection, ran: Vec<Box<dyn Job>>, failed: Option<StoreError>) {
    let outcome = match failed {
        Some(e) => Err(e),
        None => fixed(conn, "COMMIT").map_err(StoreError::from),
    };
    if outcome.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    for job in ran {
        job.answer(outcome.as_ref().map(|_| ()), Batched(true));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};
    use std::thread::ThreadId;

    fn idle_chore() -> Chore {
        Chore {
            every: Duration::from_secs(3600),
            round: |_| Ok(false),
            failure: "test chore failed",
        }
    }

    /// A store thread on an in-memory database (its second connection,
    /// for jobs run on a core, on another).
    fn in_memory(name: &str, chore: Chore) -> StoreThread {
        let conn = Connection::open_in_memory().unwrap();
        StoreThread::spawn(name, conn, Connection::open_in_memory().unwrap(), chore).unwrap()
    }

    /// Holds the store's thread with a job that waits for the returned
    /// sender, so that the next jobs queue up behind it.
    fn hold(
        thread: &Arc<StoreThread>,
    ) -> (
        std::sync::mpsc::Sender<()>,
        tokio::task::JoinHandle<Result<()>>,
    ) {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let held = Arc::clone(thread);
        let blocker = tokio::spawn(async move {
            held.run(move |_| {
                let _ = released.recv();
                Ok(())
            })
            .await
        });
        (release, blocker)
    }

    /// Records the thread it is dropped on.
    struct Witness(Arc<Mutex<Vec<ThreadId>>>);

    impl Drop for Witness {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(std::thread::current().id());
        }
    }

    /// A lone delivery's job runs on its core; with another delivery in
    /// flight there, or when the attempt on the core fails, on the store's
    /// thread, from the start.
    #[tokio::test]
    async fn a_lone_delivery_runs_its_job_on_its_own_core() {
        let thread = in_memory("sqlite-t-here", idle_chore());
        let caller = std::thread::current().id();
        let ran_on = || Ok(std::thread::current().id());
        crate::cores::become_core(1);
        let _first = crate::cores::Delivering::start();
        let here = thread.run_here_when_alone(move |_| ran_on()).await;
        assert_eq!(here.unwrap(), caller, "alone: on the caller's core");

        let second = crate::cores::Delivering::start();
        let there = thread.run_here_when_alone(move |_| ran_on()).await;
        assert_ne!(there.unwrap(), caller, "not alone: on the store's thread");
        drop(second);

        let attempts = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&attempts);
        thread
            .run_here_when_alone(move |_| {
                let on = std::thread::current().id();
                seen.lock().unwrap().push(on);
                if on == caller {
                    return Err(StoreError::Unavailable("database is locked".into()));
                }
                Ok(())
            })
            .await
            .unwrap();
        let attempts = attempts.lock().unwrap();
        assert_eq!(attempts.len(), 2, "{attempts:?}");
        assert_eq!(attempts[0], caller);
        assert_ne!(attempts[1], caller);
    }

    /// An attempt on the core that fails with its transaction open has it
    /// rolled back: what it wrote is gone, and the next lone job runs on
    /// the core again instead of skipping a connection left mid-transaction.
    #[tokio::test]
    async fn a_failed_attempt_leaves_no_transaction_open_on_the_core() {
        let thread = in_memory("sqlite-t-rollback", idle_chore());
        let caller = std::thread::current().id();
        crate::cores::become_core(1);
        let _alone = crate::cores::Delivering::start();
        thread
            .run_here_when_alone(|c| Ok(c.execute_batch("CREATE TABLE t (n INTEGER)")?))
            .await
            .unwrap();

        thread
            .run_here_when_alone(move |c| {
                if std::thread::current().id() == caller {
                    c.execute_batch("BEGIN; INSERT INTO t VALUES (1)")?;
                    return Err(StoreError::Unavailable("database is locked".into()));
                }
                Ok(())
            })
            .await
            .unwrap();
        assert!(thread.here.lock().unwrap().is_autocommit());

        let (rows, on) = thread
            .run_here_when_alone(|c| {
                let rows: i64 = c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?;
                Ok((rows, std::thread::current().id()))
            })
            .await
            .unwrap();
        assert_eq!(on, caller, "the core's connection was skipped");
        assert_eq!(rows, 0, "the failed attempt's insert was kept");
    }

    #[tokio::test]
    async fn a_panicking_job_answers_an_error_and_the_thread_keeps_serving() {
        let thread = in_memory("sqlite-t-panic", idle_chore());
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

    /// The job goes back to its caller with what the operation captured,
    /// and is dropped there: memory a core allocated is freed by it, not
    /// by the store's thread.
    #[tokio::test]
    async fn the_operation_is_dropped_by_its_caller() {
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let witness = Witness(Arc::clone(&dropped));
        let thread = in_memory("sqlite-t-back", idle_chore());
        let on_store_thread = thread
            .run(move |_| {
                let _kept = &witness;
                Ok(std::thread::current().id())
            })
            .await
            .unwrap();
        let caller = std::thread::current().id();
        assert_ne!(on_store_thread, caller);
        assert_eq!(*dropped.lock().unwrap(), [caller]);
    }

    /// Jobs that ran in a batch come back through the caller's core's
    /// inbox, and are dropped on the core.
    #[tokio::test]
    async fn a_batch_comes_back_through_the_cores_inbox() {
        let inbox = Arc::new(crate::cores::Inbox::default());
        crate::cores::use_inbox(Arc::clone(&inbox));
        tokio::spawn(inbox.deliver());
        let thread = Arc::new(in_memory("sqlite-t-inbox", idle_chore()));
        let (release, blocker) = hold(&thread);
        let dropped = Arc::new(Mutex::new(Vec::new()));
        let jobs: Vec<_> = (0..4)
            .map(|_| {
                let thread = Arc::clone(&thread);
                let witness = Witness(Arc::clone(&dropped));
                tokio::spawn(async move {
                    thread
                        .run(move |c| {
                            let _kept = &witness;
                            Ok(!c.is_autocommit())
                        })
                        .await
                })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        let all = async {
            blocker.await.unwrap().unwrap();
            for job in jobs {
                assert!(job.await.unwrap().unwrap(), "the job ran alone");
            }
        };
        tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .expect("a batch's answer never came back through the inbox");
        let caller = std::thread::current().id();
        assert_eq!(*dropped.lock().unwrap(), vec![caller; 4]);
    }

    /// Runs five jobs, `jobs(connection, n)` for n in 1..=5, as one batch
    /// on a table `t (n)` made by `table`, queued as `atomic` or not; answers
    /// what each job was answered and the rows committed.
    async fn batch(
        table: &'static str,
        atomic: bool,
        jobs: impl Fn(&mut Connection, i64) -> Result<bool> + Send + Sync + Copy + 'static,
    ) -> (Vec<Result<bool>>, Vec<i64>) {
        let thread = Arc::new(in_memory("sqlite-t-batch", idle_chore()));
        thread
            .run(move |c| Ok(c.execute_batch(table)?))
            .await
            .unwrap();
        let (release, blocker) = hold(&thread);
        let queued: Vec<_> = (1..=5)
            .map(|n: i64| {
                let thread = Arc::clone(&thread);
                tokio::spawn(async move { thread.queue(move |c| jobs(c, n), atomic).await })
            })
            .collect();
        // A current-thread runtime: a few yields let every task send its job.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        // The blocker may share the batch, and so a batch undone.
        let blocked = blocker.await.unwrap();
        assert!(atomic || blocked.is_ok(), "{blocked:?}");
        let mut answers = Vec::new();
        for job in queued {
            answers.push(job.await.unwrap());
        }
        let rows: Vec<i64> = thread
            .run(|c| {
                let mut stmt = c.prepare("SELECT n FROM t ORDER BY n")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
            .unwrap();
        (answers, rows)
    }

    #[tokio::test]
    async fn queued_jobs_commit_together_and_a_failing_one_rolls_back_alone() {
        let (answers, rows) = batch("CREATE TABLE t (n INTEGER)", false, |c, n| {
            let in_batch = !c.is_autocommit();
            c.execute("INSERT INTO t VALUES (?1)", [n])?;
            if n == 3 {
                return Err(StoreError::Corrupt("three".into()));
            }
            Ok(in_batch)
        })
        .await;
        for (n, answer) in (1..).zip(&answers) {
            match answer {
                Ok(in_batch) => assert!(*in_batch && n != 3, "job {n} ran alone"),
                Err(e) => assert_eq!((n, e.to_string().contains("three")), (3, true)),
            }
        }
        assert_eq!(rows, [1, 2, 4, 5]);
    }

    /// A table where 3 is refused.
    const CHECKED: &str = "CREATE TABLE t (n INTEGER CHECK (n <> 3))";

    /// Atomic jobs in a batch run without savepoints: one whose statement
    /// fails leaves nothing (SQLite undoes the statement), and the others
    /// commit together.
    #[tokio::test]
    async fn atomic_jobs_in_a_batch_need_no_savepoint() {
        let (answers, rows) = batch(CHECKED, true, |c, n| {
            let in_batch = !c.is_autocommit();
            // Undoes nothing inside a savepoint opened for this job, and
            // fails without one.
            let savepoint = c.execute_batch("ROLLBACK TO job").is_ok();
            c.execute("INSERT INTO t VALUES (?1)", [n])?;
            Ok(in_batch && !savepoint)
        })
        .await;
        for (n, answer) in (1..).zip(&answers) {
            match answer {
                Ok(as_meant) => assert!(*as_meant && n != 3, "job {n}: alone, or in a savepoint"),
                Err(e) => assert!(n == 3 && e.to_string().contains("CHECK"), "job {n}: {e}"),
            }
        }
        assert_eq!(rows, [1, 2, 4, 5]);
    }

    /// An atomic job that breaks its rule, writes and then fails, has no
    /// savepoint to undo its write alone: the batch so far is undone and
    /// answered so, rather than its write committed with the others, and
    /// the jobs after it run afresh.
    #[tokio::test]
    async fn an_atomic_job_that_wrote_and_failed_undoes_its_batch() {
        let (answers, rows) = batch(CHECKED, true, |c, n| {
            c.execute("INSERT INTO t VALUES (?1)", [n + 10])?;
            if n == 3 {
                return Err(StoreError::Corrupt("three".into()));
            }
            Ok(true)
        })
        .await;
        for (n, answer) in (1..).zip(&answers) {
            match answer {
                Ok(_) => assert!(n > 3, "job {n} was kept with the rule broken beside it"),
                Err(e) => assert!(
                    n <= 3 && e.to_string().contains("rolled back"),
                    "job {n}: {e}"
                ),
            }
        }
        assert_eq!(rows, [14, 15]);
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
        let thread = in_memory("sqlite-t-chore", chore);
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
            let thread = in_memory(name, idle_chore());
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
