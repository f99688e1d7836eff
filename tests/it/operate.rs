//! Operating the gate: metrics, readiness, rate limits, abuse limits,
//! graceful shutdown, `demo` and `keys`.

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use hookgate::provider::Scheme;

use crate::cli::run_ok;
use crate::support::fixture::GateFixture;
use crate::support::gate::{
    SECRET, assert_raw_forwarded, half_sent, post, raw_head, signed, stripe_event,
};
use crate::support::upstream::{Behavior, Upstream};
use crate::support::wait::until;

fn hookgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hookgate"))
}

/// The value of one sample line in a Prometheus text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_count_known_traffic() {
    let gate = GateFixture::stripe().secret("old-secret").start().await;
    for (id, secret) in [
        ("evt_m1", SECRET),
        ("evt_m1", SECRET),
        ("evt_m2", "old-secret"),
        ("evt_m3", "nobody's"),
    ] {
        let body = stripe_event(id);
        let headers = signed(&Scheme::Stripe, secret, &body, "", None);
        gate.post("/webhooks/stripe", &headers, &body).await;
    }

    // The marks follow the answers: the second one may still be on its way.
    let complete = "hookgate_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"complete\"}";
    let mut m = gate.admin("/metrics").await;
    for _ in 0..50 {
        if sample(&String::from_utf8_lossy(&m.body), complete) == Some(2.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        m = gate.admin("/metrics").await;
    }
    assert_eq!(m.status, 200);
    let text = String::from_utf8_lossy(&m.body);
    let count =
        |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
    assert_eq!(
        count("hookgate_deliveries_total{provider=\"stripe\",outcome=\"forwarded\"}"),
        2.0
    );
    assert_eq!(
        count("hookgate_deliveries_total{provider=\"stripe\",outcome=\"duplicate\"}"),
        1.0
    );
    assert_eq!(
        count("hookgate_deliveries_total{provider=\"stripe\",outcome=\"invalid_signature\"}"),
        1.0
    );
    assert_eq!(
        count("hookgate_secret_matches_total{provider=\"stripe\",secret=\"0\"}"),
        2.0
    );
    assert_eq!(
        count("hookgate_secret_matches_total{provider=\"stripe\",secret=\"1\"}"),
        1.0
    );
    assert_eq!(
        count("hookgate_upstream_duration_seconds_count{provider=\"stripe\"}"),
        2.0
    );
    assert_eq!(
        count(
            "hookgate_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"claim\"}"
        ),
        3.0
    );
    assert_eq!(count(complete), 2.0);
    assert_eq!(
        count("hookgate_request_duration_seconds_count{provider=\"stripe\",outcome=\"forwarded\"}"),
        2.0
    );
    assert!(!text.contains(SECRET) && !text.contains("old-secret"));
    assert_eq!(gate.admin("/healthz").await.status, 200);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_burst_gets_429_while_another_provider_is_unaffected() {
    let gate = GateFixture::provider("limited", Scheme::Stripe)
        .secret(SECRET)
        .provider_extra("rate_limit = { per_second = 1, burst = 3 }")
        .add_provider("free", Scheme::Stripe)
        .secret(SECRET)
        .start()
        .await;
    let mut limited = Vec::new();
    for n in 0..6 {
        let body = stripe_event(&format!("evt_burst_{n}"));
        let h = gate.sign(&body);
        limited.push(gate.post("/webhooks/limited", &h, &body).await);
        let free = gate.post("/webhooks/free", &h, &body).await;
        assert_eq!(
            free.result(),
            "forwarded",
            "the other provider is unaffected"
        );
    }
    let refused: Vec<_> = limited.iter().filter(|a| a.status == 429).collect();
    assert!(
        refused.len() >= 2,
        "statuses: {:?}",
        limited.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert_eq!(refused[0].json()["error"], "rate_limited");
    assert!(refused[0].headers.contains_key("retry-after"));
    assert_eq!(limited[0].result(), "forwarded");
    gate.shutdown().await;
}

#[tokio::test]
async fn sources_are_limited_each_on_their_own() {
    let gate = GateFixture::stripe()
        .server_extra("client_ip_header = \"X-Forwarded-For\"")
        .server_extra("per_source_rate_limit = { per_second = 1, burst = 1 }")
        .start()
        .await;
    let send = |n: usize, source: &str| {
        let body = stripe_event(&format!("evt_src_{n}"));
        let mut h = gate.sign(&body);
        h.push(("x-forwarded-for".into(), source.into()));
        let addr = gate.addr;
        async move { post(addr, "/webhooks/stripe", &h, &body).await.status }
    };
    assert_eq!(send(1, "198.51.100.1").await, 200);
    assert_eq!(send(2, "198.51.100.1").await, 429);
    assert_eq!(send(3, "198.51.100.2").await, 200);
    gate.shutdown().await;
}

/// A source over its own rate is refused before it spends the provider's
/// tokens: a flood from one address leaves the provider's bucket to the
/// others.
#[tokio::test]
async fn a_flooding_source_does_not_spend_the_providers_tokens() {
    let gate = GateFixture::stripe()
        .provider_extra("rate_limit = { per_second = 1, burst = 2 }")
        .server_extra("client_ip_header = \"X-Forwarded-For\"")
        .server_extra("per_source_rate_limit = { per_second = 1, burst = 1 }")
        .start()
        .await;
    let send = |n: usize, source: &str| {
        let body = stripe_event(&format!("evt_flood_{n}"));
        let mut h = gate.sign(&body);
        h.push(("x-forwarded-for".into(), source.into()));
        let addr = gate.addr;
        async move { post(addr, "/webhooks/stripe", &h, &body).await.status }
    };
    assert_eq!(send(0, "198.51.100.66").await, 200);
    for n in 1..=5 {
        assert_eq!(send(n, "198.51.100.66").await, 429, "flood {n}");
    }
    // The provider's burst of 2 had one token left for another source.
    assert_eq!(send(6, "198.51.100.7").await, 200);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_slowloris_client_is_cut_off() {
    let gate = GateFixture::stripe()
        .server_extra("read_timeout = \"1s\"")
        .start()
        .await;
    let addr = gate.addr;
    let outcome = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        stream
            .write_all(b"POST /webhooks/stripe HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        let started = Instant::now();
        // Trickle one header byte a second; the gate must not wait forever.
        let mut closed = false;
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(500));
            if stream.write_all(b"X").is_err() {
                closed = true;
                break;
            }
            let mut buf = [0u8; 512];
            stream.set_nonblocking(true).unwrap();
            match stream.read(&mut buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(_) => {
                    closed = true; // an error answer (408) then close
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
            stream.set_nonblocking(false).unwrap();
        }
        (closed, started.elapsed())
    })
    .await
    .unwrap();
    assert!(
        outcome.0,
        "the connection was still open after {:?}",
        outcome.1
    );
    assert_eq!(gate.upstream().count(), 0);
    gate.shutdown().await;
}

#[tokio::test]
async fn keys_forget_lets_the_redelivery_through() {
    let gate = GateFixture::stripe().start().await;
    let path = gate.fixture().config_file();
    let body = stripe_event("evt_Forget");
    assert_eq!(gate.deliver(&body).await.result(), "forwarded");
    assert_eq!(gate.deliver(&body).await.result(), "duplicate");

    let shown = run_ok(
        &path,
        &["keys", "get", "--provider", "stripe", "evt_Forget"],
    );
    assert!(shown.contains("completed (status 200"), "{shown}");
    let forgot = run_ok(
        &path,
        &["keys", "forget", "--provider", "stripe", "evt_forget"],
    );
    assert!(forgot.contains("forgotten"), "{forgot}");

    assert_eq!(gate.deliver(&body).await.result(), "forwarded");
    assert_eq!(gate.upstream().count(), 2);
    gate.shutdown().await;
}

#[test]
fn demo_runs_on_a_bare_machine_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let out = hookgate()
        .arg("demo")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("forwarded")
            && stdout.contains("duplicate")
            && stdout.contains("invalid_signature"),
        "{stdout}"
    );
    assert!(stdout.contains("The app received 1 delivery"), "{stdout}");
}

#[tokio::test]
async fn sigterm_during_a_slow_call_lets_it_finish_and_be_marked() {
    let up = Upstream::start().await;
    up.set(Behavior::Stall(Duration::from_millis(1500)));
    let fixture = GateFixture::stripe().upstream(&up);
    let (child, addr) = crate::cli::Child::spawn(&fixture.config_file());

    let body = stripe_event("evt_sigterm");
    let delivery = tokio::spawn({
        let (h, body) = (
            signed(&Scheme::Stripe, SECRET, &body, "", None),
            body.clone(),
        );
        async move { post(addr, "/webhooks/stripe", &h, &body).await }
    });
    // SIGTERM once the app holds the call.
    until("the call to reach the app", || up.count() > 0).await;
    let (code, _) = tokio::task::spawn_blocking(move || child.stop())
        .await
        .unwrap();
    let answer = delivery.await.unwrap();
    assert_eq!(answer.result(), "forwarded", "the in-flight call completed");
    assert_eq!(code, Some(0));

    // The mark landed: a gate on the same store sees a duplicate.
    up.set(Behavior::Status(200));
    let gate = fixture.start().await;
    assert_eq!(gate.deliver(&body).await.result(), "duplicate");
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_sender_that_hangs_up_in_the_middle_of_the_body_is_counted_and_reaches_nothing() {
    let gate = GateFixture::stripe().start().await;
    let series = r#"hookgate_deliveries_total{provider="stripe",outcome="bad_payload"}"#;
    let body = stripe_event("evt_hangup");
    let (addr, headers) = (gate.addr, gate.sign(&body));
    // The gate is reading the body when the sender hangs up.
    tokio::task::spawn_blocking(move || drop(half_sent(addr, "/webhooks/stripe", &headers, &body)))
        .await
        .unwrap();

    let started = Instant::now();
    let mut counted = None;
    while counted.is_none() && started.elapsed() < Duration::from_secs(5) {
        counted = sample(&gate.metrics().await, series);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counted, Some(1.0), "the delivery is counted");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = gate.metrics().await;
    assert_eq!(sample(&text, series), Some(1.0), "and only once: {text}");
    assert_eq!(gate.upstream().count(), 0);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_sender_that_shuts_its_side_after_the_request_still_gets_the_answer() {
    // A client may end its write side once the request is out (`shutdown`,
    // HTTP/1.1's half-close) and wait for the answer. The gate does not read
    // that end of stream as the sender leaving: the delivery goes through
    // and its answer is written.
    let up = Upstream::start().await;
    up.set(Behavior::Stall(Duration::from_millis(300)));
    let gate = GateFixture::stripe().upstream(&up).start().await;
    let body = stripe_event("evt_half_closed");
    let (addr, headers) = (gate.addr, gate.sign(&body));
    let answer = tokio::task::spawn_blocking(move || {
        let head = raw_head("/webhooks/stripe", "", &headers, body.len());
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&body).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        stream.read_to_end(&mut got).unwrap();
        String::from_utf8_lossy(&got).into_owned()
    })
    .await
    .unwrap();

    assert_raw_forwarded(&answer);
    assert_eq!(up.count(), 1);
    gate.shutdown().await;
}
