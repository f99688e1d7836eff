//! Slack's three kinds of delivery through the real gate: Events API JSON
//! (keyed on `event_id`, retries are duplicates), slash commands (a form)
//! and interactivity (a form whose `payload` field is JSON). The forms carry
//! no event id and Slack does not retry them: they are verified and reach
//! the app, whose answer Slack shows the user.

use hookgate::provider::Scheme;

use crate::support::fixture::{Gate, GateFixture};

const SLACK_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

fn form_signed(secret: &str, body: &[u8]) -> Vec<(String, String)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut headers = Scheme::Slack.sign(secret.as_bytes(), body, "", now);
    headers.push((
        "content-type".into(),
        "application/x-www-form-urlencoded".into(),
    ));
    headers
}

async fn slack_gate() -> Gate {
    GateFixture::provider("slack", Scheme::Slack)
        .secret(SLACK_SECRET)
        .start()
        .await
}

#[tokio::test]
async fn every_kind_of_slack_delivery_reaches_the_app() {
    let gate = slack_gate().await;
    let path = "/webhooks/slack";
    let up = gate.upstream();

    // A slash command: the official test vector's body shape.
    let command = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    let answer = gate
        .post(path, &form_signed(SLACK_SECRET, command), command)
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.result(), "forwarded");
    assert_eq!(answer.json()["call"], 1, "the app's answer comes back");

    // Interactivity: one `payload` field of JSON, without an event id.
    let interaction = b"payload=%7B%22type%22%3A%22block_actions%22%2C%22trigger_id%22%3A%2213345224609.738474920.8088930838d88f008e0%22%2C%22actions%22%3A%5B%7B%22action_id%22%3A%22approve%22%7D%5D%7D";
    let answer = gate
        .post(path, &form_signed(SLACK_SECRET, interaction), interaction)
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.result(), "forwarded");
    assert_eq!(answer.json()["call"], 2);

    let got = up.received();
    assert_eq!(got[0].body.as_ref(), command.as_slice(), "byte for byte");
    assert_eq!(got[1].body.as_ref(), interaction.as_slice());
    assert!(!got[0].headers.contains_key("hookgate-event-key"));
    assert!(!got[1].headers.contains_key("hookgate-event-key"));

    // Forms are verified like events.
    let forged = gate
        .post(path, &form_signed("guess", command), command)
        .await;
    assert_eq!(forged.result(), "invalid_signature");

    // Events API deliveries are still keyed: the retry is a duplicate.
    let event =
        br#"{"type":"event_callback","event":{"type":"app_mention"},"event_id":"Ev0FORMS1"}"#;
    let first = gate.deliver(event).await;
    assert_eq!(first.result(), "forwarded");
    let retry = gate.deliver(event).await;
    assert_eq!(retry.result(), "duplicate");
    assert_eq!(up.count(), 3);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_body_that_claims_json_and_is_not_is_a_bad_payload() {
    let gate = slack_gate().await;
    let body = b"{\"event_id\": broken";
    let answer = gate.deliver(body).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.result(), "bad_payload");
    assert_eq!(gate.upstream().count(), 0);
    gate.shutdown().await;
}
