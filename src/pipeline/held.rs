//! The claims a running delivery holds, as a guard that cannot be
//! forgotten: the finish stage hands them to the mark or releases them, and
//! a delivery that ends any other way (a panic, a cancelled task) releases
//! them when the guard drops, so the sender's retry is not held off for a
//! whole lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::store::{Backend, LeaseToken, ScopedKey, Store};

/// A claim a delivery holds: the key and the token that owns it.
pub type Held = (ScopedKey, LeaseToken);

/// Every claim held by a running delivery, for shutdown: what is still held
/// once the cores have stopped is released, so the senders' retries get
/// through at once instead of waiting out the lease.
#[derive(Default)]
pub struct Inflight(Mutex<HashMap<LeaseToken, ScopedKey>>);

impl Inflight {
    fn lock(&self) -> MutexGuard<'_, HashMap<LeaseToken, ScopedKey>> {
        // Every update is a single insert or remove: a panic elsewhere
        // cannot leave the map half-written.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No longer tracks `claims`: they were marked or released.
    fn forget(&self, claims: &[Held]) {
        let mut map = self.lock();
        for (_, token) in claims {
            map.remove(token);
        }
    }

    /// Releases every claim still held; returns how many were.
    pub async fn release_all(&self, store: &Store) -> usize {
        let held: Vec<_> = self.lock().drain().collect();
        let mut released = 0;
        for (token, key) in held {
            match store.release(&key, &token).await {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(key = %key, error = %e, "release at shutdown failed"),
            }
        }
        released
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
        let mut map = inflight.lock();
        for (key, token) in &claims {
            map.insert(token.clone(), key.clone());
        }
        drop(map);
        Self {
            store: Arc::clone(store),
            inflight: Arc::clone(inflight),
            claims,
        }
    }

    pub fn claims(&self) -> &[Held] {
        &self.claims
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
