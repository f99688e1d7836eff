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
//!
//! A reader is tried only for a key this store marked completed lately
//! ([`Recent`]). A fresh event, almost every delivery, would only miss
//! there, and a miss is not cheap while the store's thread commits all
//! the while: each read transaction takes the WAL's shared-memory locks
//! and, the file having changed, starts from an empty page cache (`pread`s
//! of the index). Trying every claim on a reader made fresh events on
//! sqlite 12% to 49% dearer in CPU per request (docs/BENCHMARKS.md, issue
//! 15).

use std::hash::{BuildHasher, RandomState};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, OpenFlags};

use super::{Claim, Existing, ScopedKey, now_ms, select_live};
use crate::store::Result;

/// Each reader's page cache, in KiB (SQLite's negative form): the index
/// pages of recent keys.
const CACHE_KIB: i64 = -128;

/// Keys [`Recent`] holds at most: 256 KiB of hashes per store.
const RECENT_SLOTS: usize = 1 << 15;

pub(super) struct Readers {
    connections: Vec<Mutex<Connection>>,
    recent: Recent,
}

impl Readers {
    /// One read-only connection per core (a runtime thread each, at most).
    pub(super) fn open(path: &Path) -> Result<Self> {
        let count = std::thread::available_parallelism().map_or(2, usize::from);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let connections = (0..count)
            .map(|_| {
                let conn = Connection::open_with_flags(path, flags)?;
                conn.pragma_update(None, "cache_size", CACHE_KIB)?;
                Ok(Mutex::new(conn))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            connections,
            recent: Recent::new(RECENT_SLOTS),
        })
    }

    /// The claim's outcome when the key is one this store completed lately
    /// and its row is live and completed; `None` when the store's thread
    /// must answer.
    pub(super) fn completed(&self, key: &ScopedKey, fingerprint: &str) -> Option<Claim> {
        if !self.recent.contains(key) {
            return None;
        }
        // Never wait for a reader: the store's thread is the other way.
        let conn = self.connections.iter().find_map(|m| m.try_lock().ok())?;
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

    /// Notes that the store's thread marked `key` completed, or found it
    /// completed.
    pub(super) fn marked(&self, key: &ScopedKey) {
        self.recent.insert(key);
    }
}

/// Keys marked completed lately, as 64-bit hashes in a two-way table: each
/// key has a set of two slots, the newer of the set's keys first, and a
/// third key pushes the oldest out. A key that is not here (pushed out,
/// completed before a restart, or by another process on the same file)
/// goes to the store's thread; a key that is here only sends the claim to
/// a reader, which reads the row itself. So the table decides how fast a
/// claim is answered, never what the answer is, and a race between two
/// inserts that loses one costs only that.
struct Recent {
    slots: Box<[AtomicU64]>,
    hasher: RandomState,
}

impl Recent {
    /// `slots` is a power of two, at least 2.
    fn new(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two() && slots >= 2, "{slots} slots");
        Self {
            slots: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            hasher: RandomState::new(),
        }
    }

    /// The key's hash (never 0, an empty slot) and its set.
    fn place(&self, key: &ScopedKey) -> (u64, &[AtomicU64]) {
        let hash = self.hasher.hash_one((&key.provider, &key.key)) | 1;
        let sets = self.slots.len() / 2;
        let set = (hash >> 32) as usize & (sets - 1);
        (hash, &self.slots[2 * set..2 * set + 2])
    }

    fn insert(&self, key: &ScopedKey) {
        let (hash, set) = self.place(key);
        let newer = set[0].swap(hash, Ordering::Relaxed);
        if newer != hash {
            set[1].store(newer, Ordering::Relaxed);
        }
    }

    fn contains(&self, key: &ScopedKey) -> bool {
        let (hash, set) = self.place(key);
        set.iter().any(|slot| slot.load(Ordering::Relaxed) == hash)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{Backend, SqliteStore};
    use super::Recent;
    use crate::store::{Claim, Existing, LeaseToken, ScopedKey, Snapshot};

    fn snapshot() -> Snapshot {
        Snapshot {
            status: 200,
            content_type: None,
            body: "ok".into(),
            truncated: false,
        }
    }

    async fn claimed(store: &SqliteStore, key: &ScopedKey) -> LeaseToken {
        match store
            .claim(key, "fp", Duration::from_secs(30))
            .await
            .unwrap()
        {
            Claim::Fresh(token) => token,
            other => panic!("a new key is fresh, got {other:?}"),
        }
    }

    #[test]
    fn recent_holds_the_newest_two_keys_of_each_set() {
        let recent = Recent::new(4);
        let keys: Vec<_> = (0..64)
            .map(|n| ScopedKey::new("stripe", format!("evt_{n}")))
            .collect();
        assert!(keys.iter().all(|k| !recent.contains(k)), "empty at first");
        recent.insert(&keys[0]);
        assert!(recent.contains(&keys[0]));
        assert!(!recent.contains(&ScopedKey::new("github", "evt_0")));
        // 64 keys in 4 slots: at most 4 are held, the last two always
        // (the newest of a set is never pushed out by the one after it).
        for key in &keys {
            recent.insert(key);
        }
        let held = keys.iter().filter(|k| recent.contains(k)).count();
        assert!((2..=4).contains(&held), "{held} keys held in 4 slots");
        assert!(recent.contains(&keys[63]) && recent.contains(&keys[62]));
        // Inserting a key again does not push its set's other key out.
        let before: Vec<bool> = keys.iter().map(|k| recent.contains(k)).collect();
        recent.insert(&keys[63]);
        let after: Vec<bool> = keys.iter().map(|k| recent.contains(k)).collect();
        assert_eq!(before, after);
    }

    /// A key this store did not mark is not read on a reader: a second
    /// store on the same file (another process, or this one after a
    /// restart) answers its first duplicate through the store's thread, and
    /// the next one on a reader.
    #[tokio::test]
    async fn only_a_key_this_store_marked_is_read_on_a_reader() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.db");
        let (marker, other) = (
            SqliteStore::open(&path).await.unwrap(),
            SqliteStore::open(&path).await.unwrap(),
        );
        let key = ScopedKey::new("stripe", "evt_1");
        let token = claimed(&marker, &key).await;
        assert_eq!(marker.readers.completed(&key, "fp"), None, "in flight");
        let day = Duration::from_secs(86_400);
        assert!(
            marker
                .complete(&key, &token, &snapshot(), day)
                .await
                .unwrap()
        );

        let answered = Claim::Existing(Existing::Completed(snapshot()));
        assert_eq!(marker.readers.completed(&key, "fp"), Some(answered.clone()));
        assert_eq!(other.readers.completed(&key, "fp"), None);
        let through_thread = other.claim(&key, "fp", Duration::from_secs(30)).await;
        assert_eq!(through_thread.unwrap(), answered);
        // Found completed by its thread, the key takes a reader next time.
        assert_eq!(other.readers.completed(&key, "fp"), Some(answered));
        let fresh = ScopedKey::new("stripe", "evt_2");
        assert_eq!(marker.readers.completed(&fresh, "fp"), None);
    }

    #[tokio::test]
    async fn a_duplicate_is_answered_while_the_store_thread_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(
            SqliteStore::open(&dir.path().join("gate.db"))
                .await
                .unwrap(),
        );
        let key = ScopedKey::new("stripe", "evt_1");
        let token = claimed(&store, &key).await;
        let snapshot = snapshot();
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
