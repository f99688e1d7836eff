//! A defect in the gate (a panic while a delivery holds its claim) is
//! contained: the sender gets 500 `internal_error`, the delivery is counted
//! and logged like any other, and its claim is released so the provider's
//! retry is not held off for a whole lease.

use std::time::Duration;

use hookgate::provider::Scheme;
use hookgate::store::{Backend, ScopedKey};
use hookgate::{config, start};
use http::Method;

use crate::support::gate::{
    self, GateConfig, SECRET, post, provider, secret_file, signed, stripe_event,
};
use crate::support::upstream::Upstream;

#[tokio::test]
async fn a_panic_answers_500_is_counted_and_releases_the_claim() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    let secret = secret_file(dir.path(), "stripe", SECRET);
    config.providers = provider("stripe", "stripe", &[secret], "");
    let mut settings = config::load(&config::figment_from_str(&config.toml())).unwrap();
    settings.faults.panic_after_claim = true;
    let gate = start(settings).await.unwrap();

    let body = stripe_event("evt_panic");
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
    let answer = post(gate.addr, "/webhooks/stripe", &headers, &body).await;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.result(), "internal_error");
    assert_eq!(answer.json()["error"], "internal_error");
    assert!(
        !String::from_utf8_lossy(&answer.body).contains("injected"),
        "the sender sees no detail"
    );
    assert_eq!(up.count(), 0);

    let metrics = gate::send(gate.admin_addr, Method::GET, "/metrics", &[], "").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(r#"hookgate_deliveries_total{provider="stripe",outcome="internal_error"} 1"#),
        "{text}"
    );

    // The claim is released (in the background, as the delivery unwinds):
    // well before the 5 s lease would have let the retry in.
    let key = ScopedKey::new("stripe", "evt_panic");
    let mut released = false;
    for _ in 0..100 {
        if gate.gate.store.get(&key).await.unwrap().is_none() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "the claim of the panicked delivery was released");
    gate.shutdown().await;
}
