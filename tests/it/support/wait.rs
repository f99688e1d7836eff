//! Waiting for what the gate does in its own time (a call reaching the
//! app, a job relayed), with a bound, instead of sleeping a fixed time.

use std::time::Duration;

use tokio::time::Instant;

/// Waits (at most 10 s) until `done` holds; `what` names it in the
/// failure.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
