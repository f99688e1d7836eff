//! A mark that cannot land while redis-server is away: retried until it
//! does, within the lease and within the shutdown grace. (Failing closed
//! and recovering is the shared fault suite's, in
//! `store_conformance::faults`, for redis and postgres alike.)

use std::time::Duration;

use crate::support::fixture::{Gate, GateFixture, StoreConfig};
use crate::support::gate::{post, stripe_event};
use crate::support::redis_server::RedisServer;
use crate::support::upstream::Behavior;
use crate::support::wait::until;

/// A gate on an append-only redis-server (lease 10 s) whose app holds
/// each call for `stall`, and one delivery that the app answered 2xx while
/// redis-server was killed under it: the claim is in the append-only file,
/// the mark cannot land and is being retried.
struct PendingMark {
    redis: RedisServer,
    gate: Gate,
    body: Vec<u8>,
}

async fn a_mark_left_pending(event: &str, stall: Duration) -> PendingMark {
    let mut redis = RedisServer::start_with_aof();
    let store = StoreConfig::on(&redis).lease("10s").timeout("300ms");
    let gate = GateFixture::stripe().store(store).start().await;
    let up = gate.upstream();
    up.set(Behavior::Stall(stall));
    let body = stripe_event(event);
    let first = {
        let (addr, headers, body) = (gate.addr, gate.sign(&body), body.clone());
        tokio::spawn(async move { post(addr, "/webhooks/stripe", &headers, &body).await })
    };
    // Kill the store while the app holds the call.
    until("the app to hold the call", || up.count() > 0).await;
    redis.kill();
    let answered = first.await.unwrap();
    assert_eq!(answered.result(), "forwarded", "the app did the work");
    PendingMark { redis, gate, body }
}

/// The app answered 2xx, then the store went down for longer than the old
/// fixed retry schedule (3 s) but less than the lease: the mark is retried
/// until it lands, so a later copy is a duplicate, not a second call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_outlives_a_store_outage_shorter_than_the_lease() {
    let mut m = a_mark_left_pending("evt_outage", Duration::from_millis(500)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    m.redis.restart();

    // The mark lands within the lease; the copy is answered from the store.
    let mut last = String::new();
    for _ in 0..40 {
        let copy = m.gate.deliver(&m.body).await;
        last = copy.result().to_owned();
        if last == "duplicate" {
            break;
        }
        assert_ne!(last, "forwarded", "processed twice");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last, "duplicate");
    assert_eq!(m.gate.upstream().count(), 1);
    m.gate.shutdown().await;
}

/// SIGTERM while a mark is being retried: shutdown waits for it within the
/// grace, so the redelivery after the restart is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_mark_being_retried() {
    let PendingMark {
        mut redis,
        gate,
        body,
    } = a_mark_left_pending("evt_sigterm_mark", Duration::from_millis(300)).await;

    // Shut down with the mark pending; the store is back within the grace.
    let config = gate.fixture().clone();
    let stopping = tokio::spawn(gate.shutdown());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !stopping.is_finished(),
        "shutdown did not wait for the mark"
    );
    redis.restart();
    stopping.await.unwrap();

    let again = config.start().await;
    let copy = again.deliver(&body).await;
    assert_eq!(copy.result(), "duplicate");
    assert_eq!(again.upstream().count(), 1);
    again.shutdown().await;
}
