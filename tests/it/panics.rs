//! A defect in the gate (a panic while a delivery holds its claim) is
//! contained: the sender gets 500 `internal_error`, the delivery is counted
//! and logged like any other, and its claim is released so the provider's
//! retry is not held off for a whole lease.

use std::time::Duration;

use hookgate::store::{Backend, ScopedKey};

use crate::support::fixture::GateFixture;
use crate::support::gate::stripe_event;

#[tokio::test]
async fn a_panic_answers_500_is_counted_and_releases_the_claim() {
    let gate = GateFixture::stripe()
        .settings(|s| s.faults.panic_after_claim = true)
        .start()
        .await;

    let answer = gate.deliver(&stripe_event("evt_panic")).await;
    assert_eq!(answer.status, 500);
    assert_eq!(answer.result(), "internal_error");
    assert_eq!(answer.json()["error"], "internal_error");
    assert!(
        !String::from_utf8_lossy(&answer.body).contains("injected"),
        "the sender sees no detail"
    );
    assert_eq!(gate.upstream().count(), 0);

    let text = gate.metrics().await;
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
