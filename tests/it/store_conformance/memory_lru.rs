//! Memory-only behaviour: the store is bounded. Completed keys are evicted
//! least recently used first; an in-flight claim is never evicted (SPEC
//! section 4): full of them, the store refuses a new key as unavailable.

use hookgate::store::{
    Backend, BackendSettings, Claim, Existing, MemoryStore, Store, StoreError, StoreSettings,
};
use std::time::Duration;

use super::harness::{LONG, assert_in_flight, completes, fresh, key, snapshot};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn evicts_least_recently_used_completed_keys_beyond_capacity() {
    let store = MemoryStore::new(2);
    for id in ["a", "b"] {
        let token = fresh(store.claim(&key(id), "fp", LONG).await.unwrap());
        assert!(completes(&store, &key(id), &token, &snapshot()).await);
    }
    // Touch "a" so that "b" is the least recently used.
    assert!(store.get(&key("a")).await.unwrap().is_some());
    fresh(store.claim(&key("c"), "fp", LONG).await.unwrap());

    assert_eq!(store.get(&key("b")).await.unwrap(), None, "b was evicted");
    assert!(store.get(&key("a")).await.unwrap().is_some());
    assert_in_flight(&store, &key("c")).await;
    // "a" is the only completed key left to evict; "c" stays claimed.
    fresh(store.claim(&key("b"), "fp", LONG).await.unwrap());
    assert_eq!(store.get(&key("a")).await.unwrap(), None, "a was evicted");
    assert_in_flight(&store, &key("c")).await;
}

/// Evicting an in-flight claim would hand out a second `Fresh` claim of
/// its key while the first delivery is still being forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_evicts_an_in_flight_claim() {
    let store = MemoryStore::new(2);
    let a = fresh(store.claim(&key("a"), "fp", LONG).await.unwrap());
    let b = fresh(store.claim(&key("b"), "fp", LONG).await.unwrap());

    let full = store.claim(&key("c"), "fp", LONG).await;
    assert!(
        matches!(full, Err(StoreError::Unavailable(_))),
        "a store full of in-flight claims must refuse a new key, got {full:?}"
    );
    for id in ["a", "b"] {
        assert_in_flight(&store, &key(id)).await;
        let again = store.claim(&key(id), "fp", LONG).await.unwrap();
        assert!(
            matches!(again, Claim::Existing(Existing::InFlight { .. })),
            "{id} was claimed twice: {again:?}"
        );
    }

    // Completing a claim makes its key evictable: room for one more.
    assert!(completes(&store, &key("a"), &a, &snapshot()).await);
    fresh(store.claim(&key("c"), "fp", LONG).await.unwrap());
    assert_eq!(store.get(&key("a")).await.unwrap(), None, "a was evicted");
    assert_in_flight(&store, &key("b")).await;

    // Releasing one does too.
    let full = store.claim(&key("d"), "fp", LONG).await;
    assert!(matches!(full, Err(StoreError::Unavailable(_))), "{full:?}");
    assert!(store.release(&key("b"), &b).await.unwrap());
    fresh(store.claim(&key("d"), "fp", LONG).await.unwrap());
    assert_in_flight(&store, &key("c")).await;
}

/// A claim whose lease ran out holds nothing: it makes room for a new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_claim_makes_room_in_a_full_store() {
    let store = MemoryStore::new(2);
    let short = Duration::from_millis(200);
    fresh(store.claim(&key("a"), "fp", short).await.unwrap());
    fresh(store.claim(&key("b"), "fp", LONG).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;

    fresh(store.claim(&key("c"), "fp", LONG).await.unwrap());
    assert_eq!(store.get(&key("a")).await.unwrap(), None);
    assert_in_flight(&store, &key("b")).await;
    assert_in_flight(&store, &key("c")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opens_through_store_settings() {
    let settings = StoreSettings {
        backend: BackendSettings::Memory { capacity: 100 },
        op_timeout: Duration::from_secs(1),
    };
    let store = Store::open(&settings).await.expect("open");
    assert_eq!(store.backend_name(), "memory");
    let token = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    assert!(completes(&store, &key("evt_1"), &token, &snapshot()).await);
    let claim = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(snapshot())));
}
