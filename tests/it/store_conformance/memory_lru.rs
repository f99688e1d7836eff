//! Memory-only behaviour: the store is bounded, least recently used first.

use hookgate::store::{
    Backend, BackendSettings, Claim, Existing, MemoryStore, Store, StoreSettings,
};
use std::time::Duration;

use super::harness::{LONG, RETAIN, fresh, key, snapshot};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn evicts_least_recently_used_beyond_capacity() {
    let store = MemoryStore::new(2);
    fresh(store.claim(&key("a"), "fp", LONG).await.unwrap());
    fresh(store.claim(&key("b"), "fp", LONG).await.unwrap());
    // Touch "a" so that "b" is the least recently used.
    assert!(store.get(&key("a")).await.unwrap().is_some());
    fresh(store.claim(&key("c"), "fp", LONG).await.unwrap());

    assert_eq!(store.get(&key("b")).await.unwrap(), None, "b was evicted");
    assert!(store.get(&key("a")).await.unwrap().is_some());
    assert!(store.get(&key("c")).await.unwrap().is_some());
    fresh(store.claim(&key("b"), "fp", LONG).await.unwrap());
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
    assert!(
        store
            .complete(&key("evt_1"), &token, &snapshot(), RETAIN)
            .await
            .unwrap()
    );
    let claim = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(snapshot())));
}
