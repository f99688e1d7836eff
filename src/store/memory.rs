//! The memory backend: a bounded LRU in the process, for tests and local
//! trials only. A restart forgets every key, and eviction under pressure can
//! forget a key before its retention ends.

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lru::LruCache;
use tokio::time::Instant;

use super::{Backend, Claim, Existing, KeyRecord, LeaseToken, ScopedKey, Snapshot, StoreError};

/// Dedupe state held in process memory, least recently used keys evicted
/// first once `capacity` keys are held.
pub struct MemoryStore {
    // A std mutex, not tokio's: every critical section is short and
    // synchronous, and the guard is never held across an `.await`.
    entries: Mutex<LruCache<ScopedKey, Entry>>,
}

struct Entry {
    fingerprint: String,
    state: State,
    /// The lease end while in flight, the retention end once completed.
    expires_at: Instant,
}

enum State {
    InFlight(LeaseToken),
    Completed(Snapshot),
}

impl MemoryStore {
    /// A store holding at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self {
            entries: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// Locks the map. A panic elsewhere while holding the lock cannot leave
    /// an entry half-written (every update is a single `put`/`pop`), so a
    /// poisoned lock is safe to recover.
    fn lock(&self) -> MutexGuard<'_, LruCache<ScopedKey, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live entry for `key`; an expired one is dropped on the way, so
    /// that expiry needs no background sweeper.
    fn live<'a>(
        entries: &'a mut LruCache<ScopedKey, Entry>,
        key: &ScopedKey,
        now: Instant,
    ) -> Option<&'a mut Entry> {
        if entries.peek(key).is_some_and(|e| e.expires_at <= now) {
            entries.pop(key);
        }
        entries.get_mut(key)
    }
}

impl Entry {
    fn owned_by(&self, token: &LeaseToken) -> bool {
        matches!(&self.state, State::InFlight(t) if t == token)
    }

    fn existing(&self, now: Instant) -> Existing {
        match &self.state {
            // Retry-After has a one-second resolution: never tell a sender
            // to come back after zero seconds.
            State::InFlight(_) => Existing::InFlight {
                retry_after: (self.expires_at - now).max(Duration::from_secs(1)),
            },
            State::Completed(snapshot) => Existing::Completed(snapshot.clone()),
        }
    }
}

impl Backend for MemoryStore {
    async fn claim(
        &self,
        key: &ScopedKey,
        fingerprint: &str,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let mut entries = self.lock();
        if let Some(entry) = Self::live(&mut entries, key, now) {
            return Ok(Claim::held(
                &entry.fingerprint,
                fingerprint,
                entry.existing(now),
            ));
        }
        let token = LeaseToken::generate();
        let entry = Entry {
            fingerprint: fingerprint.to_owned(),
            state: State::InFlight(token.clone()),
            expires_at: deadline(now, lease),
        };
        entries.put(key.clone(), entry);
        Ok(Claim::Fresh(token))
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        token: &LeaseToken,
        snapshot: &Snapshot,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut entries = self.lock();
        match Self::live(&mut entries, key, now) {
            Some(entry) if entry.owned_by(token) => {
                entry.state = State::Completed(snapshot.clone());
                entry.expires_at = deadline(now, retention);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release(&self, key: &ScopedKey, token: &LeaseToken) -> Result<bool, StoreError> {
        let mut entries = self.lock();
        let owned =
            Self::live(&mut entries, key, Instant::now()).is_some_and(|e| e.owned_by(token));
        if owned {
            entries.pop(key);
        }
        Ok(owned)
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<KeyRecord>, StoreError> {
        let now = Instant::now();
        let mut entries = self.lock();
        Ok(Self::live(&mut entries, key, now).map(|entry| KeyRecord {
            fingerprint: entry.fingerprint.clone(),
            state: entry.existing(now),
        }))
    }

    async fn forget(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let mut entries = self.lock();
        let live = Self::live(&mut entries, key, Instant::now()).is_some();
        entries.pop(key);
        Ok(live)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// `now + ttl`, saturating: a configured retention of centuries must not
/// panic on `Instant` overflow.
fn deadline(now: Instant, ttl: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(ttl.min(CENTURY)).unwrap_or(now)
}
