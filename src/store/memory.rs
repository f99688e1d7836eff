//! The memory backend: bounded, in the process, for tests and local trials
//! only. A restart forgets every key, and under pressure a completed key can
//! be evicted (least recently used first) before its retention ends.
//!
//! An in-flight claim is never evicted: forgetting one would hand its key to
//! a second `Fresh` claim while the first delivery is still being
//! forwarded. Claims therefore live apart from completed keys, and both
//! count towards `capacity`. When the store is full, a new key takes the
//! place of the least recently used completed one, else of an in-flight
//! claim whose lease has run out; with neither, the claim is refused as
//! `Unavailable` (the gate answers 503 `store_unavailable`, and the sender
//! retries later).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lru::LruCache;
use tokio::time::Instant;

use super::Result;
use super::{Backend, Claim, Existing, KeyRecord, LeaseToken, ScopedKey, Snapshot, StoreError};

/// Dedupe state held in process memory: at most `capacity` keys, in flight
/// and completed together.
pub struct MemoryStore {
    // A std mutex, not tokio's: every critical section is short and
    // synchronous, and the guard is never held across an `.await`.
    keys: Mutex<Keys>,
}

/// Every key is in at most one of the two maps.
struct Keys {
    /// Claims being processed: never evicted, only completed, released,
    /// forgotten or found expired.
    in_flight: HashMap<ScopedKey, InFlight>,
    /// Keys done with, least recently used first out. Unbounded as a cache:
    /// `make_room` keeps both maps together within `capacity`.
    completed: LruCache<ScopedKey, Completed>,
    capacity: usize,
    /// No lease in `in_flight` ends before this: until then, sweeping for
    /// expired claims would find none. Kept low, never exact, so that a
    /// full store refuses claims without scanning every one of them.
    earliest_lease_end: Instant,
}

struct InFlight {
    fingerprint: String,
    token: LeaseToken,
    lease_end: Instant,
}

struct Completed {
    fingerprint: String,
    snapshot: Snapshot,
    retained_until: Instant,
}

/// A live key, as a claim or a read finds it.
enum Live<'a> {
    InFlight(&'a InFlight),
    Completed(&'a Completed),
}

impl MemoryStore {
    /// A store holding at most `capacity` keys (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            keys: Mutex::new(Keys {
                in_flight: HashMap::new(),
                completed: LruCache::unbounded(),
                capacity: capacity.max(1),
                earliest_lease_end: Instant::now(),
            }),
        }
    }

    /// Locks the maps. A panic elsewhere while holding the lock cannot leave
    /// a key half-written (every update is a single insert or removal, and
    /// a key moves between the maps by a removal then an insert), so a
    /// poisoned lock is safe to recover.
    fn lock(&self) -> MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Keys {
    /// The live state of `key`; an expired one is dropped on the way, so
    /// that expiry needs no background sweeper. A completed key found is
    /// marked recently used.
    fn live(&mut self, key: &ScopedKey, now: Instant) -> Option<Live<'_>> {
        if self.in_flight.get(key).is_some_and(|c| c.lease_end <= now) {
            self.in_flight.remove(key);
        }
        if self
            .completed
            .peek(key)
            .is_some_and(|c| c.retained_until <= now)
        {
            self.completed.pop(key);
        }
        if let Some(claim) = self.in_flight.get(key) {
            return Some(Live::InFlight(claim));
        }
        self.completed.get(key).map(Live::Completed)
    }

    /// Removes and returns the in-flight claim of `key` if `token` still
    /// owns it (its lease unexpired); anyone else's is left in place.
    fn take_owned(
        &mut self,
        key: &ScopedKey,
        token: &LeaseToken,
        now: Instant,
    ) -> Option<InFlight> {
        let owned = matches!(self.live(key, now), Some(Live::InFlight(c)) if c.token == *token);
        if owned {
            self.in_flight.remove(key)
        } else {
            None
        }
    }

    fn len(&self) -> usize {
        self.in_flight.len() + self.completed.len()
    }

    /// Makes room for one more key: evicts the least recently used
    /// completed key, else drops the in-flight claims whose lease has
    /// ended. Full of live claims, there is none to be made.
    fn make_room(&mut self, now: Instant) -> Result<()> {
        if self.len() < self.capacity || self.completed.pop_lru().is_some() {
            return Ok(());
        }
        if now >= self.earliest_lease_end {
            self.in_flight.retain(|_, c| c.lease_end > now);
            self.earliest_lease_end = self
                .in_flight
                .values()
                .map(|c| c.lease_end)
                .min()
                .unwrap_or(now);
        }
        if self.len() < self.capacity {
            return Ok(());
        }
        Err(StoreError::Unavailable(format!(
            "memory store full: {} claims in flight (store.memory_capacity)",
            self.in_flight.len()
        )))
    }
}

impl Live<'_> {
    fn fingerprint(&self) -> &str {
        match self {
            Live::InFlight(c) => &c.fingerprint,
            Live::Completed(c) => &c.fingerprint,
        }
    }

    fn existing(&self, now: Instant) -> Existing {
        match self {
            // Retry-After has a one-second resolution: never tell a sender
            // to come back after zero seconds.
            Live::InFlight(c) => Existing::InFlight {
                retry_after: (c.lease_end - now).max(Duration::from_secs(1)),
            },
            Live::Completed(c) => Existing::Completed(c.snapshot.clone()),
        }
    }
}

impl Backend for MemoryStore {
    async fn claim(&self, key: &ScopedKey, fingerprint: &str, lease: Duration) -> Result<Claim> {
        let now = Instant::now();
        let mut keys = self.lock();
        if let Some(live) = keys.live(key, now) {
            return Ok(Claim::held(
                live.fingerprint(),
                fingerprint,
                live.existing(now),
            ));
        }
        keys.make_room(now)?;
        let token = LeaseToken::generate();
        let lease_end = deadline(now, lease);
        keys.earliest_lease_end = keys.earliest_lease_end.min(lease_end);
        let claim = InFlight {
            fingerprint: fingerprint.to_owned(),
            token: token.clone(),
            lease_end,
        };
        keys.in_flight.insert(key.clone(), claim);
        Ok(Claim::Fresh(token))
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        token: &LeaseToken,
        snapshot: &Snapshot,
        retention: Duration,
    ) -> Result<bool> {
        let now = Instant::now();
        let mut keys = self.lock();
        let Some(claim) = keys.take_owned(key, token, now) else {
            return Ok(false);
        };
        // The key moves from one map to the other: the count is unchanged.
        let done = Completed {
            fingerprint: claim.fingerprint,
            snapshot: snapshot.clone(),
            retained_until: deadline(now, retention),
        };
        keys.completed.put(key.clone(), done);
        Ok(true)
    }

    async fn release(&self, key: &ScopedKey, token: &LeaseToken) -> Result<bool> {
        Ok(self.lock().take_owned(key, token, Instant::now()).is_some())
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<KeyRecord>> {
        let now = Instant::now();
        let mut keys = self.lock();
        Ok(keys.live(key, now).map(|live| KeyRecord {
            fingerprint: live.fingerprint().to_owned(),
            state: live.existing(now),
            expires_in: match live {
                Live::Completed(c) => Some(c.retained_until - now),
                Live::InFlight(_) => None,
            },
        }))
    }

    async fn forget(&self, key: &ScopedKey) -> Result<bool> {
        let mut keys = self.lock();
        let live = keys.live(key, Instant::now()).is_some();
        keys.in_flight.remove(key);
        keys.completed.pop(key);
        Ok(live)
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}

/// `now + ttl`, saturating: a configured retention of centuries must not
/// panic on `Instant` overflow.
fn deadline(now: Instant, ttl: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(ttl.min(CENTURY)).unwrap_or(now)
}
