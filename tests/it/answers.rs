//! The app's status decides (SPEC section 1, finish): a 2xx head means the
//! app did the work, so the key is marked processed even when the answer's
//! body is larger than the gate keeps, larger than it reads, or breaks off.
//! Releasing instead would let the provider's retry run the work again.

use std::time::Duration;

use crate::support::fixture::{Gate, GateFixture, StoreConfig};
use crate::support::gate::{Answer, stripe_event};
use crate::support::raw_upstream::{RawUpstream, Then};
use crate::support::upstream::Behavior;

/// Sends one event twice: the first answer, then the retry's (signed again,
/// later, by the sender).
async fn twice(gate: &Gate, id: &str) -> (Answer, Answer) {
    let body = stripe_event(id);
    (gate.deliver(&body).await, gate.deliver(&body).await)
}

/// Sends one event twice through a gate in front of a raw app that answers
/// `answer` then does `then`: both answers and how many calls the app saw.
async fn twice_to_raw(answer: &'static [u8], then: Then, id: &str) -> (Answer, Answer, usize) {
    let app = RawUpstream::start(answer, then).await;
    let gate = GateFixture::stripe().upstream_url(&app.url()).start().await;
    let (first, retry) = twice(&gate, id).await;
    gate.shutdown().await;
    (first, retry, app.count())
}

/// The app did the work: the first answer was forwarded with `status`, and
/// the retry was answered as a duplicate with the same status.
fn assert_processed(first: &Answer, retry: &Answer, status: u16) {
    assert_eq!(first.status, status);
    assert_eq!(first.result(), "forwarded");
    assert_eq!(retry.status, status);
    assert_eq!(retry.result(), "duplicate");
}

#[tokio::test]
async fn an_answer_over_the_stored_size_is_kept_as_far_as_it_fits() {
    let gate = GateFixture::stripe()
        .store(StoreConfig::sqlite().extra("max_response_bytes = 16"))
        .start()
        .await;
    let up = gate.upstream();
    up.set(Behavior::Large {
        status: 201,
        bytes: 100,
    });
    let (first, retry) = twice(&gate, "evt_large").await;
    assert_processed(&first, &retry, 201);
    assert_eq!(first.body.len(), 100, "the sender gets the whole answer");
    assert_eq!(
        retry.body.as_ref(),
        &b"x".repeat(16)[..],
        "what fits is kept"
    );
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn an_answer_over_the_read_limit_is_still_processed() {
    let gate = GateFixture::stripe().start().await;
    let up = gate.upstream();
    // Over the 8 MiB the gate reads of an answer.
    up.set(Behavior::Large {
        status: 200,
        bytes: 9 * 1024 * 1024,
    });
    let (first, retry) = twice(&gate, "evt_huge").await;
    assert_processed(&first, &retry, 200);
    assert_eq!(first.body.len(), 8 * 1024 * 1024, "cut at the read limit");
    assert_eq!(up.count(), 1, "the retry did not run the work again");
    gate.shutdown().await;
}

#[tokio::test]
async fn a_2xx_whose_body_breaks_off_is_processed() {
    let (first, retry, calls) = twice_to_raw(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 1000\r\n\r\nonly ten b",
        Then::Close,
        "evt_broken",
    )
    .await;
    assert_processed(&first, &retry, 200);
    assert_eq!(first.body.as_ref(), b"only ten b");
    assert_eq!(retry.body.as_ref(), b"only ten b");
    assert_eq!(calls, 1);
}

#[tokio::test]
async fn a_2xx_whose_body_stalls_past_the_timeout_is_processed() {
    // The test gate's upstream timeout is 2 s.
    let (first, retry, calls) = twice_to_raw(
        b"HTTP/1.1 202 Accepted\r\ncontent-length: 50\r\n\r\npartial",
        Then::Stall(Duration::from_secs(5)),
        "evt_stalled",
    )
    .await;
    assert_processed(&first, &retry, 202);
    assert_eq!(first.body.as_ref(), b"partial");
    assert_eq!(calls, 1);
}

#[tokio::test]
async fn a_failure_whose_body_breaks_off_is_released() {
    let (first, retry, calls) = twice_to_raw(
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 100\r\n\r\noops",
        Then::Close,
        "evt_failed",
    )
    .await;
    assert_eq!(first.status, 500);
    assert_eq!(first.result(), "upstream_error");
    assert_eq!(retry.status, 500, "released: the retry reached the app");
    assert_eq!(calls, 2);
}
