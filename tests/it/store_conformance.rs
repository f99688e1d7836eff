//! The store conformance suite (SPEC section 4): one set of test functions,
//! generic over the backend, run against memory, sqlite, redis and postgres
//! alike. A backend that passes them is interchangeable. Backend-specific
//! behaviour (durability, eviction, partitions) is tested in the submodules;
//! `faults` runs one fault suite against both servers.

/// One test per generic test function `super::$test`, run with `$param`
/// (a harness, a server): what makes a suite run against each backend.
macro_rules! instantiate {
    ($param:ty; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                super::$test::<$param>().await;
            }
        )*
    };
}

mod cluster;
mod faults;
mod harness;
mod memory_lru;
mod outbox;
mod postgres_gate;
mod postgres_store;
mod redis_faults;
mod sqlite_file;

use std::time::Duration;

use bytes::Bytes;
use hookgate::store::{Backend, Claim, Existing, KeyRecord, LeaseToken, ScopedKey, Snapshot};

use self::harness::{
    Harness, LONG, RETAIN, assert_in_flight, completes, fresh, key, race, snapshot,
};

/// Instantiates every generic test below for one backend, in a module named
/// after it, so that each backend runs the very same tests.
macro_rules! conformance {
    ($backend:ident, $harness:ty) => {
        mod $backend {
            use super::harness::*;
            instantiate!($harness;
                claim_fresh_then_in_flight,
                in_flight_with_other_fingerprint_is_mismatch,
                empty_fingerprint_disables_mismatch,
                retry_after_is_at_least_one_second,
                completed_replays_snapshot_byte_exact,
                complete_with_wrong_token_does_nothing,
                release_frees_key_for_a_new_token,
                release_with_stale_token_does_nothing,
                expired_lease_is_taken_over_and_old_token_is_dead,
                expired_lease_cannot_be_completed,
                retention_expiry_makes_key_fresh,
                concurrent_claims_one_instance_one_fresh,
                concurrent_claims_two_replicas_one_fresh,
                get_and_forget,
                ping_answers,
                providers_do_not_collide,
            );
        }
    };
}

conformance!(memory, MemoryHarness);
conformance!(sqlite, SqliteHarness);
conformance!(sqlite_on_a_core, SqliteOnCoreHarness);
conformance!(redis, RedisHarness);
conformance!(postgres, PostgresHarness);
conformance!(redis_cluster, RedisClusterHarness);

async fn claim_fresh_then_in_flight<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    fresh(store.claim(&key("evt_1"), "fp-a", LONG).await.unwrap());

    match store.claim(&key("evt_1"), "fp-a", LONG).await.unwrap() {
        Claim::Existing(Existing::InFlight { retry_after }) => {
            assert!(
                retry_after <= LONG,
                "retry_after {retry_after:?} exceeds the lease"
            );
            assert!(
                retry_after > LONG - Duration::from_secs(5),
                "{retry_after:?}"
            );
        }
        other => panic!("expected in flight, got {other:?}"),
    }
}

async fn in_flight_with_other_fingerprint_is_mismatch<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    fresh(store.claim(&key("evt_1"), "fp-a", LONG).await.unwrap());

    match store.claim(&key("evt_1"), "fp-b", LONG).await.unwrap() {
        Claim::Mismatch {
            stored_fingerprint,
            existing: Existing::InFlight { .. },
        } => assert_eq!(stored_fingerprint, "fp-a"),
        other => panic!("expected a mismatch while in flight, got {other:?}"),
    }
}

async fn empty_fingerprint_disables_mismatch<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    fresh(store.claim(&key("evt_1"), "", LONG).await.unwrap());

    let claim = store.claim(&key("evt_1"), "fp-b", LONG).await.unwrap();
    assert!(
        matches!(claim, Claim::Existing(Existing::InFlight { .. })),
        "{claim:?}"
    );
    let record = store.get(&key("evt_1")).await.unwrap().expect("record");
    assert_eq!(record.fingerprint, "");
}

async fn retry_after_is_at_least_one_second<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    fresh(
        store
            .claim(&key("evt_1"), "fp", Duration::from_millis(800))
            .await
            .unwrap(),
    );

    let claim = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    let expected = Claim::Existing(Existing::InFlight {
        retry_after: Duration::from_secs(1),
    });
    assert_eq!(claim, expected);
}

async fn completed_replays_snapshot_byte_exact<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    let token = fresh(store.claim(&key("evt_1"), "fp-a", LONG).await.unwrap());
    assert!(completes(&*store, &key("evt_1"), &token, &snapshot()).await);

    let replay = store.claim(&key("evt_1"), "fp-a", LONG).await.unwrap();
    assert_eq!(replay, Claim::Existing(Existing::Completed(snapshot())));
    match store.claim(&key("evt_1"), "fp-b", LONG).await.unwrap() {
        Claim::Mismatch {
            stored_fingerprint,
            existing: Existing::Completed(stored),
        } => {
            assert_eq!(stored_fingerprint, "fp-a");
            assert_eq!(stored, snapshot());
        }
        other => panic!("expected a mismatch on a completed key, got {other:?}"),
    }

    // No content type and an empty body survive as such.
    let bare = Snapshot {
        status: 204,
        content_type: None,
        body: Bytes::new(),
        truncated: false,
    };
    let token = fresh(store.claim(&key("evt_2"), "fp", LONG).await.unwrap());
    assert!(completes(&*store, &key("evt_2"), &token, &bare).await);
    let replay = store.claim(&key("evt_2"), "fp", LONG).await.unwrap();
    assert_eq!(replay, Claim::Existing(Existing::Completed(bare)));

    // A body kept only in part says so.
    let cut = Snapshot {
        truncated: true,
        ..snapshot()
    };
    let token = fresh(store.claim(&key("evt_3"), "fp", LONG).await.unwrap());
    assert!(completes(&*store, &key("evt_3"), &token, &cut).await);
    let replay = store.claim(&key("evt_3"), "fp", LONG).await.unwrap();
    assert_eq!(replay, Claim::Existing(Existing::Completed(cut)));
}

async fn complete_with_wrong_token_does_nothing<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    let stranger = LeaseToken::generate();
    assert!(!completes(&*store, &key("missing"), &stranger, &snapshot()).await);

    let token = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    assert!(!completes(&*store, &key("evt_1"), &stranger, &snapshot()).await);
    assert_in_flight(&*store, &key("evt_1")).await;

    assert!(completes(&*store, &key("evt_1"), &token, &snapshot()).await);
    // Once completed, even the owner's token no longer acts.
    let other = Snapshot {
        status: 500,
        ..snapshot()
    };
    assert!(!completes(&*store, &key("evt_1"), &token, &other).await);
    let record = store.get(&key("evt_1")).await.unwrap().expect("record");
    assert_eq!(record.state, Existing::Completed(snapshot()));
}

async fn release_frees_key_for_a_new_token<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    let first = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    assert!(store.release(&key("evt_1"), &first).await.unwrap());
    assert_eq!(store.get(&key("evt_1")).await.unwrap(), None);

    let second = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    assert_ne!(first, second);
}

async fn release_with_stale_token_does_nothing<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    let token = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    assert!(
        !store
            .release(&key("evt_1"), &LeaseToken::generate())
            .await
            .unwrap()
    );
    assert_in_flight(&*store, &key("evt_1")).await;

    // A completed key is not released, even by the token that completed it.
    assert!(completes(&*store, &key("evt_1"), &token, &snapshot()).await);
    assert!(!store.release(&key("evt_1"), &token).await.unwrap());
    let claim = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(snapshot())));
}

async fn expired_lease_is_taken_over_and_old_token_is_dead<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    let lease = Duration::from_millis(200);
    let old = fresh(store.claim(&key("evt_1"), "fp", lease).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;

    let new = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    assert_ne!(old, new);
    assert!(!completes(&*store, &key("evt_1"), &old, &snapshot()).await);
    assert!(!store.release(&key("evt_1"), &old).await.unwrap());
    assert_in_flight(&*store, &key("evt_1")).await;

    assert!(completes(&*store, &key("evt_1"), &new, &snapshot()).await);
}

async fn expired_lease_cannot_be_completed<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    let token = fresh(
        store
            .claim(&key("evt_1"), "fp", Duration::from_millis(200))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;

    // Nobody took over, but the lease is gone: the key reads as free.
    assert_eq!(store.get(&key("evt_1")).await.unwrap(), None);
    assert!(!completes(&*store, &key("evt_1"), &token, &snapshot()).await);
    assert!(!store.release(&key("evt_1"), &token).await.unwrap());
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
}

async fn retention_expiry_makes_key_fresh<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    let token = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    let retention = Duration::from_secs(1);
    assert!(
        store
            .complete(&key("evt_1"), &token, &snapshot(), retention)
            .await
            .unwrap()
    );
    let claim = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(snapshot())));

    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(store.get(&key("evt_1")).await.unwrap(), None);
    let again = fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    assert_ne!(again, token);
}

async fn concurrent_claims_one_instance_one_fresh<H: Harness>() {
    let h = H::start().await;
    race(vec![h.store()]).await;
}

/// Two store instances over one file or server model two gate replicas.
async fn concurrent_claims_two_replicas_one_fresh<H: Harness>() {
    let h = H::start().await;
    race(vec![h.store(), h.replica().await]).await;
}

async fn get_and_forget<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    assert_eq!(store.get(&key("evt_1")).await.unwrap(), None);
    assert!(!store.forget(&key("evt_1")).await.unwrap());

    let token = fresh(store.claim(&key("evt_1"), "fp-a", LONG).await.unwrap());
    let record = store.get(&key("evt_1")).await.unwrap().expect("record");
    assert_eq!(record.fingerprint, "fp-a");
    assert!(
        matches!(record.state, Existing::InFlight { .. }) && record.expires_in.is_none(),
        "{record:?}"
    );

    assert!(completes(&*store, &key("evt_1"), &token, &snapshot()).await);
    let mut record = store.get(&key("evt_1")).await.unwrap().expect("record");
    // When the key is forgotten: the retention, less the moment just spent.
    let left = record.expires_in.take().expect("a completed key's expiry");
    assert!(
        left <= RETAIN && left > RETAIN - Duration::from_secs(60),
        "{left:?}"
    );
    let expected = KeyRecord {
        fingerprint: "fp-a".into(),
        state: Existing::Completed(snapshot()),
        expires_in: None,
    };
    assert_eq!(record, expected);

    // Forget works whatever the state: completed here, in flight below.
    assert!(store.forget(&key("evt_1")).await.unwrap());
    assert_eq!(store.get(&key("evt_1")).await.unwrap(), None);
    assert!(!store.forget(&key("evt_1")).await.unwrap());
    let token = fresh(store.claim(&key("evt_1"), "fp-b", LONG).await.unwrap());
    assert!(store.forget(&key("evt_1")).await.unwrap());
    assert!(!completes(&*store, &key("evt_1"), &token, &snapshot()).await);
}

async fn ping_answers<H: Harness>() {
    let h = H::start().await;
    h.store().ping().await.expect("ping");
}

async fn providers_do_not_collide<H: Harness>() {
    let h = H::start().await;
    let store = h.store();
    let stripe = ScopedKey::new("stripe", "evt_1");
    let github = ScopedKey::new("github", "evt_1");
    let token = fresh(store.claim(&stripe, "fp", LONG).await.unwrap());
    fresh(store.claim(&github, "fp", LONG).await.unwrap());

    assert!(completes(&*store, &stripe, &token, &snapshot()).await);
    assert_in_flight(&*store, &github).await;
    assert!(store.forget(&github).await.unwrap());
    let record = store.get(&stripe).await.unwrap().expect("stripe's record");
    assert_eq!(record.state, Existing::Completed(snapshot()));
}
