//! Every spelling of a provider's path gets the provider's verification
//! (SPEC section 1, routing): a web framework behind the gate routes
//! `/webhooks//stripe/` like `/webhooks/stripe`, so a forgery spelled that
//! way must not reach the app through passthrough.

use hookgate::provider::Scheme;
use http::Method;

use crate::support::fixture::GateFixture;
use crate::support::gate::{signed, stripe_event};

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
const AMBIGUOUS: [&str; 11] = [
    "/webhooks%2Fstripe",
    "/webhooks%2fstripe",
    "/webhooks/%2573tripe",
    "/webhooks%5Cstripe",
    "/webhooks/stripe.json",
    "/webhooks/stripe%20",
    "/webhooks/stripe%00",
    "/webhooks/stripe%",
    // Rails drops the trailing slash before it reads the format.
    "/webhooks/stripe.json/",
    // Kestrel and the WHATWG parser resolve `..` before merging slashes.
    "/webhooks//../stripe",
    // IIS decodes `%u` escapes.
    "/webhooks/%u0073tripe",
];

#[tokio::test]
async fn a_forgery_is_refused_on_every_spelling_of_the_path() {
    let gate = GateFixture::stripe().start().await;
    let up = gate.upstream();
    let body = stripe_event("evt_forged");
    let forged = signed(&Scheme::Stripe, "whsec_not_the_secret", &body, "", None);
    for path in SAME_PATH {
        let answer = gate.post(path, &forged, &body).await;
        assert_eq!(answer.status, 400, "{path}");
        assert_eq!(answer.result(), "invalid_signature", "{path}");
    }
    for path in AMBIGUOUS {
        let answer = gate.post(path, &forged, &body).await;
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
    let other = gate.post("/webhooks/stripe/events", &forged, &body).await;
    assert_eq!(other.status, 200);
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_genuine_delivery_on_any_spelling_is_one_event() {
    let gate = GateFixture::stripe().start().await;
    let up = gate.upstream();
    let body = stripe_event("evt_spelled");
    let headers = gate.sign(&body);

    let first = gate
        .post("/Webhooks//Stripe/?attempt=1", &headers, &body)
        .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.result(), "forwarded");
    // The app gets the configured path, whatever the spelling.
    assert_eq!(up.received()[0].uri, "/webhooks/stripe?attempt=1");

    for path in SAME_PATH {
        let again = gate.post(path, &headers, &body).await;
        assert_eq!(again.status, 200, "{path}");
        assert_eq!(again.result(), "duplicate", "{path}");
    }
    assert_eq!(up.count(), 1, "forwarded once");
    gate.shutdown().await;
}

#[tokio::test]
async fn other_methods_on_any_spelling_are_the_providers_too() {
    let gate = GateFixture::stripe().start().await;
    for method in [Method::GET, Method::PUT, Method::DELETE] {
        for path in SAME_PATH {
            let answer = gate.send(method.clone(), path, &[], "").await;
            assert_eq!(answer.status, 405, "{method} {path}");
            assert_eq!(answer.result(), "method_not_allowed", "{method} {path}");
        }
        for path in AMBIGUOUS {
            let answer = gate.send(method.clone(), path, &[], "").await;
            assert_eq!(answer.status, 400, "{method} {path}");
            assert_eq!(answer.result(), "bad_path", "{method} {path}");
        }
    }
    assert_eq!(gate.upstream().count(), 0);
    gate.shutdown().await;

    // A handshake method the provider lists is passed through on any
    // spelling; POST still is not.
    let gate = GateFixture::stripe()
        .provider_extra("passthrough_methods = [\"GET\"]")
        .start()
        .await;
    let up = gate.upstream();
    for path in SAME_PATH {
        let answer = gate.send(Method::GET, path, &[], "").await;
        assert_eq!(answer.status, 200, "{path}");
    }
    assert_eq!(up.count(), SAME_PATH.len());
    assert!(up.received().iter().all(|r| r.method == Method::GET));
    gate.shutdown().await;
}

#[tokio::test]
async fn a_case_sensitive_provider_leaves_other_cases_to_the_app() {
    let gate = GateFixture::stripe()
        .provider_extra("case_sensitive_path = true")
        .start()
        .await;
    let up = gate.upstream();
    let body = stripe_event("evt_case");
    let forged = signed(&Scheme::Stripe, "whsec_not_the_secret", &body, "", None);
    let verified = gate.post("/webhooks//stripe/", &forged, &body).await;
    assert_eq!(verified.result(), "invalid_signature");
    // Another case is another route for a case-sensitive app.
    let other = gate.post("/Webhooks/Stripe", &forged, &body).await;
    assert_eq!(other.status, 200);
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn without_passthrough_unclaimed_paths_are_unknown_and_ambiguous_ones_bad() {
    let gate = GateFixture::stripe()
        .upstream_extra("passthrough = false")
        .start()
        .await;
    let unknown = gate.post("/elsewhere", &[], b"{}").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.result(), "unknown_route");
    let bad = gate.post("/webhooks%2Fstripe", &[], b"{}").await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.result(), "bad_path");
    assert_eq!(gate.upstream().count(), 0);
    gate.shutdown().await;
}

/// What the app is sent for a passed-through path is the upstream's base
/// path and the request's path: no spelling may reach the path the app is
/// sent a provider's deliveries on, `upstream_path` included.
#[tokio::test]
async fn passthrough_cannot_reach_the_apps_delivery_path() {
    let up = crate::support::upstream::Upstream::start().await;
    let gate = GateFixture::stripe()
        .upstream_url(&format!("{}/api", up.url()))
        .add_provider("github", Scheme::Github)
        .secret("github_secret_do_not_log")
        .provider_extra("upstream_path = \"/internal/github\"")
        .start()
        .await;
    let body = stripe_event("evt_climbing");
    let forged = signed(&Scheme::Stripe, "whsec_not_the_secret", &body, "", None);
    // The app gets Stripe's deliveries on /api/webhooks/stripe and
    // GitHub's on /api/internal/github.
    for path in [
        "/../api/webhooks/stripe",
        "/%2e%2e/api/webhooks/stripe",
        "/x/../../api/webhooks/stripe/",
        "/internal/github",
        "/Internal//GitHub/",
    ] {
        let answer = gate.post(path, &forged, &body).await;
        assert_eq!(answer.status, 400, "{path}");
        assert_eq!(answer.result(), "bad_path", "{path}");
    }
    assert_eq!(
        up.count(),
        0,
        "nothing reached the app: {:?}",
        up.received()
    );

    let genuine = gate.sign(&body);
    let a = gate.post("/webhooks/stripe", &genuine, &body).await;
    assert_eq!(a.result(), "forwarded");
    assert_eq!(up.received()[0].uri, "/api/webhooks/stripe");
    // Other paths still pass through, under the base path.
    let other = gate.post("/health", &[], b"").await;
    assert_eq!(other.status, 200);
    assert_eq!(up.received()[1].uri, "/api/health");
    gate.shutdown().await;
}
