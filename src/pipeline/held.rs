//! The claims a running delivery holds, as a guard that cannot be
//! forgotten: the finish stage hands them to the mark or releases them, and
//! a delivery that ends any other way (a panic, a cancelled task) releases
//! them when the guard drops, so the sender's retry is not held off for a
//! whole lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use crate::store::{Backend, LeaseToken, ScopedKey, Store};

/// A claim a delivery holds: the key and the token that owns it.
pub type Held = (ScopedKey, LeaseToken);

/// Every claim held by a running delivery, by its key. For shutdown: what
/// is still held once the cores have stopped is released, so the senders'
/// retries get through at once instead of waiting out the lease. And for a
/// redelivery that comes while its first delivery's mark is still on the
/// way (the sender is answered before the mark: `finish::Settle`): it
/// waits for the mark ([`Inflight::marking`]) and is answered as a
/// duplicate, as the first answer promised, where the store alone would
/// still say the key is in flight.
#[derive(Default)]
pub struct Inflight(Mutex<HashMap<ScopedKey, Holder>>);

/// Who holds a key in this process.
struct Holder {
    token: LeaseToken,
    /// Its sender has the answer; the mark is being made.
    answered: bool,
    /// Redeliveries waiting for that mark, once one waits.
    waiting: Option<Arc<Notify>>,
}

impl Inflight {
    fn lock(&self) -> MutexGuard<'_, HashMap<ScopedKey, Holder>> {
        // Every update is a single insert, change or remove: a panic
        // elsewhere cannot leave the map half-written.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tracks `claims`. A key held already is one whose lease ran out
    /// under its first delivery: the new claim replaces it, since the old
    /// token can neither mark nor release it any more, and whoever waited
    /// for the old one's mark claims again.
    fn hold(&self, claims: &[Held]) {
        let mut map = self.lock();
        let replaced: Vec<_> = claims
            .iter()
            .filter_map(|(key, token)| {
                let holder = Holder {
                    token: token.clone(),
                    answered: false,
                    waiting: None,
                };
                map.insert(key.clone(), holder)
            })
            .collect();
        drop(map);
        wake(replaced);
    }

    /// The senders of `claims` have their answers; the marks follow.
    fn answered(&self, claims: &[Held]) {
        let mut map = self.lock();
        for (key, token) in claims {
            if let Some(holder) = map.get_mut(key).filter(|h| h.token == *token) {
                holder.answered = true;
            }
        }
    }

    /// No longer tracks `claims`: they were marked or released. Whoever
    /// waited for them is woken.
    fn forget(&self, claims: &[Held]) {
        let mut map = self.lock();
        let mut forgotten = Vec::new();
        for (key, token) in claims {
            if map.get(key).is_some_and(|h| h.token == *token) {
                forgotten.extend(map.remove(key));
            }
        }
        drop(map);
        wake(forgotten);
    }

    /// When one of `keys` is held by a delivery of this process that has
    /// answered its sender and is making its mark: a future that resolves
    /// once that mark is made (or given up). `None` otherwise, the usual
    /// case, at the cost of one lookup per key.
    pub fn marking<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k ScopedKey>,
    ) -> Option<OwnedNotified> {
        let mut map = self.lock();
        let key = keys
            .into_iter()
            .find(|key| map.get(*key).is_some_and(|h| h.answered))?;
        let holder = map.get_mut(key)?;
        let waiting = Arc::clone(holder.waiting.get_or_insert_with(Arc::default));
        // Made under the lock: `notify_waiters` wakes every future made
        // before it, polled or not, so the mark cannot land unseen.
        Some(waiting.notified_owned())
    }

    /// Releases every claim still held; returns how many were.
    pub async fn release_all(&self, store: &Store) -> usize {
        let held: Vec<_> = self.lock().drain().collect();
        let mut released = 0;
        for (key, holder) in held {
            wake([&holder]);
            match store.release(&key, &holder.token).await {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(key = %key, error = %e, "release at shutdown failed"),
            }
        }
        released
    }
}

/// Wakes whoever waits for these holders' marks: the marks were made, or
/// will not be made here.
fn wake<H: std::borrow::Borrow<Holder>>(holders: impl IntoIterator<Item = H>) {
    for holder in holders {
        if let Some(waiting) = &holder.borrow().waiting {
            waiting.notify_waiters();
        }
    }
}

/// Claims held by one delivery, tracked in [`Inflight`] while held.
pub struct HeldClaims {
    store: Arc<Store>,
    inflight: Arc<Inflight>,
    claims: Vec<Held>,
}

impl HeldClaims {
    pub fn new(store: &Arc<Store>, inflight: &Arc<Inflight>, claims: Vec<Held>) -> Self {
        inflight.hold(&claims);
        Self {
            store: Arc::clone(store),
            inflight: Arc::clone(inflight),
            claims,
        }
    }

    pub fn claims(&self) -> &[Held] {
        &self.claims
    }

    /// The app took the delivery and its sender is being answered; the
    /// marks follow ([`Inflight::marking`]).
    pub fn answered(&self) {
        self.inflight.answered(&self.claims);
    }

    /// The claims were marked or released: nothing is left to do on drop.
    pub fn settled(mut self) {
        self.inflight.forget(&std::mem::take(&mut self.claims));
    }
}

/// Releases claims so that the sender's retry gets through at once. A
/// failed release is logged: the lease expires on its own.
pub async fn release(store: &Store, held: &[Held]) {
    for (key, token) in held {
        if let Err(e) = store.release(key, token).await {
            tracing::warn!(key = %key, error = %e, "release failed; the lease will expire");
        }
    }
}

impl Drop for HeldClaims {
    /// The claims stay in [`Inflight`] until the release has run: a core's
    /// runtime that drops a delivery as it shuts down never runs a task
    /// spawned on it, and the shutdown releases what is still tracked once
    /// the cores have stopped (`Running::shutdown`).
    fn drop(&mut self) {
        if self.claims.is_empty() {
            return;
        }
        let claims = std::mem::take(&mut self.claims);
        tracing::warn!(
            claims = claims.len(),
            "a delivery ended without finishing; releasing its claims"
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            let inflight = Arc::clone(&self.inflight);
            runtime.spawn(async move {
                release(&store, &claims).await;
                inflight.forget(&claims);
            });
        }
    }
}
