//! `/readyz`'s store check, one at a time. Each probe would otherwise run
//! its own ping: a flood of probes on the admin port would take one of the
//! store's connections each (PostgreSQL's pool is the deliveries' too),
//! queue behind the deliveries on SQLite's thread, and log a line each
//! while the store is away.
//!
//! A probe never gets an answer older than itself: it takes the result of
//! a ping that began after it arrived, or runs one. Probes that arrive
//! while a ping runs wait for it, then share the one ping that the first of
//! them runs after it, so a burst costs at most two.

use std::future::Future;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::store::Result;

#[derive(Default)]
pub struct Readiness {
    /// The last ping's start and answer; held while a ping runs.
    last: Mutex<Option<(Instant, bool)>>,
}

impl Readiness {
    /// Whether the store answers, by a ping begun after this call was made.
    pub async fn check<F>(&self, ping: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = Result<()>>,
    {
        let arrived = Instant::now();
        let mut last = self.last.lock().await;
        if let Some((began, ready)) = *last
            && began >= arrived
        {
            return ready;
        }
        let began = Instant::now();
        let ready = match ping().await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "not ready: store unavailable");
                false
            }
        };
        *last = Some((began, ready));
        ready
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::Semaphore;

    use super::*;
    use crate::store::StoreError;

    /// Counts the pings; each waits for a permit, then answers `up`.
    struct Store {
        pings: AtomicUsize,
        permits: Semaphore,
        up: std::sync::atomic::AtomicBool,
    }

    impl Store {
        fn new(up: bool, permits: usize) -> Arc<Self> {
            Arc::new(Self {
                pings: AtomicUsize::new(0),
                permits: Semaphore::new(permits),
                up: up.into(),
            })
        }

        async fn ping(&self) -> Result<()> {
            self.pings.fetch_add(1, Ordering::SeqCst);
            self.permits.acquire().await.expect("open").forget();
            if self.up.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(StoreError::Unavailable("refused".into()))
            }
        }
    }

    #[tokio::test]
    async fn probes_that_arrive_during_a_ping_share_the_next_one() {
        let readiness = Arc::new(Readiness::default());
        let store = Store::new(true, 0);
        let probe = || {
            let (readiness, store) = (Arc::clone(&readiness), Arc::clone(&store));
            tokio::spawn(async move { readiness.check(|| store.ping()).await })
        };
        let first = probe();
        while store.pings.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let waiting: Vec<_> = (0..20).map(|_| probe()).collect();
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(store.pings.load(Ordering::SeqCst), 1, "one ping at a time");
        store.permits.add_permits(100);
        assert!(first.await.unwrap());
        for probe in waiting {
            assert!(probe.await.unwrap());
        }
        assert_eq!(store.pings.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_probe_after_a_ping_runs_its_own() {
        let readiness = Readiness::default();
        let store = Store::new(true, 10);
        assert!(readiness.check(|| store.ping()).await);
        store.up.store(false, Ordering::SeqCst);
        assert!(
            !readiness.check(|| store.ping()).await,
            "not the last answer"
        );
        store.up.store(true, Ordering::SeqCst);
        assert!(readiness.check(|| store.ping()).await);
        assert_eq!(store.pings.load(Ordering::SeqCst), 3);
    }
}
