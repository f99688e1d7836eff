//! Read-only connections that answer a duplicate of a completed event on
//! the caller's thread, without the hand-off to the store's thread and
//! back (two thread wake-ups, most of a duplicate's store cost).
//!
//! Only a completed row is answered here: it stays completed until it
//! expires or an operator forgets it, and WAL readers see every committed
//! write, so the answer is the one the store's thread would give. Anything
//! else (no row, a lease in flight, a busy reader, any error) goes the
//! authoritative way, through the store's thread. The read is one indexed
//! point lookup, microseconds from SQLite's or the OS's page cache, which
//! is why it may run on a runtime thread.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OpenFlags};

use super::{Claim, Existing, ScopedKey, now_ms, select_live};
use crate::store::Result;

/// Each reader's page cache, in KiB (SQLite's negative form): the index
/// pages of recent keys.
const CACHE_KIB: i64 = -128;

pub(super) struct Readers(Vec<Mutex<Connection>>);

impl Readers {
    /// One read-only connection per core (a runtime thread each, at most).
    pub(super) fn open(path: &Path) -> Result<Self> {
        let count = std::thread::available_parallelism().map_or(2, usize::from);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let readers = (0..count)
            .map(|_| {
                let conn = Connection::open_with_flags(path, flags)?;
                conn.pragma_update(None, "cache_size", CACHE_KIB)?;
                Ok(Mutex::new(conn))
            })
            .collect::<Result<_>>()?;
        Ok(Self(readers))
    }

    /// The claim's outcome when the key is live and completed; `None` when
    /// the store's thread must answer.
    pub(super) fn completed(&self, key: &ScopedKey, fingerprint: &str) -> Option<Claim> {
        // Never wait for a reader: the store's thread is the other way.
        let conn = self.0.iter().find_map(|m| m.try_lock().ok())?;
        let now = now_ms();
        let row = select_live(&conn, key, now).ok()??;
        if row.state != "completed" {
            return None;
        }
        let stored = row.fingerprint.clone();
        match row.existing(now) {
            Ok(existing @ Existing::Completed(_)) => {
                Some(Claim::held(&stored, fingerprint, existing))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Backend, SqliteStore};
    use crate::store::{Claim, Existing, ScopedKey, Snapshot};

    #[tokio::test]
    async fn a_duplicate_is_answered_while_the_store_thread_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(
            SqliteStore::open(&dir.path().join("gate.db"))
                .await
                .unwrap(),
        );
        let key = ScopedKey::new("stripe", "evt_1");
        let Claim::Fresh(token) = store
            .claim(&key, "fp", Duration::from_secs(30))
            .await
            .unwrap()
        else {
            panic!("a new key is fresh");
        };
        let snapshot = Snapshot {
            status: 200,
            content_type: None,
            body: "ok".into(),
            truncated: false,
        };
        let day = Duration::from_secs(86_400);
        assert!(store.complete(&key, &token, &snapshot, day).await.unwrap());

        // Hold the store's thread until the duplicate has its answer.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel();
        let holder = std::sync::Arc::clone(&store);
        let busy = tokio::spawn(async move {
            holder
                .run(move |_| {
                    let _ = started.send(());
                    let _ = held.recv();
                    Ok(())
                })
                .await
        });
        running.await.unwrap();
        let duplicate = tokio::time::timeout(
            Duration::from_secs(10),
            store.claim(&key, "fp", Duration::from_secs(30)),
        )
        .await
        .expect("answered without the store's thread")
        .unwrap();
        release.send(()).unwrap();
        assert_eq!(duplicate, Claim::Existing(Existing::Completed(snapshot)));
        let changed = store
            .claim(&key, "other", Duration::from_secs(30))
            .await
            .unwrap();
        assert!(matches!(changed, Claim::Mismatch { .. }), "{changed:?}");
        busy.await.unwrap().unwrap();
    }
}
