//! Fail closed: with the store down nothing is forwarded; it recovers
//! without a restart when the store is back.

use std::time::Duration;

use hookgate::provider::Scheme;

use crate::support::gate::{
    self, GateConfig, SECRET, post, provider, secret_file, signed, stripe_event,
};
use crate::support::redis_server::RedisServer;
use crate::support::upstream::Upstream;

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
