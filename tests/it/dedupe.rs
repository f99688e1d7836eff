//! Exactly one upstream call per event: concurrent copies, several gates on
//! one store, restarts, payload mismatches.

use std::path::Path;

use hookgate::provider::Scheme;

use crate::support::gate::{
    self, GateConfig, SECRET, post, provider, secret_file, signed, stripe_event,
};
use crate::support::redis_server::RedisServer;
use crate::support::upstream::{Behavior, Upstream};

fn stripe_config(up: &Upstream, dir: &Path, store: &str) -> GateConfig {
    let mut config = GateConfig::new(&up.url(), dir);
    if !store.is_empty() {
        config.store = store.to_owned();
    }
    config.providers = provider("stripe", "stripe", &[secret_file(dir, "s", SECRET)], "");
    config
}

/// Sends `copies` copies of one event at once to the given gates (round
/// robin) and checks that exactly one reached the app and every other copy
/// was answered in_flight (409) or duplicate (200).
async fn concurrent_copies(addrs: &[std::net::SocketAddr], up: &Upstream, copies: usize) {
    // A slow app keeps the first claim in flight while the copies arrive.
    up.set(Behavior::Stall(std::time::Duration::from_millis(300)));
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
    // Once done, a late copy is a duplicate.
    let late = post(addrs[0], "/webhooks/stripe", &headers, &body).await;
    assert_eq!(late.result(), "duplicate");
    assert_eq!(up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_copies_make_one_call_on_memory() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = gate::start(&stripe_config(
        &up,
        dir.path(),
        "backend = \"memory\"\nlease = \"5s\"\n",
    ))
    .await;
    concurrent_copies(&[gate.addr], &up, 50).await;
    gate.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_copies_make_one_call_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = gate::start(&stripe_config(&up, dir.path(), "")).await;
    concurrent_copies(&[gate.addr], &up, 50).await;
    gate.shutdown().await;
}

fn redis_store(redis: &RedisServer) -> String {
    format!(
        "backend = \"redis\"\nurl = \"{}\"\nlease = \"5s\"\n",
        redis.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_copies_make_one_call_on_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = gate::start(&stripe_config(&up, dir.path(), &redis_store(&redis))).await;
    concurrent_copies(&[gate.addr], &up, 50).await;
    gate.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_gates_sharing_one_redis_make_one_call() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let config = stripe_config(&up, dir.path(), &redis_store(&redis));
    let a = gate::start(&config).await;
    let b = gate::start(&config).await;
    concurrent_copies(&[a.addr, b.addr], &up, 50).await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn sqlite_remembers_processed_events_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let config = stripe_config(&up, dir.path(), "");
    let body = stripe_event("evt_restart");
    let first = gate::start(&config).await;
    let a = post(
        first.addr,
        "/webhooks/stripe",
        &signed(&Scheme::Stripe, SECRET, &body, "", None),
        &body,
    )
    .await;
    assert_eq!(a.result(), "forwarded");
    first.shutdown().await;

    let second = gate::start(&config).await;
    let b = post(
        second.addr,
        "/webhooks/stripe",
        &signed(&Scheme::Stripe, SECRET, &body, "", None),
        &body,
    )
    .await;
    assert_eq!(b.result(), "duplicate");
    assert_eq!(b.body, a.body);
    assert_eq!(up.count(), 1);
    second.shutdown().await;
}

#[tokio::test]
async fn a_changed_payload_is_422_but_a_reserialized_one_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = stripe_config(&up, dir.path(), "");
    let s = secret_file(dir.path(), "s2", SECRET);
    config.providers.push_str(&provider(
        "alerting",
        "stripe",
        &[s],
        "on_mismatch = \"alert\"",
    ));
    let gate = gate::start(&config).await;
    for path in ["/webhooks/stripe", "/webhooks/alerting"] {
        let original = br#"{"id":"evt_mm","amount":100,"meta":{"a":1,"b":"x"}}"#;
        let reserialized =
            b"{ \"meta\": {\"b\": \"x\", \"a\": 1},\n  \"amount\": 100, \"id\": \"evt_mm\" }";
        let changed = br#"{"id":"evt_mm","amount":999,"meta":{"a":1,"b":"x"}}"#;
        let sign = |b: &[u8]| signed(&Scheme::Stripe, SECRET, b, "", None);
        assert_eq!(
            post(gate.addr, path, &sign(original), original)
                .await
                .result(),
            "forwarded"
        );
        let dup = post(gate.addr, path, &sign(reserialized), reserialized).await;
        assert_eq!(dup.result(), "duplicate", "{path}");
        let mismatch = post(gate.addr, path, &sign(changed), changed).await;
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
    assert_eq!(up.count(), 2, "one call per provider");
    gate.shutdown().await;
}

#[tokio::test]
async fn github_keys_are_scoped_by_hook_id() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.providers = provider(
        "github",
        "github",
        &[secret_file(dir.path(), "gh", "gh-secret")],
        "",
    );
    let gate = gate::start(&config).await;
    let body = br#"{"action":"opened"}"#;
    let mut headers = signed(
        &Scheme::Github,
        "gh-secret",
        body,
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        None,
    );
    headers.push(("x-github-hook-id".into(), "1001".into()));
    assert_eq!(
        post(gate.addr, "/webhooks/github", &headers, body)
            .await
            .result(),
        "forwarded"
    );
    assert_eq!(
        post(gate.addr, "/webhooks/github", &headers, body)
            .await
            .result(),
        "duplicate"
    );
    headers.last_mut().unwrap().1 = "2002".into();
    assert_eq!(
        post(gate.addr, "/webhooks/github", &headers, body)
            .await
            .result(),
        "forwarded"
    );
    assert_eq!(
        up.received()[1].headers["hookgate-event-key"],
        "github:2002:72d3162e-cc78-11e3-81ab-4c9367dc0958"
    );
    gate.shutdown().await;
}
