//! WAL checkpoints off the delivery path.
//!
//! With SQLite's default `wal_autocheckpoint` (1,000 pages), the commit that
//! crosses the threshold copies the WAL into the database and syncs it,
//! holding the store's only serving connection meanwhile: at 1,000 req/s 8%
//! of claims took 4 to 32 ms (docs/BENCHMARKS.md). The serving connection
//! turns that off, and this thread, with a connection of its own, runs a
//! PASSIVE checkpoint every `interval`. PASSIVE never waits for the writer
//! (nor invokes the busy handler), so commits never pay for checkpoints.
//!
//! But a writer only starts the WAL over from its beginning when, at the
//! start of its transaction, every frame has been copied back; under a
//! steady stream of commits that moment never comes, the checkpoint copies
//! frames the WAL keeps appending past, and the file grows without bound
//! (800 MB in 9 s of fresh events at 256 connections). So when a PASSIVE
//! checkpoint finds more than `restart_frames` in the WAL, a RESTART
//! checkpoint follows: it waits for the writer's transaction in progress,
//! holds the write lock while it copies what PASSIVE left, and the next
//! commit writes the WAL from its start. Commits wait for it (their busy
//! handler) only then, at most once per `restart_frames` frames.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use rusqlite::Connection;

use super::owned_thread::OwnedThread;
use crate::store::Result;
use crate::store::StoreError;

pub(super) struct CheckpointThread {
    /// Nothing is ever sent: closing the channel (dropping this) stops it.
    _thread: OwnedThread<()>,
}

impl CheckpointThread {
    pub(super) fn spawn(
        name: &str,
        conn: Connection,
        interval: Duration,
        restart_frames: i64,
    ) -> Result<Self> {
        let mut conn = conn;
        // The store's thread takes the write lock again within microseconds
        // of a commit: a RESTART must poll for the gap (see
        // `poll_while_busy`), and gives up after a second.
        conn.busy_handler(Some(super::poll_while_busy(Duration::from_secs(1))))
            .map_err(StoreError::from)?;
        let thread = OwnedThread::spawn(name, 1, move |stop| {
            let mut failing = false;
            while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(interval) {
                match checkpoint(&conn, restart_frames) {
                    Ok(()) => failing = false,
                    // Once per failure streak: a broken disk must not write
                    // ten log lines a second.
                    Err(error) if !failing => {
                        failing = true;
                        tracing::warn!(%error, "sqlite store: WAL checkpoint failed");
                    }
                    Err(_) => {}
                }
            }
        })
        .map_err(|e| StoreError::Unavailable(format!("sqlite: cannot start a thread: {e}")))?;
        Ok(Self { _thread: thread })
    }
}

/// One PASSIVE checkpoint, and a RESTART one when the WAL has grown past
/// `restart_frames`. The first column of either is 1 when another
/// checkpoint (a second store on the same file) held the checkpoint lock,
/// or when RESTART gave up waiting: not an error, the next tick tries again.
fn checkpoint(conn: &Connection, restart_frames: i64) -> rusqlite::Result<()> {
    let frames = wal_checkpoint(conn, "PASSIVE")?;
    if frames > restart_frames {
        wal_checkpoint(conn, "RESTART")?;
    }
    Ok(())
}

/// Runs a checkpoint; returns the frames in the WAL (-1 when not in WAL
/// mode).
fn wal_checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<i64> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        row.get(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits in a tight loop from one connection while the checkpoint
    /// thread runs beside it; returns the WAL file's largest size seen.
    fn largest_wal_under_steady_commits(restart_frames: i64) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal.db");
        let writer = Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;
                 PRAGMA wal_autocheckpoint = 0;
                 CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB);",
            )
            .unwrap();
        let _checkpoints = CheckpointThread::spawn(
            "sqlite-t-ckpt",
            Connection::open(&path).unwrap(),
            Duration::from_millis(1),
            restart_frames,
        )
        .unwrap();
        let wal = path.with_extension("db-wal");
        let mut largest = 0;
        for i in 0..20_000 {
            writer
                .execute("INSERT INTO t (v) VALUES (zeroblob(2000))", [])
                .unwrap();
            if i % 100 == 0 {
                largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
            }
        }
        largest
    }

    #[test]
    fn the_wal_stays_bounded_under_steady_commits() {
        // 20,000 commits of a page or two each: about 166 MB of WAL with
        // PASSIVE checkpoints alone, which the writer outruns, whatever the
        // scheduler does. With RESTART the peak is 2 to 4 MB on an idle
        // machine, but how soon the checkpoint thread runs is up to a
        // scheduler shared with every other test (it reached 19.8 MB once
        // in CI, and 42 MB once on two cores busy with the other unit
        // tests), so the check compares with the run without RESTART on
        // the same machine rather than with a fixed size, with room for a
        // starved checkpoint thread.
        let unbounded = largest_wal_under_steady_commits(i64::MAX);
        let bounded = largest_wal_under_steady_commits(64);
        assert!(
            bounded * 2 < unbounded,
            "the WAL grew to {bounded} bytes with RESTART, {unbounded} without"
        );
    }
}
