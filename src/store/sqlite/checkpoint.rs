//! WAL checkpoints off the delivery path.
//!
//! With SQLite's default `wal_autocheckpoint` (1,000 pages), the commit that
//! crosses the threshold copies the WAL into the database and syncs it,
//! holding the store's only serving connection meanwhile: at 1,000 req/s 8%
//! of claims took 4 to 32 ms (docs/BENCHMARKS.md). The serving connection
//! turns that off, and this thread, with a connection of its own, runs a
//! PASSIVE checkpoint every `interval`. PASSIVE never waits for the writer
//! (nor invokes the busy handler), so commits never pay for checkpoints and
//! the WAL stays about one interval's worth of writes long.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use rusqlite::Connection;

use super::owned_thread::OwnedThread;
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
    ) -> Result<Self, StoreError> {
        let thread = OwnedThread::spawn(name, move |stop| {
            let mut failing = false;
            while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(interval) {
                match checkpoint(&conn) {
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

/// One PASSIVE checkpoint. Its first column is 1 when another checkpoint (a
/// second store on the same file) held the checkpoint lock: not an error,
/// the next tick tries again.
fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}
