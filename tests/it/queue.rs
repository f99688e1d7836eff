//! Queue mode through the real gate on the sqlite store (SPEC section 1b):
//! the sender gets 202 once the dedupe entry and the job are committed
//! together, the relay delivers with `Hookgate-Attempt`, retries with
//! backoff, dead-letters, and an operator replays.

use std::time::{Duration, Instant};

use hookgate::store::outbox::{JobFilter, JobState};
use hookgate::store::{Backend, ScopedKey};

use crate::support::fixture::GateFixture;
use crate::support::gate::stripe_event;
use crate::support::upstream::{Behavior, Upstream};

/// Queue mode with quick retries, for tests.
const QUEUE: &str =
    "[queue]\nretry_initial = \"50ms\"\nretry_max = \"200ms\"\nlease = \"5s\"\njitter = 0.0\n";

fn queued() -> GateFixture {
    GateFixture::stripe()
        .provider_extra("mode = \"queue\"")
        .section(QUEUE)
}

/// Waits (at most 10 s) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn accepted_once_delivered_by_the_relay_duplicates_enqueue_nothing() {
    let up = Upstream::start().await;
    let gate = queued().upstream(&up).start().await;
    let body = stripe_event("evt_q1");

    let first = gate.deliver(&body).await;
    assert_eq!(first.status, 202);
    assert_eq!(first.result(), "accepted");
    until("the relay's delivery", || up.count() == 1).await;
    let got = &up.received()[0];
    assert_eq!(got.body.as_ref(), body.as_slice(), "byte for byte");
    assert_eq!(got.headers["hookgate-attempt"], "1");
    assert_eq!(got.headers["hookgate-event-key"], "stripe:evt_q1");
    assert_eq!(got.headers["hookgate-provider"], "stripe");
    assert!(got.headers.contains_key("stripe-signature"));
    assert_eq!(got.uri, "/webhooks/stripe");

    let again = gate.deliver(&body).await;
    assert_eq!(again.status, 202, "the same 2xx");
    assert_eq!(again.result(), "duplicate");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(up.count(), 1, "a duplicate enqueues nothing");

    let jobs = gate
        .gate
        .store
        .jobs(JobFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state, JobState::Delivered);
    assert_eq!(jobs[0].last_status, Some(200));
    gate.shutdown().await;
}

#[tokio::test]
async fn failures_are_retried_with_backoff_until_delivered() {
    let up = Upstream::start().await;
    up.set(Behavior::Status(503));
    let gate = queued().upstream(&up).start().await;
    assert_eq!(gate.deliver(&stripe_event("evt_q2")).await.status, 202);
    until("three failed attempts", || up.count() >= 3).await;
    up.set(Behavior::Status(200));
    until("a delivered attempt", || {
        up.received().iter().any(|r| r.status == 200)
    })
    .await;
    let attempts: Vec<String> = up
        .received()
        .iter()
        .map(|r| r.headers["hookgate-attempt"].to_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (1..=attempts.len()).map(|n| n.to_string()).collect();
    assert_eq!(attempts, expected, "one attempt series, numbered");
    // The sender was never asked to retry: one accept, many attempts.
    let jobs = gate
        .gate
        .store
        .jobs(JobFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state, JobState::Delivered);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_dead_on_status_dead_letters_and_a_replay_delivers() {
    let up = Upstream::start().await;
    up.set(Behavior::Status(410));
    let gate = queued().upstream(&up).start().await;
    assert_eq!(gate.deliver(&stripe_event("evt_q3")).await.status, 202);
    let store = &gate.gate.store;
    let dead = JobFilter {
        state: Some(JobState::Dead),
        ..JobFilter::default()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let jobs = loop {
        let jobs = store.jobs(dead.clone(), 10).await.unwrap();
        if !jobs.is_empty() || Instant::now() > deadline {
            break jobs;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(jobs.len(), 1, "dead-lettered");
    assert_eq!(jobs[0].last_status, Some(410));
    assert_eq!(jobs[0].attempts, 1, "410 is not retried");
    assert!(jobs[0].last_error.as_deref().unwrap_or("").contains("410"));
    assert_eq!(up.count(), 1);

    // The app is fixed; the operator replays the dead letter.
    up.set(Behavior::Status(200));
    assert_eq!(store.replay(dead.clone()).await.unwrap(), 1);
    gate.gate.relay_wakeup.notify_one();
    until("the replayed delivery", || up.count() == 2).await;
    assert_eq!(
        up.received()[1].headers["hookgate-attempt"],
        "1",
        "a new series"
    );
    gate.shutdown().await;
}

#[tokio::test]
async fn a_failed_outbox_write_records_nothing_and_answers_503() {
    let up = Upstream::start().await;
    let gate = queued().upstream(&up).start().await;
    // Break the outbox from outside, as a full disk or a bug would.
    let db = rusqlite::Connection::open(gate.fixture().dir().join("gate.db")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER broken BEFORE INSERT ON outbox BEGIN SELECT RAISE(ABORT, 'injected'); END;",
    )
    .unwrap();
    let body = stripe_event("evt_q4");
    let refused = gate.deliver(&body).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.result(), "store_unavailable");
    let key = ScopedKey::new("stripe", "evt_q4");
    assert_eq!(
        gate.gate.store.get(&key).await.unwrap(),
        None,
        "no dedupe entry without its job"
    );

    // Repaired, the provider's retry is accepted and delivered.
    db.execute_batch("DROP TRIGGER broken").unwrap();
    let retry = gate.deliver(&body).await;
    assert_eq!(retry.status, 202);
    assert_eq!(retry.result(), "accepted");
    until("the delivery", || up.count() == 1).await;
    gate.shutdown().await;
}

#[tokio::test]
async fn a_lease_left_by_a_dead_relay_expires_and_the_job_is_taken_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = hookgate::store::SqliteStore::open(&dir.path().join("q.db"))
        .await
        .unwrap();
    let job = hookgate::store::outbox::NewJob {
        method: "POST".into(),
        target: "/webhooks/stripe".into(),
        headers: "content-type: application/json\r\n".into(),
        body: "{}".into(),
    };
    let policy = hookgate::store::outbox::AcceptPolicy {
        answer: hookgate::store::Snapshot {
            status: 202,
            content_type: None,
            body: bytes::Bytes::new(),
            truncated: false,
        },
        retention: Duration::from_secs(3600),
        reject_mismatch: true,
    };
    let accept = hookgate::store::outbox::Accept {
        key: ScopedKey::new("stripe", "evt_lease"),
        fingerprint: "fp".into(),
        job,
    };
    store.accept(vec![accept], policy).await.unwrap();
    let taken = store
        .take_due(Duration::from_millis(300), 10)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].attempt, 1);
    assert!(
        store
            .take_due(Duration::from_secs(5), 10)
            .await
            .unwrap()
            .is_empty(),
        "leased: nobody else takes it"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = store.take_due(Duration::from_secs(5), 10).await.unwrap();
    assert_eq!(
        again.len(),
        1,
        "the expired lease lets another relay take it"
    );
    assert_eq!(again[0].attempt, 2);
    // The first holder's settle no longer acts.
    let stale = hookgate::store::outbox::Settle::Delivered { status: 200 };
    assert!(
        !store
            .settle(taken[0].id, &taken[0].token, stale.clone())
            .await
            .unwrap()
    );
    assert!(
        store
            .settle(again[0].id, &again[0].token, stale)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn the_memory_store_refuses_queue_mode() {
    let toml = queued()
        .upstream_url("http://127.0.0.1:9")
        .store(crate::support::fixture::StoreConfig::memory())
        .toml();
    let err = hookgate::config::load(&hookgate::config::figment_from_str(&toml)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("providers.stripe.mode"), "{text}");
    assert!(text.contains("not durable"), "{text}");
}
