//! The sqlite backend: an embedded, durable file, the default for a single
//! replica. Keys survive restarts; expired rows are purged in the background.
//!
//! rusqlite is synchronous: every operation runs on the store's own thread,
//! which owns the serving connection (`store_thread`), and WAL checkpoints
//! run on a second thread with a connection of their own (`checkpoint`).
//! Both stop when the store is dropped. Timestamps are unix milliseconds.

mod checkpoint;
mod outbox;
mod owned_thread;
mod store_thread;

use std::path::Path;
use std::time::Duration;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ValueRef};
use rusqlite::{Connection, ErrorCode, OptionalExtension, params};

use self::checkpoint::CheckpointThread;
use self::store_thread::{Chore, StoreThread, fixed};
use super::{Backend, Claim, Existing, KeyRecord, LeaseToken, ScopedKey, Snapshot, StoreError};
use crate::store::Result;
use crate::store::clock::{after, now_ms, span_ms};

/// `expires_at` is the lease end while in flight and the retention end once
/// completed: every read checks it, and so does the purge. It has no
/// index: the mark changes it, and keeping the row's place in an index
/// cost every request three more WAL pages (6.5 a claim and mark against
/// 3.4 without; docs/BENCHMARKS.md, The overhead work). The purge reads the
/// rows in rowid order instead (`purge_batch`). Files from before drop the
/// index at open.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS processed_events (
    provider              TEXT    NOT NULL,
    provider_event_id     TEXT    NOT NULL,
    state                 TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    lease_token           TEXT,
    fingerprint           TEXT    NOT NULL,
    response_status       INTEGER,
    response_content_type TEXT,
    response_body         BLOB,
    response_truncated    INTEGER NOT NULL DEFAULT 0,
    lease_expires_at      INTEGER,
    expires_at            INTEGER NOT NULL,
    received_at           INTEGER NOT NULL,
    PRIMARY KEY (provider, provider_event_id)
);
DROP INDEX IF EXISTS processed_events_expires_at;
";

/// Columns added after the first release, for files that predate them.
const ADDED_COLUMNS: [(&str, &str); 1] = [(
    "response_truncated",
    "ALTER TABLE processed_events ADD COLUMN response_truncated INTEGER NOT NULL DEFAULT 0",
)];

/// Long enough to queue behind another process's claim, short enough that a
/// wedged lock surfaces as an error rather than a hung delivery.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
const PURGE_INTERVAL: Duration = Duration::from_secs(30);
/// Small batches keep each purge transaction short, so claims never wait
/// long behind a purge of millions of rows.
const PURGE_BATCH: usize = 500;
/// Short enough that the WAL stays small (a checkpoint copies about this
/// long's commits), long enough to cost nothing measurable when idle. 20
/// ms took a third off the claims' tail at 1,000 req/s but not the added
/// p99, for about 9% more CPU per fresh event; 50 ms and 1 s did not help
/// (docs/BENCHMARKS.md, "What makes a request slow").
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);
/// WAL frames (pages, 4 KiB) past which a checkpoint makes the next commit
/// start the WAL over (see `checkpoint`): the WAL file stays near 16 MiB
/// under any load. Each start-over takes about 2 ms, mostly under the
/// write lock (the checkpoint's `fsync`s, then the next commit's `fsync`
/// of the new WAL header); slow claims overlap it more than anything
/// else. 1,024 and 2,048 frames left more claims above 0.5 ms, and 16,384
/// more on average (docs/BENCHMARKS.md, "What makes a request slow").
const RESTART_FRAMES: i64 = 4096;

/// A busy handler that tries again every 50 µs until `timeout` has passed.
/// SQLite's own (`busy_timeout`) sleeps 1, 2, 5, ... 100 ms between tries:
/// a claim behind the checkpoint's brief write lock would sleep for far
/// longer than the lock is held, and the checkpoint itself would keep
/// missing the microseconds between the store thread's commits.
pub(super) fn poll_while_busy(timeout: Duration) -> impl FnMut(i32) -> bool + Send + 'static {
    let mut since = std::time::Instant::now();
    move |tries| {
        if tries == 0 {
            since = std::time::Instant::now();
        }
        std::thread::sleep(Duration::from_micros(50));
        since.elapsed() < timeout
    }
}

/// Dedupe state in a SQLite file (table `processed_events`).
pub struct SqliteStore {
    thread: StoreThread,
    _checkpoints: CheckpointThread,
}

/// The columns every read needs, in `SELECT_LIVE` order.
struct Row {
    state: State,
    fingerprint: String,
    lease_expires_at: Option<i64>,
    status: Option<i64>,
    content_type: Option<String>,
    body: Option<Vec<u8>>,
    truncated: bool,
    expires_at: i64,
}

/// The `state` column, read without a `String` of its own (the schema's
/// CHECK allows these two; another value is a damaged file).
enum State {
    InFlight,
    Completed,
}

impl FromSql for State {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        match value.as_str()? {
            "in_flight" => Ok(Self::InFlight),
            "completed" => Ok(Self::Completed),
            other => Err(FromSqlError::Other(
                format!("unknown state {other:?}").into(),
            )),
        }
    }
}

const SELECT_LIVE: &str = "
SELECT state, fingerprint, lease_expires_at, response_status, response_content_type, response_body,
       response_truncated, expires_at
FROM processed_events
WHERE provider = ?1 AND provider_event_id = ?2 AND expires_at > ?3";

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path` and starts the
    /// store's thread (with the background purge) and the checkpoint
    /// thread. The parent directory must exist: creating it would hide a
    /// mistyped path until the data is found missing.
    pub async fn open(path: &Path) -> Result<Self> {
        let owned = path.to_owned();
        let (serving, here, checkpointing) = tokio::task::spawn_blocking(move || {
            // The serving connection first: it creates the file and schema.
            let serving = open_connection(&owned)?;
            named(&owned, create_schema(&serving))?;
            let here = open_connection(&owned)?;
            here.busy_timeout(Duration::ZERO)?;
            Ok::<_, StoreError>((serving, here, Connection::open(&owned)?))
        })
        .await
        .map_err(task_failed)??;
        let purge = Chore {
            every: PURGE_INTERVAL,
            round: |c| Ok(purge_batch(c, pass_cutoff(now_ms()))? > 0),
            failure: "sqlite store: purging expired rows failed",
        };
        Ok(Self {
            thread: StoreThread::spawn("hookgate-sqlite", serving, here, purge)?,
            _checkpoints: CheckpointThread::spawn(
                "sqlite-wal-ckpt",
                checkpointing,
                CHECKPOINT_INTERVAL,
                RESTART_FRAMES,
            )?,
        })
    }

    /// Deletes the rows expired by now, in batches, as far as the purge
    /// reaches (see `purge_batch`); returns how many. The store's thread
    /// does this on its own every 30 s, for the rows expired by the last
    /// whole 30 s (`pass_cutoff`).
    pub async fn purge_expired(&self) -> Result<u64> {
        let cutoff = now_ms();
        let mut total = 0;
        loop {
            // One job per batch, so claims queued meanwhile interleave.
            let deleted = self.run(move |c| purge_batch(c, cutoff)).await?;
            total += deleted as u64;
            if deleted == 0 {
                return Ok(total);
            }
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl FnMut(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.thread.run(f).await
    }

    /// `run`, or on the caller's core when it has nothing else to do
    /// (`StoreThread::run_here_when_alone`): for the jobs on a delivery's
    /// path, each one statement, or one transaction of its own when not
    /// inside the store thread's batch (`is_autocommit`).
    async fn run_here_when_alone<T: Send + 'static>(
        &self,
        f: impl FnMut(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.thread.run_here_when_alone(f).await
    }
}

/// The serving connection's page cache, in KiB (SQLite's negative form).
/// SQLite's default is 2 MiB; claims and lookups touch the index pages of
/// recent keys, and a miss is a read from the OS page cache, so a smaller
/// cache costs little and keeps the gate's resident memory down
/// (docs/BENCHMARKS.md, Memory).
const CACHE_KIB: i64 = -512;

/// Statements kept parsed on the store thread's connection. 16 are cached
/// today (the store's six and the outbox's six, and the batch's `BEGIN
/// IMMEDIATE`, `SAVEPOINT`, `RELEASE` and `COMMIT`), as many as rusqlite's
/// default room: twice that, so that one more does not evict another and
/// send every batch back to parsing it.
const STATEMENT_CACHE: usize = 32;

/// A connection to the file at `path` with the settings every connection
/// the store serves from shares (the schema is `create_schema`'s).
fn open_connection(path: &Path) -> Result<Connection> {
    // SQLite opens a database of the connection's own for these: the
    // store's connections (its thread's, the cores', the checkpoints')
    // would each see another, and a claim made on one would be unknown to
    // the others.
    // SQLite reads a `file:` URI as one (in-memory databases among them).
    let text = path.as_os_str().to_string_lossy();
    if text.is_empty() || text == ":memory:" || text.starts_with("file:") {
        return Err(StoreError::Unavailable(format!(
            "sqlite {path:?}: the path must name a file, not a URI or \":memory:\" \
             (for a store in memory, set store.backend = \"memory\")"
        )));
    }
    // SQLite itself would only say "unable to open database file".
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        return Err(StoreError::Unavailable(format!(
            "sqlite {}: directory {} does not exist",
            path.display(),
            dir.display()
        )));
    }
    let setup = || -> rusqlite::Result<Connection> {
        let mut conn = Connection::open(path)?;
        conn.busy_handler(Some(poll_while_busy(BUSY_TIMEOUT)))?;
        // WAL lets reads proceed beside a write; with WAL, synchronous=NORMAL
        // loses no committed claim on a process crash (only on power loss).
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Checkpoints run on their own thread (see `checkpoint`), never
        // inside a commit.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        conn.pragma_update(None, "cache_size", CACHE_KIB)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Ok(conn)
    };
    named(path, setup())
}

/// Creates the tables, or brings an older file's up to date; once per
/// store, on the serving connection.
fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(SCHEMA)?;
    conn.execute_batch(outbox::SCHEMA)?;
    for (column, add) in ADDED_COLUMNS {
        let present: bool = conn.query_row(
            "SELECT count(*) FROM pragma_table_info('processed_events') WHERE name = ?1",
            [column],
            |r| r.get::<_, i64>(0).map(|n| n > 0),
        )?;
        if !present {
            conn.execute_batch(add)?;
        }
    }
    Ok(())
}

/// Names the file in an error from opening it: this error is what an
/// operator sees at startup.
fn named<T>(path: &Path, result: rusqlite::Result<T>) -> Result<T> {
    result.map_err(|e| match StoreError::from(e) {
        StoreError::Corrupt(m) => StoreError::Corrupt(format!("{m} ({})", path.display())),
        StoreError::Unavailable(m) => StoreError::Unavailable(format!("{m} ({})", path.display())),
        other => other,
    })
}

/// The background purge's cutoff: rows expired by the last whole
/// `PURGE_INTERVAL`. Every round of a pass uses the same one, so a pass
/// ends when a round finds nothing, even while rows go on expiring under
/// load (with each round's own time, nearly every round would find a row
/// or two, and the next would run at once, between every two batches of
/// jobs). A row waits at most one interval more; reads check the time
/// themselves.
fn pass_cutoff(now: i64) -> i64 {
    let interval = span_ms(PURGE_INTERVAL);
    now - now.rem_euclid(interval)
}

/// Deletes the rows expired by `cutoff` among the oldest `PURGE_BATCH` (by
/// rowid), then delivered outbox jobs past `cutoff`, up to the rest of the
/// batch; returns how many of both.
///
/// With no index on `expires_at`, the purge reads rows in rowid order: a
/// claim inserts its row with the next rowid, so that is the order of
/// their claims, and rows mostly expire in it. Each round reads at most
/// `PURGE_BATCH` rows, however large the table, and deletes a row only
/// once its own `expires_at` has passed. A live row stays, and the round
/// still deletes the expired rows behind it within its `PURGE_BATCH`; a
/// row that expires sooner than rows claimed before it (a provider with a
/// shorter retention, a lease never completed) reads as absent, and can
/// wait in the file until fewer than `PURGE_BATCH` live rows are ahead of
/// it: at most the longest retention late.
fn purge_batch(c: &mut Connection, cutoff: i64) -> Result<usize> {
    let mut stmt = c.prepare_cached(
        "DELETE FROM processed_events
         WHERE rowid IN (SELECT rowid FROM processed_events ORDER BY rowid LIMIT ?2)
           AND expires_at <= ?1",
    )?;
    let events = stmt.execute(params![cutoff, PURGE_BATCH as i64])?;
    drop(stmt);
    // Delivered jobs go with their dedupe entries; pending and dead ones
    // stay until delivered or purged by an operator.
    let jobs = outbox::purge_batch(c, cutoff, (PURGE_BATCH - events) as i64)?;
    Ok(events + jobs)
}

/// The mark: the row completed with `snapshot`, if `token` still holds
/// its lease. One statement is its own transaction: the token check and
/// the write cannot be split by another claim.
fn complete_in(
    c: &Connection,
    key: &ScopedKey,
    token: &LeaseToken,
    snapshot: &Snapshot,
    retention: Duration,
) -> Result<bool> {
    let now = now_ms();
    let changed = c
        .prepare_cached(
            "UPDATE processed_events
             SET state = 'completed', lease_token = NULL, lease_expires_at = NULL,
                 response_status = ?4, response_content_type = ?5, response_body = ?6,
                 expires_at = ?7, response_truncated = ?9
             WHERE provider = ?1 AND provider_event_id = ?2 AND lease_token = ?3
               AND state = 'in_flight' AND expires_at > ?8",
        )?
        .execute(params![
            key.provider,
            key.key,
            token.0,
            snapshot.status,
            snapshot.content_type,
            &snapshot.body[..],
            after(now, retention),
            now,
            snapshot.truncated,
        ])?;
    Ok(changed == 1)
}

/// Runs `f` in a transaction of its own that takes the write lock before
/// `f` reads (`BEGIN IMMEDIATE`: two processes on one file then queue on
/// the busy handler instead of both seeing a key free, or deadlocking as
/// both upgrade a read lock); commits when `f` succeeds, rolls back when
/// it fails or panics, or the commit fails.
///
/// rusqlite's `Transaction` does the same through `execute_batch`, which
/// compiles its `BEGIN` and its `COMMIT` anew every time: on duplicates,
/// whose claims mostly run alone, that was most of the store thread's SQL
/// compiling (docs/BENCHMARKS.md, The profile at `54fa488`). These come
/// from the connection's statement cache, as the store thread's batches'
/// do.
fn immediate<T>(c: &Connection, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    /// Whatever is still open when this is dropped was not committed.
    /// SQLite may have rolled it back itself (a full disk): then there is
    /// nothing to undo.
    struct Open<'c>(&'c Connection);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            if !self.0.is_autocommit() {
                let _ = self.0.execute_batch("ROLLBACK");
            }
        }
    }
    fixed(c, "BEGIN IMMEDIATE")?;
    let _open = Open(c);
    let answer = f(c)?;
    fixed(c, "COMMIT")?;
    Ok(answer)
}

/// The claim's read and write, inside a transaction that holds the write
/// lock.
fn claim_in(c: &Connection, key: &ScopedKey, fingerprint: &str, lease: Duration) -> Result<Claim> {
    let now = now_ms();
    if let Some(row) = select_live(c, key, now)? {
        let (stored, existing) = row.split(now)?;
        return Ok(Claim::held(&stored, fingerprint, existing));
    }
    let token = LeaseToken::generate();
    let lease_end = after(now, lease);
    c.prepare_cached(
        "INSERT OR REPLACE INTO processed_events (provider, provider_event_id, state,
             lease_token, fingerprint, lease_expires_at, expires_at, received_at)
         VALUES (?1, ?2, 'in_flight', ?3, ?4, ?5, ?5, ?6)",
    )?
    .execute(params![
        key.provider,
        key.key,
        token.0,
        fingerprint,
        lease_end,
        now
    ])?;
    Ok(Claim::Fresh(token))
}

fn select_live(c: &Connection, key: &ScopedKey, now: i64) -> Result<Option<Row>> {
    let mut stmt = c.prepare_cached(SELECT_LIVE)?;
    let row = stmt
        .query_row(params![key.provider, key.key, now], |r| {
            Ok(Row {
                state: r.get(0)?,
                fingerprint: r.get(1)?,
                lease_expires_at: r.get(2)?,
                status: r.get(3)?,
                content_type: r.get(4)?,
                body: r.get(5)?,
                truncated: r.get(6)?,
                expires_at: r.get(7)?,
            })
        })
        .optional()?;
    Ok(row)
}

impl Row {
    /// The stored fingerprint, and what the row says of its key.
    fn split(self, now: i64) -> Result<(String, Existing)> {
        let existing = match self.state {
            State::InFlight => {
                let remaining = self.lease_expires_at.unwrap_or(now).saturating_sub(now);
                // Retry-After has a one-second resolution: never say zero.
                let remaining = Duration::from_millis(u64::try_from(remaining).unwrap_or(0));
                Existing::InFlight {
                    retry_after: remaining.max(Duration::from_secs(1)),
                }
            }
            State::Completed => {
                let status = self
                    .status
                    .and_then(|s| u16::try_from(s).ok())
                    .ok_or_else(|| corrupt("completed row without a valid status"))?;
                Existing::Completed(Snapshot {
                    status,
                    content_type: self.content_type,
                    body: self.body.unwrap_or_default().into(),
                    truncated: self.truncated,
                })
            }
        };
        Ok((self.fingerprint, existing))
    }
}

impl Backend for SqliteStore {
    async fn claim(&self, key: &ScopedKey, fingerprint: &str, lease: Duration) -> Result<Claim> {
        let (key, fingerprint) = (key.clone(), fingerprint.to_owned());
        self.run_here_when_alone(move |c| {
            if !c.is_autocommit() {
                // Inside the store thread's batch: its BEGIN IMMEDIATE
                // already holds the write lock, and `claim_in` writes in
                // one statement, its last, so the batch needs no savepoint
                // for it (`StoreThread::run_here_when_alone`).
                return claim_in(c, &key, &fingerprint, lease);
            }
            immediate(c, |c| claim_in(c, &key, &fingerprint, lease))
        })
        .await
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        token: &LeaseToken,
        snapshot: &Snapshot,
        retention: Duration,
    ) -> Result<bool> {
        let (key, token, snapshot) = (key.clone(), token.clone(), snapshot.clone());
        self.run_here_when_alone(move |c| complete_in(c, &key, &token, &snapshot, retention))
            .await
    }

    async fn release(&self, key: &ScopedKey, token: &LeaseToken) -> Result<bool> {
        let (key, token) = (key.clone(), token.clone());
        self.run_here_when_alone(move |c| {
            let changed = c
                .prepare_cached(
                    "DELETE FROM processed_events
                     WHERE provider = ?1 AND provider_event_id = ?2 AND lease_token = ?3
                       AND state = 'in_flight' AND expires_at > ?4",
                )?
                .execute(params![key.provider, key.key, token.0, now_ms()])?;
            Ok(changed == 1)
        })
        .await
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<KeyRecord>> {
        let key = key.clone();
        self.run(move |c| {
            let now = now_ms();
            select_live(c, &key, now)?
                .map(|row| {
                    let left = u64::try_from(row.expires_at.saturating_sub(now)).unwrap_or(0);
                    let (fingerprint, state) = row.split(now)?;
                    let expires_in = matches!(state, Existing::Completed(_))
                        .then(|| Duration::from_millis(left));
                    Ok(KeyRecord {
                        fingerprint,
                        state,
                        expires_in,
                    })
                })
                .transpose()
        })
        .await
    }

    async fn forget(&self, key: &ScopedKey) -> Result<bool> {
        let key = key.clone();
        self.run(move |c| {
            // An expired row counts as absent; the purge removes it.
            let changed = c
                .prepare_cached(
                    "DELETE FROM processed_events
                     WHERE provider = ?1 AND provider_event_id = ?2 AND expires_at > ?3",
                )?
                .execute(params![key.provider, key.key, now_ms()])?;
            Ok(changed == 1)
        })
        .await
    }

    async fn ping(&self) -> Result<()> {
        self.run(|c| {
            c.query_row("SELECT 1 FROM processed_events LIMIT 1", [], |_| Ok(()))
                .optional()?;
            Ok(())
        })
        .await
    }
}

/// Maps SQLite failures: damaged files and undecodable values are
/// `Corrupt`; everything else (locked, I/O, full disk) is `Unavailable`.
impl From<rusqlite::Error> for StoreError {
    fn from(err: rusqlite::Error) -> Self {
        use rusqlite::Error as E;
        match &err {
            E::SqliteFailure(e, _)
                if matches!(e.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) =>
            {
                corrupt(&err.to_string())
            }
            E::FromSqlConversionFailure(..)
            | E::IntegralValueOutOfRange(..)
            | E::InvalidColumnType(..)
            | E::Utf8Error(..) => corrupt(&err.to_string()),
            _ => StoreError::Unavailable(format!("sqlite: {err}")),
        }
    }
}

fn corrupt(detail: &str) -> StoreError {
    StoreError::Corrupt(format!("sqlite: {detail}"))
}

fn task_failed(err: tokio::task::JoinError) -> StoreError {
    StoreError::Unavailable(format!("sqlite task failed: {err}"))
}

#[cfg(test)]
mod tests;
