//! Fail closed: with the store down nothing is forwarded; it recovers
//! without a restart when the store is back.

use std::time::Duration;

use hookgate::provider::Scheme;

use crate::support::gate::{
    self, GateConfig, SECRET, post, provider, secret_file, signed, stripe_event,
};
use crate::support::redis_server::RedisServer;
use crate::support::upstream::{Behavior, Upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_503_with_nothing_forwarded_then_recovers() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nlease = \"5s\"\ntimeout = \"500ms\"\n",
        redis.url()
    );
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "s", SECRET)],
        "",
    );
    let gate = gate::start(&config).await;
    let send = |id: &'static str| {
        let body = stripe_event(id);
        let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
        let addr = gate.addr;
        async move { post(addr, "/webhooks/stripe", &headers, &body).await }
    };
    assert_eq!(send("evt_before").await.result(), "forwarded");

    redis.kill();
    let down = send("evt_during").await;
    assert_eq!(down.status, 503);
    assert_eq!(down.json()["error"], "store_unavailable");
    assert!(down.headers.contains_key("retry-after"));
    assert_eq!(up.count(), 1, "nothing forwarded without a claim");

    redis.restart();
    let mut last = String::new();
    for _ in 0..50 {
        let a = send("evt_during").await;
        last = a.result().to_owned();
        if last == "forwarded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last, "forwarded", "recovered without a restart");
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}

/// A gate on an append-only redis-server (lease 10 s) whose app holds
/// each call for `stall`, and one delivery that the app answered 2xx while
/// redis-server was killed under it: the claim is in the append-only file,
/// the mark cannot land and is being retried.
struct PendingMark {
    redis: RedisServer,
    up: Upstream,
    config: GateConfig,
    gate: hookgate::Running,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    _dir: tempfile::TempDir,
}

async fn a_mark_left_pending(event: &str, stall: Duration) -> PendingMark {
    let mut redis = RedisServer::start_with_aof();
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    up.set(Behavior::Stall(stall));
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nlease = \"10s\"\ntimeout = \"300ms\"\n",
        redis.url()
    );
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "s", SECRET)],
        "",
    );
    let gate = gate::start(&config).await;
    let body = stripe_event(event);
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
    let first = {
        let (addr, headers, body) = (gate.addr, headers.clone(), body.clone());
        tokio::spawn(async move { post(addr, "/webhooks/stripe", &headers, &body).await })
    };
    // Kill the store while the app holds the call.
    while up.count() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    redis.kill();
    let answered = first.await.unwrap();
    assert_eq!(answered.result(), "forwarded", "the app did the work");
    PendingMark {
        redis,
        up,
        config,
        gate,
        headers,
        body,
        _dir: dir,
    }
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
        let copy = post(m.gate.addr, "/webhooks/stripe", &m.headers, &m.body).await;
        last = copy.result().to_owned();
        if last == "duplicate" {
            break;
        }
        assert_ne!(last, "forwarded", "processed twice");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last, "duplicate");
    assert_eq!(m.up.count(), 1);
    m.gate.shutdown().await;
}

/// SIGTERM while a mark is being retried: shutdown waits for it within the
/// grace, so the redelivery after the restart is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_mark_being_retried() {
    let PendingMark {
        mut redis,
        up,
        config,
        gate,
        headers,
        body,
        _dir,
    } = a_mark_left_pending("evt_sigterm_mark", Duration::from_millis(300)).await;

    // Shut down with the mark pending; the store is back within the grace.
    let stopping = tokio::spawn(gate.shutdown());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !stopping.is_finished(),
        "shutdown did not wait for the mark"
    );
    redis.restart();
    stopping.await.unwrap();

    let again = gate::start(&config).await;
    let copy = post(again.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(copy.result(), "duplicate");
    assert_eq!(up.count(), 1);
    again.shutdown().await;
}
