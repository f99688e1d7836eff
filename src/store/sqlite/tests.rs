//! Tests of the sqlite store's own behaviour (the conformance suite,
//! `tests/it/store_conformance`, holds it to the contract).

use super::*;

/// A pass's rounds share one cutoff: the start of the current interval.
#[test]
fn the_purge_cutoff_stays_put_for_a_whole_interval() {
    let interval = span_ms(PURGE_INTERVAL);
    let start = 1_800_000_000_000 - 1_800_000_000_000 % interval;
    for now in [start, start + 1, start + interval / 2, start + interval - 1] {
        assert_eq!(pass_cutoff(now), start, "at {now}");
    }
    assert_eq!(pass_cutoff(start + interval), start + interval);
}

/// Every connection of the store must reach the same database.
#[tokio::test]
async fn a_path_that_names_no_file_is_refused() {
    for path in ["", ":memory:", "file::memory:", "file:x.db?mode=memory"] {
        let err = SqliteStore::open(Path::new(path)).await.err().unwrap();
        assert!(err.to_string().contains("must name a file"), "{err}");
    }
}

/// Holds the write lock on the file at `path` from another connection
/// until the returned function is called.
fn hold_write_lock(path: &Path) -> impl FnOnce() {
    let (locked, unlock) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let path = path.to_owned();
    let other = std::thread::spawn(move || {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked.0.send(()).unwrap();
        unlock.1.recv().unwrap();
        conn.execute_batch("COMMIT").unwrap();
    });
    locked.1.recv().unwrap();
    move || {
        unlock.0.send(()).unwrap();
        other.join().unwrap();
    }
}

/// Polls `job` once while another connection holds the write lock: it
/// must be pending at once (with a busy handler on the core's
/// connection it would have polled for the lock for `BUSY_TIMEOUT`
/// first), and answered once the lock is free.
async fn answered_after_the_lock<T>(path: &Path, job: impl Future<Output = T>) -> T {
    let unlock = hold_write_lock(path);
    let mut job = std::pin::pin!(job);
    let started = std::time::Instant::now();
    assert!(futures_util::poll!(job.as_mut()).is_pending());
    let waited = started.elapsed();
    assert!(waited < BUSY_TIMEOUT / 2, "{waited:?}");
    unlock();
    job.await
}

/// A lone delivery's claim, mark and release never wait for a lock on
/// its core: with the write lock held by another connection each goes
/// to the store's thread at once (the core's connection has no busy
/// handler) and is answered once the lock is free. Where a job runs is
/// proven in `store_thread`'s tests.
#[tokio::test]
async fn a_job_on_a_core_never_waits_for_a_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dedupe.db");
    let store = SqliteStore::open(&path).await.unwrap();
    crate::cores::become_core(1);
    let _delivering = crate::cores::Delivering::start();
    let lease = Duration::from_secs(30);
    let fresh = |claim: Claim| match claim {
        Claim::Fresh(token) => token,
        other => panic!("{other:?}"),
    };

    let key = ScopedKey::new("stripe", "evt_locked");
    let token = fresh(
        answered_after_the_lock(&path, store.claim(&key, "fp", lease))
            .await
            .unwrap(),
    );
    // Unlocked: the row the thread wrote is seen by the next claim.
    let again = store.claim(&key, "fp", lease).await.unwrap();
    assert!(
        matches!(again, Claim::Existing(Existing::InFlight { .. })),
        "{again:?}"
    );
    let snapshot = Snapshot {
        status: 200,
        content_type: None,
        body: bytes::Bytes::from_static(b"ok"),
        truncated: false,
    };
    let marked = store.complete(&key, &token, &snapshot, Duration::from_secs(60));
    assert!(answered_after_the_lock(&path, marked).await.unwrap());
    let done = store.claim(&key, "fp", lease).await.unwrap();
    assert!(
        matches!(done, Claim::Existing(Existing::Completed(_))),
        "{done:?}"
    );

    let key = ScopedKey::new("stripe", "evt_released");
    let token = fresh(store.claim(&key, "fp", lease).await.unwrap());
    assert!(
        answered_after_the_lock(&path, store.release(&key, &token))
            .await
            .unwrap()
    );
    assert!(matches!(
        store.claim(&key, "fp", lease).await.unwrap(),
        Claim::Fresh(_)
    ));
}

/// A connection to a fresh file with one table, for `immediate`.
fn scratch() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = Connection::open(dir.path().join("t.db")).unwrap();
    conn.execute_batch("CREATE TABLE t (v INTEGER)").unwrap();
    (dir, conn)
}

fn rows(c: &Connection) -> i64 {
    c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap()
}

/// `immediate` keeps what `f` wrote when it succeeds and nothing when it
/// fails or panics, and leaves no transaction open either way.
#[test]
fn immediate_commits_on_success_and_rolls_back_otherwise() {
    let (_dir, c) = scratch();
    let insert = |c: &Connection| Ok(c.execute("INSERT INTO t VALUES (1)", [])?);

    assert_eq!(immediate(&c, insert).unwrap(), 1);
    assert_eq!(rows(&c), 1);
    assert!(c.is_autocommit());

    let failed = immediate(&c, |c| {
        insert(c)?;
        Err::<(), _>(StoreError::Unavailable("the job failed".into()))
    });
    assert!(failed.is_err());
    assert_eq!(rows(&c), 1, "what a failed job wrote is rolled back");
    assert!(c.is_autocommit());

    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        immediate(&c, |c| -> Result<()> {
            insert(c)?;
            panic!("the job panicked");
        })
    }));
    assert!(panicked.is_err());
    assert_eq!(rows(&c), 1, "what a panicking job wrote is rolled back");
    assert!(c.is_autocommit());
}

/// `immediate` takes the write lock before `f` runs: with another
/// connection holding it, `f` never runs.
#[test]
fn immediate_takes_the_write_lock_first() {
    let (dir, c) = scratch();
    c.busy_timeout(Duration::ZERO).unwrap();
    let path = dir.path().join("t.db");
    let release = hold_write_lock(&path);
    let mut ran = false;
    let locked = immediate(&c, |_| {
        ran = true;
        Ok(())
    });
    release();
    assert!(locked.is_err());
    assert!(!ran, "f ran without the write lock");
    assert!(c.is_autocommit());
}

/// A commit that fails (here: busy, a reader holds the file in the
/// rollback journal's mode and nobody waits) leaves the transaction open
/// in SQLite; `immediate` rolls it back, so the connection is free for
/// the next job and what `f` wrote is gone.
#[test]
fn immediate_rolls_back_a_commit_that_failed() {
    let (dir, c) = scratch();
    c.busy_timeout(Duration::ZERO).unwrap();
    let reader = Connection::open(dir.path().join("t.db")).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    assert_eq!(rows(&reader), 0);

    let committed = immediate(&c, |c| Ok(c.execute("INSERT INTO t VALUES (1)", [])?));
    assert!(
        committed.is_err(),
        "the reader's lock let the commit through"
    );
    assert!(
        c.is_autocommit(),
        "the failed commit left a transaction open"
    );

    reader.execute_batch("COMMIT").unwrap();
    assert_eq!(rows(&c), 0, "what the failed commit held was kept");
}
