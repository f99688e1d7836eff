//! Every spelling of a provider's path gets the provider's verification
//! (SPEC section 1, routing): a web framework behind the gate routes
//! `/webhooks//stripe/` like `/webhooks/stripe`, so a forgery spelled that
//! way must not reach the app through passthrough.

use hookgate::provider::Scheme;
use http::Method;

use crate::support::gate::{
    self, GateConfig, SECRET, post, provider, secret_file, send, signed, stripe_event,
};
use crate::support::upstream::Upstream;

/// Spellings a router treats as `/webhooks/stripe`: each is Stripe's
/// delivery and is verified as one.
const SAME_PATH: [&str; 14] = [
    "/webhooks/stripe/",
    "/webhooks//stripe",
    "//webhooks/stripe",
    "/webhooks/./stripe",
    "/webhooks/x/../stripe",
    "/../webhooks/stripe",
    "/webhooks/%73tripe",
    "/webhooks/%2e/stripe",
    "/Webhooks/Stripe",
    "/WEBHOOKS/STRIPE/",
    "/webhooks/stripe;jsessionid=1",
    "/webhooks;v=1/stripe",
    "/webhooks/stripe/.",
    "/webhooks/stripe/x/..",
];

/// Spellings that reach `/webhooks/stripe` only through an ambiguous
/// decoding: refused, whatever the method.
const AMBIGUOUS: [&str; 8] = [
    "/webhooks%2Fstripe",
    "/webhooks%2fstripe",
    "/webhooks/%2573tripe",
    "/webhooks%5Cstripe",
    "/webhooks/stripe.json",
    "/webhooks/stripe%20",
    "/webhooks/stripe%00",
    "/webhooks/stripe%",
];

async fn stripe_gate(dir: &std::path::Path, up: &Upstream, extra: &str) -> hookgate::Running {
    let mut config = GateConfig::new(&up.url(), dir);
    let secret = secret_file(dir, "stripe", SECRET);
    config.providers = provider("stripe", "stripe", &[secret], extra);
    gate::start(&config).await
}

#[tokio::test]
async fn a_forgery_is_refused_on_every_spelling_of_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate(dir.path(), &up, "").await;
    let body = stripe_event("evt_forged");
    let forged = signed(&Scheme::Stripe, "whsec_not_the_secret", &body, "", None);
    for path in SAME_PATH {
        let answer = post(gate.addr, path, &forged, &body).await;
        assert_eq!(answer.status, 400, "{path}");
        assert_eq!(answer.result(), "invalid_signature", "{path}");
    }
    for path in AMBIGUOUS {
        let answer = post(gate.addr, path, &forged, &body).await;
        assert_eq!(answer.status, 400, "{path}");
        assert_eq!(answer.result(), "bad_path", "{path}");
        assert_eq!(answer.json()["error"], "bad_path", "{path}");
    }
    assert_eq!(
        up.count(),
        0,
        "no forgery reached the app: {:?}",
        up.received()
    );

    // A path no provider can claim is still passed through.
    let other = post(gate.addr, "/webhooks/stripe/events", &forged, &body).await;
    assert_eq!(other.status, 200);
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_genuine_delivery_on_any_spelling_is_one_event() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate(dir.path(), &up, "").await;
    let body = stripe_event("evt_spelled");
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);

    let first = post(gate.addr, "/Webhooks//Stripe/?attempt=1", &headers, &body).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.result(), "forwarded");
    // The app gets the configured path, whatever the spelling.
    assert_eq!(up.received()[0].uri, "/webhooks/stripe?attempt=1");

    for path in SAME_PATH {
        let again = post(gate.addr, path, &headers, &body).await;
        assert_eq!(again.status, 200, "{path}");
        assert_eq!(again.result(), "duplicate", "{path}");
    }
    assert_eq!(up.count(), 1, "forwarded once");
    gate.shutdown().await;
}

#[tokio::test]
async fn other_methods_on_any_spelling_are_the_providers_too() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate(dir.path(), &up, "").await;
    for method in [Method::GET, Method::PUT, Method::DELETE] {
        for path in SAME_PATH {
            let answer = send(gate.addr, method.clone(), path, &[], "").await;
            assert_eq!(answer.status, 405, "{method} {path}");
            assert_eq!(answer.result(), "method_not_allowed", "{method} {path}");
        }
        for path in AMBIGUOUS {
            let answer = send(gate.addr, method.clone(), path, &[], "").await;
            assert_eq!(answer.status, 400, "{method} {path}");
            assert_eq!(answer.result(), "bad_path", "{method} {path}");
        }
    }
    assert_eq!(up.count(), 0);
    gate.shutdown().await;

    // A handshake method the provider lists is passed through on any
    // spelling; POST still is not.
    let up = Upstream::start().await;
    let gate = stripe_gate(dir.path(), &up, "passthrough_methods = [\"GET\"]").await;
    for path in SAME_PATH {
        let answer = send(gate.addr, Method::GET, path, &[], "").await;
        assert_eq!(answer.status, 200, "{path}");
    }
    assert_eq!(up.count(), SAME_PATH.len());
    assert!(up.received().iter().all(|r| r.method == Method::GET));
    gate.shutdown().await;
}

#[tokio::test]
async fn a_case_sensitive_provider_leaves_other_cases_to_the_app() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let gate = stripe_gate(dir.path(), &up, "case_sensitive_path = true").await;
    let body = stripe_event("evt_case");
    let forged = signed(&Scheme::Stripe, "whsec_not_the_secret", &body, "", None);
    let verified = post(gate.addr, "/webhooks//stripe/", &forged, &body).await;
    assert_eq!(verified.result(), "invalid_signature");
    // Another case is another route for a case-sensitive app.
    let other = post(gate.addr, "/Webhooks/Stripe", &forged, &body).await;
    assert_eq!(other.status, 200);
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn without_passthrough_unclaimed_paths_are_unknown_and_ambiguous_ones_bad() {
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.upstream.push_str("passthrough = false\n");
    let secret = secret_file(dir.path(), "stripe", SECRET);
    config.providers = provider("stripe", "stripe", &[secret], "");
    let gate = gate::start(&config).await;
    let unknown = post(gate.addr, "/elsewhere", &[], b"{}").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.result(), "unknown_route");
    let bad = post(gate.addr, "/webhooks%2Fstripe", &[], b"{}").await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.result(), "bad_path");
    assert_eq!(up.count(), 0);
    gate.shutdown().await;
}
