//! `/readyz`'s store check, one ping at a time. Each probe would otherwise
//! run its own: a flood of probes on the admin port would take one of the
//! store's connections each (PostgreSQL's pool is the deliveries' too),
//! queue behind the deliveries on SQLite's thread, and log a line each
//! while the store is away.
//!
//! A probe takes the answer of the ping under way when it arrives, or
//! starts one: never the answer of a ping that had ended before it came, so
//! a store that goes away shows at the next probe. The ping runs in a task
//! of its own, so a probe that gives up (the kubelet's timeout) does not
//! take it from the probes waiting on it. A probe waits at most one
//! `store.timeout`, which bounds every store operation.

use std::future::Future;
use std::sync::{Mutex, PoisonError};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use tokio::task::AbortHandle;

use crate::store::Result;

/// The admin listener's view of the store's readiness (module docs).
#[derive(Default)]
pub struct Readiness {
    /// The last ping started: its answer, shared, and its task, which
    /// tells whether it has ended even when no probe awaited the answer.
    ping: Mutex<Option<(Shared<BoxFuture<'static, bool>>, AbortHandle)>>,
}

impl Readiness {
    /// Whether the store answers: the answer of the ping under way, or of
    /// `ping`, started now.
    pub async fn check<F>(&self, ping: F) -> bool
    where
        F: Future<Output = Result<()>> + Send + 'static,
    {
        let answer = {
            let mut last = self.ping.lock().unwrap_or_else(PoisonError::into_inner);
            match &*last {
                Some((running, task)) if !task.is_finished() => running.clone(),
                _ => last.insert(start(ping)).0.clone(),
            }
        };
        answer.await
    }
}

fn start<F>(ping: F) -> (Shared<BoxFuture<'static, bool>>, AbortHandle)
where
    F: Future<Output = Result<()>> + Send + 'static,
{
    let task = tokio::spawn(async move {
        match ping.await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "not ready: store unavailable");
                false
            }
        }
    });
    let handle = task.abort_handle();
    // A ping that panicked, or a runtime shutting down under it: not ready.
    let answer = task.map(|answer| answer.unwrap_or(false)).boxed().shared();
    (answer, handle)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::Semaphore;

    use super::*;
    use crate::store::StoreError;

    /// Counts the pings; each waits for a permit, then answers `up`.
    struct Store {
        pings: AtomicUsize,
        permits: Semaphore,
        up: AtomicBool,
    }

    impl Store {
        fn new(permits: usize) -> Arc<Self> {
            Arc::new(Self {
                pings: AtomicUsize::new(0),
                permits: Semaphore::new(permits),
                up: AtomicBool::new(true),
            })
        }

        fn ping(self: &Arc<Self>) -> impl Future<Output = Result<()>> + Send + 'static {
            let store = Arc::clone(self);
            async move {
                store.pings.fetch_add(1, Ordering::SeqCst);
                store.permits.acquire().await.expect("open").forget();
                if store.up.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err(StoreError::Unavailable("refused".into()))
                }
            }
        }

        async fn pinged(&self, n: usize) {
            until(
                || self.pings.load(Ordering::SeqCst) >= n,
                "the pings started",
            )
            .await;
        }
    }

    fn probe(readiness: &Arc<Readiness>, store: &Arc<Store>) -> tokio::task::JoinHandle<bool> {
        let (readiness, ping) = (Arc::clone(readiness), store.ping());
        tokio::spawn(async move { readiness.check(ping).await })
    }

    /// A probe whose ping has started, given up on (the kubelet's timeout).
    async fn abandoned_probe(readiness: &Arc<Readiness>, store: &Arc<Store>) {
        let first = probe(readiness, store);
        store.pinged(1).await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
    }

    /// Yields until `done` holds; fails the test after 10 s.
    async fn until(done: impl Fn() -> bool, what: &str) {
        let wait = async {
            while !done() {
                tokio::task::yield_now().await;
            }
        };
        let within = tokio::time::timeout(Duration::from_secs(10), wait).await;
        within.unwrap_or_else(|_| panic!("not within 10 s: {what}"));
    }

    /// Whether the last ping started has ended.
    fn ping_ended(readiness: &Readiness) -> bool {
        let last = readiness.ping.lock().unwrap();
        let (_, task) = last.as_ref().expect("a ping started");
        task.is_finished()
    }

    /// How many probes hold the answer of the last ping started.
    fn holding(readiness: &Readiness) -> usize {
        let last = readiness.ping.lock().unwrap();
        let (answer, _) = last.as_ref().expect("a ping started");
        answer
            .strong_count()
            .expect("the kept clone is never polled")
            - 1
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn probes_that_arrive_during_a_ping_take_its_answer() {
        let (readiness, store) = (Arc::default(), Store::new(0));
        let first = probe(&readiness, &store);
        store.pinged(1).await;
        let waiting: Vec<_> = (0..20).map(|_| probe(&readiness, &store)).collect();
        until(|| holding(&readiness) == 21, "all 21 probes hold the ping").await;
        // The ping under way answers for all of them.
        store.up.store(false, Ordering::SeqCst);
        store.permits.add_permits(100);
        assert!(!first.await.unwrap());
        for probe in waiting {
            assert!(!probe.await.unwrap());
        }
        assert_eq!(store.pings.load(Ordering::SeqCst), 1, "one ping for all");
    }

    #[tokio::test]
    async fn a_probe_after_a_ping_ended_runs_its_own() {
        let (readiness, store) = (Arc::default(), Store::new(10));
        assert!(probe(&readiness, &store).await.unwrap());
        store.up.store(false, Ordering::SeqCst);
        assert!(
            !probe(&readiness, &store).await.unwrap(),
            "not the last answer"
        );
        store.up.store(true, Ordering::SeqCst);
        assert!(probe(&readiness, &store).await.unwrap());
        assert_eq!(store.pings.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_probe_that_gives_up_leaves_its_ping_to_the_others() {
        let (readiness, store) = (Arc::default(), Store::new(0));
        abandoned_probe(&readiness, &store).await;
        let second = probe(&readiness, &store);
        until(|| holding(&readiness) == 1, "the second holds the ping").await;
        store.permits.add_permits(100);
        assert!(second.await.unwrap());
        assert_eq!(
            store.pings.load(Ordering::SeqCst),
            1,
            "the first's ping answered"
        );
    }

    #[tokio::test]
    async fn a_ping_that_ended_unawaited_answers_no_later_probe() {
        let (readiness, store) = (Arc::default(), Store::new(0));
        abandoned_probe(&readiness, &store).await;
        // The ping ends with no probe awaiting its answer.
        store.permits.add_permits(100);
        until(|| ping_ended(&readiness), "the ping ends").await;
        store.up.store(false, Ordering::SeqCst);
        assert!(
            !probe(&readiness, &store).await.unwrap(),
            "not the old answer"
        );
        assert_eq!(store.pings.load(Ordering::SeqCst), 2);
    }
}
