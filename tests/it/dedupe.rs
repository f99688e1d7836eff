//! Exactly one upstream call per event: concurrent copies, several gates on
//! one store, restarts, payload mismatches.

use std::time::Duration;

use hookgate::provider::Scheme;
use hookgate::store::{Backend, Existing, ScopedKey};

use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::gate::{SECRET, post, signed, stripe_event};
use crate::support::redis_server::RedisServer;
use crate::support::upstream::{Behavior, Upstream};
use crate::support::wait::until;

/// Sends `copies` copies of one event at once to the given gates (round
/// robin) and checks that exactly one reached the app and every other copy
/// was answered in_flight (409) or duplicate (200).
async fn concurrent_copies(addrs: &[std::net::SocketAddr], up: &Upstream, copies: usize) {
    // A slow app keeps the first claim in flight while the copies arrive.
    up.set(Behavior::Stall(Duration::from_millis(300)));
    let body = stripe_event("evt_concurrent");
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
    let tasks: Vec<_> = (0..copies)
        .map(|i| {
            let (addr, headers, body) = (addrs[i % addrs.len()], headers.clone(), body.clone());
            tokio::spawn(async move { post(addr, "/webhooks/stripe", &headers, &body).await })
        })
        .collect();
    let mut forwarded = 0;
    for task in tasks {
        let answer = task.await.unwrap();
        match answer.result() {
            "forwarded" => forwarded += 1,
            "in_flight" => assert_eq!(answer.status, 409),
            "duplicate" => assert_eq!(answer.status, 200),
            other => panic!("unexpected answer {other}: {answer:?}"),
        }
    }
    assert_eq!(forwarded, 1);
    assert_eq!(up.count(), 1, "exactly one upstream call");
    // Once done, a late copy is a duplicate: once the mark has landed,
    // which a copy to another gate than the one that answered does not
    // wait for (it is answered in_flight meanwhile, and retries).
    let mut late = post(addrs[0], "/webhooks/stripe", &headers, &body).await;
    for _ in 0..50 {
        if late.result() != "in_flight" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        late = post(addrs[0], "/webhooks/stripe", &headers, &body).await;
    }
    assert_eq!(late.result(), "duplicate");
    assert_eq!(up.count(), 1);
}

/// One gate on `store`, fifty copies at once.
async fn fifty_copies_on(store: StoreConfig) {
    let gate = GateFixture::stripe().store(store).start().await;
    concurrent_copies(&[gate.addr], gate.upstream(), 50).await;
    gate.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_copies_make_one_call_on_memory() {
    fifty_copies_on(StoreConfig::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_copies_make_one_call_on_sqlite() {
    fifty_copies_on(StoreConfig::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_copies_make_one_call_on_redis() {
    let redis = RedisServer::start();
    fifty_copies_on(StoreConfig::on(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gates_sharing_one_redis_make_one_call() {
    let redis = RedisServer::start();
    let fixture = GateFixture::stripe().store(StoreConfig::on(&redis));
    let a = fixture.clone().start().await;
    let b = a.fixture().clone().start().await;
    concurrent_copies(&[a.addr, b.addr], a.upstream(), 50).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// The sender is answered as soon as the app has answered, before the key
/// is marked; a redelivery that comes before the mark lands waits for it
/// and is answered as a duplicate, not `in_flight`.
async fn a_redelivery_waits_for_the_mark_on(store: StoreConfig) {
    // The mark held back for long enough to look at the store before it;
    // the store's timeout, which bounds the redelivery's wait, above that.
    let gate = GateFixture::stripe()
        .store(store.timeout("20s"))
        .settings(|s| s.faults.mark_delay = Some(Duration::from_secs(2)))
        .start()
        .await;
    let body = stripe_event("evt_answered_first");
    let first = gate.deliver(&body).await;
    assert_eq!(first.result(), "forwarded", "{first:?}");
    let key = ScopedKey::new("stripe", "evt_answered_first");
    let record = gate.gate.store.get(&key).await.unwrap().expect("claimed");
    assert!(
        matches!(record.state, Existing::InFlight { .. }),
        "answered before the mark: {:?}",
        record.state
    );

    let again = gate.deliver(&body).await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.result(), "duplicate");
    assert_eq!(again.body, first.body);
    let record = gate.gate.store.get(&key).await.unwrap().expect("marked");
    assert!(matches!(record.state, Existing::Completed(_)));
    assert_eq!(gate.upstream().count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_redelivery_waits_for_the_mark_on_sqlite() {
    a_redelivery_waits_for_the_mark_on(StoreConfig::sqlite()).await;
}

#[tokio::test]
async fn a_redelivery_waits_for_the_mark_on_redis() {
    let redis = RedisServer::start();
    a_redelivery_waits_for_the_mark_on(StoreConfig::on(&redis)).await;
}

/// A gate that stops while an answered delivery's mark is still to be
/// made makes it first: the next gate on the store answers the
/// redelivery as a duplicate.
#[tokio::test]
async fn a_mark_still_to_make_at_shutdown_is_made() {
    let first = GateFixture::stripe()
        .settings(|s| s.faults.mark_delay = Some(Duration::from_millis(500)))
        .start()
        .await;
    let body = stripe_event("evt_marked_at_shutdown");
    let answer = first.deliver(&body).await;
    assert_eq!(answer.result(), "forwarded");
    let config = first.fixture().clone();
    first.shutdown().await;

    let second = config.start().await;
    let again = second.deliver(&body).await;
    assert_eq!(again.result(), "duplicate", "{again:?}");
    assert_eq!(second.upstream().count(), 1);
    second.shutdown().await;
}

#[tokio::test]
async fn sqlite_remembers_processed_events_across_a_restart() {
    let body = stripe_event("evt_restart");
    let first = GateFixture::stripe().start().await;
    let a = first.deliver(&body).await;
    assert_eq!(a.result(), "forwarded");
    let config = first.fixture().clone();
    first.shutdown().await;

    let second = config.start().await;
    let b = second.deliver(&body).await;
    assert_eq!(b.result(), "duplicate");
    assert_eq!(b.body, a.body);
    assert_eq!(second.upstream().count(), 1);
    second.shutdown().await;
}

/// A delivery the shutdown's grace cuts off, with the app still working
/// on it, has its claim released as the gate stops: the provider's retry
/// to the next gate on the same store is forwarded, not answered
/// `in_flight` for the rest of the lease.
#[tokio::test]
async fn a_delivery_cut_off_at_shutdown_has_its_claim_released() {
    let first = GateFixture::stripe()
        .upstream_timeout("30s")
        .store(StoreConfig::sqlite().lease("60s"))
        .start()
        .await;
    first
        .upstream()
        .set(Behavior::Stall(Duration::from_secs(30)));
    let body = stripe_event("evt_cut_off");
    let (addr, path, headers) = (first.addr, first.path(), first.sign(&body));
    let sent = {
        let body = body.clone();
        // The gate stops without answering: the client's error is not
        // what is tested.
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(Duration::from_secs(20), post(addr, &path, &headers, &body))
                    .await;
        })
    };
    until("the app to see it", || first.upstream().count() > 0).await;
    let config = first.fixture().clone();
    first.shutdown().await;
    sent.abort();

    let second = config.start().await;
    second.upstream().set(Behavior::Status(200));
    let retry = second.deliver(&body).await;
    assert_eq!(retry.result(), "forwarded", "{retry:?}");
    assert_eq!(second.upstream().count(), 2);
    second.shutdown().await;
}

#[tokio::test]
async fn a_changed_payload_is_422_but_a_reserialized_one_is_a_duplicate() {
    let gate = GateFixture::stripe()
        .add_provider("alerting", Scheme::Stripe)
        .secret(SECRET)
        .provider_extra("on_mismatch = \"alert\"")
        .start()
        .await;
    for path in ["/webhooks/stripe", "/webhooks/alerting"] {
        let original = br#"{"id":"evt_mm","amount":100,"meta":{"a":1,"b":"x"}}"#;
        let reserialized =
            b"{ \"meta\": {\"b\": \"x\", \"a\": 1},\n  \"amount\": 100, \"id\": \"evt_mm\" }";
        let changed = br#"{"id":"evt_mm","amount":999,"meta":{"a":1,"b":"x"}}"#;
        assert_eq!(gate.deliver_to(path, original).await.result(), "forwarded");
        let dup = gate.deliver_to(path, reserialized).await;
        assert_eq!(dup.result(), "duplicate", "{path}");
        let mismatch = gate.deliver_to(path, changed).await;
        if path == "/webhooks/stripe" {
            assert_eq!(mismatch.status, 422);
            assert_eq!(mismatch.json()["error"], "payload_mismatch");
        } else {
            assert_eq!(
                mismatch.result(),
                "duplicate",
                "alert mode treats it as a duplicate"
            );
        }
    }
    assert_eq!(gate.upstream().count(), 2, "one call per provider");
    gate.shutdown().await;
}

#[tokio::test]
async fn github_keys_are_scoped_by_hook_id() {
    let gate = GateFixture::provider("github", Scheme::Github)
        .secret("gh-secret")
        .start()
        .await;
    let body = br#"{"action":"opened"}"#;
    let mut headers = signed(
        &Scheme::Github,
        "gh-secret",
        body,
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        None,
    );
    headers.push(("x-github-hook-id".into(), "1001".into()));
    let path = gate.path();
    assert_eq!(gate.post(&path, &headers, body).await.result(), "forwarded");
    assert_eq!(gate.post(&path, &headers, body).await.result(), "duplicate");
    headers.last_mut().unwrap().1 = "2002".into();
    assert_eq!(gate.post(&path, &headers, body).await.result(), "forwarded");
    assert_eq!(
        gate.upstream().received()[1].headers["hookgate-event-key"],
        "github:2002:72d3162e-cc78-11e3-81ab-4c9367dc0958"
    );
    gate.shutdown().await;
}
