//! Queue mode through the real gate, on sqlite unless a test says otherwise
//! (SPEC section 1b; every backend's outbox is in the conformance suite):
//! the sender gets 202 once the dedupe entry and the job are committed
//! together, the relay delivers with `Hookgate-Attempt`, retries with
//! backoff, dead-letters, and an operator replays.

use std::time::{Duration, Instant};

use hookgate::store::outbox::{JobFilter, JobState, JobSummary, Outbox};
use hookgate::store::{Backend, ScopedKey};

use crate::support::fixture::{Gate, GateFixture, StoreConfig};
use crate::support::gate::stripe_event;
use crate::support::postgres_server::PostgresServer;
use crate::support::redis_server::RedisServer;
use crate::support::upstream::{Behavior, Upstream};
use crate::support::wait::until;

/// Queue mode with quick retries, for tests.
const QUEUE: &str =
    "[queue]\nretry_initial = \"50ms\"\nretry_max = \"200ms\"\nlease = \"5s\"\njitter = 0.0\n";

fn queued() -> GateFixture {
    GateFixture::stripe()
        .provider_extra("mode = \"queue\"")
        .section(QUEUE)
}

/// Reads `read` again (for at most 10 s) until `done` holds for what it
/// returns; returns the last reading, for the caller's assertions.
async fn poll<T, F: Future<Output = T>>(
    mut read: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let value = read().await;
        if done(&value) || Instant::now() > deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The one job in the gate's outbox; fails the test unless there is
/// exactly one.
async fn only_job(gate: &Gate) -> JobSummary {
    let mut jobs = gate
        .gate
        .store
        .jobs(JobFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs.pop().unwrap()
}

/// The only job once the relay has settled its last attempt (at most 10 s):
/// the app has answered before the relay records the answer, so a job read
/// right after the app saw its attempt may still be pending.
async fn settled_job(gate: &Gate) -> JobSummary {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let job = only_job(gate).await;
        if job.state != JobState::Pending || Instant::now() >= deadline {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn accepted_once_delivered_by_the_relay_duplicates_enqueue_nothing() {
    accepted_then_relayed(StoreConfig::sqlite()).await;
}

#[tokio::test]
async fn on_redis_accepted_once_and_delivered_by_the_relay() {
    let server = RedisServer::start();
    accepted_then_relayed(StoreConfig::on(&server)).await;
}

#[tokio::test]
async fn on_postgres_accepted_once_and_delivered_by_the_relay() {
    let server = PostgresServer::start();
    accepted_then_relayed(StoreConfig::on(&server)).await;
}

/// The whole round on one store: accepted, relayed byte for byte with its
/// attempt number, a duplicate answered without a second job.
async fn accepted_then_relayed(store: StoreConfig) {
    let up = Upstream::start().await;
    let gate = queued().store(store).upstream(&up).start().await;
    let body = stripe_event("evt_q1");

    let first = gate.deliver(&body).await;
    assert_eq!(first.status, 202);
    assert_eq!(first.result(), "accepted");
    until("the relay's delivery", || up.count() == 1).await;
    let got = &up.received()[0];
    assert_eq!(got.body.as_ref(), body.as_slice(), "byte for byte");
    assert_eq!(got.headers["hookgate-attempt"], "1");
    assert_eq!(got.headers["hookgate-event-key"], "stripe:evt_q1");
    assert_eq!(got.headers["hookgate-provider"], "stripe");
    assert!(got.headers.contains_key("stripe-signature"));
    assert_eq!(got.uri, "/webhooks/stripe");

    let again = gate.deliver(&body).await;
    assert_eq!(again.status, 202, "the same 2xx");
    assert_eq!(again.result(), "duplicate");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(up.count(), 1, "a duplicate enqueues nothing");

    let job = settled_job(&gate).await;
    assert_eq!(
        (job.state, job.last_status),
        (JobState::Delivered, Some(200))
    );
    gate.shutdown().await;
}

#[tokio::test]
async fn failures_are_retried_with_backoff_until_delivered() {
    let up = Upstream::start().await;
    up.set(Behavior::Status(503));
    let gate = queued().upstream(&up).start().await;
    assert_eq!(gate.deliver(&stripe_event("evt_q2")).await.status, 202);
    until("three failed attempts", || up.count() >= 3).await;
    up.set(Behavior::Status(200));
    until("a delivered attempt", || {
        up.received().iter().any(|r| r.status == 200)
    })
    .await;
    let attempts: Vec<String> = up
        .received()
        .iter()
        .map(|r| r.headers["hookgate-attempt"].to_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (1..=attempts.len()).map(|n| n.to_string()).collect();
    assert_eq!(attempts, expected, "one attempt series, numbered");
    // The sender was never asked to retry: one accept, many attempts.
    assert_eq!(settled_job(&gate).await.state, JobState::Delivered);
    gate.shutdown().await;
}

#[tokio::test]
async fn a_dead_on_status_dead_letters_and_a_replay_delivers() {
    let up = Upstream::start().await;
    up.set(Behavior::Status(410));
    let gate = queued().upstream(&up).start().await;
    assert_eq!(gate.deliver(&stripe_event("evt_q3")).await.status, 202);
    let store = &gate.gate.store;
    let dead = JobFilter {
        state: Some(JobState::Dead),
        ..JobFilter::default()
    };
    let jobs = poll(
        || store.jobs(dead.clone(), 10),
        |j| j.as_ref().is_ok_and(|j| !j.is_empty()),
    )
    .await
    .unwrap();
    assert_eq!(jobs.len(), 1, "dead-lettered");
    assert_eq!(jobs[0].last_status, Some(410));
    assert_eq!(jobs[0].attempts, 1, "410 is not retried");
    assert!(jobs[0].last_error.as_deref().unwrap_or("").contains("410"));
    assert_eq!(up.count(), 1);

    // The app is fixed; the operator replays the dead letter.
    up.set(Behavior::Status(200));
    assert_eq!(store.replay(dead.clone()).await.unwrap(), 1);
    gate.gate.relay_wakeup.notify_one();
    until("the replayed delivery", || up.count() == 2).await;
    assert_eq!(
        up.received()[1].headers["hookgate-attempt"],
        "1",
        "a new series"
    );

    // Counted: one dead attempt, one delivered, one dead letter, the wait.
    let wanted = [
        r#"hookgate_relay_attempts_total{provider="stripe",outcome="dead"} 1"#,
        r#"hookgate_relay_attempts_total{provider="stripe",outcome="delivered"} 1"#,
        r#"hookgate_dead_letters_total{provider="stripe"} 1"#,
        r#"hookgate_accept_to_delivery_seconds_count{provider="stripe"} 1"#,
        r#"hookgate_queue_depth{provider="stripe",state="pending"}"#,
        r#"hookgate_queue_oldest_pending_seconds{provider="stripe"}"#,
    ];
    let text = poll(|| gate.metrics(), |t| wanted.iter().all(|w| t.contains(w))).await;
    let missing: Vec<_> = wanted.iter().filter(|w| !text.contains(*w)).collect();
    assert!(missing.is_empty(), "missing {missing:?} in\n{text}");
    gate.shutdown().await;
}

#[tokio::test]
async fn a_failed_outbox_write_records_nothing_and_answers_503() {
    let up = Upstream::start().await;
    let gate = queued().upstream(&up).start().await;
    // Break the outbox from outside, as a full disk or a bug would.
    let db = rusqlite::Connection::open(gate.fixture().dir().join("gate.db")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER broken BEFORE INSERT ON outbox BEGIN SELECT RAISE(ABORT, 'injected'); END;",
    )
    .unwrap();
    let body = stripe_event("evt_q4");
    let refused = gate.deliver(&body).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.result(), "store_unavailable");
    let key = ScopedKey::new("stripe", "evt_q4");
    assert_eq!(
        gate.gate.store.get(&key).await.unwrap(),
        None,
        "no dedupe entry without its job"
    );

    // Repaired, the provider's retry is accepted and delivered.
    db.execute_batch("DROP TRIGGER broken").unwrap();
    let retry = gate.deliver(&body).await;
    assert_eq!(retry.status, 202);
    assert_eq!(retry.result(), "accepted");
    until("the delivery", || up.count() == 1).await;
    gate.shutdown().await;
}

#[tokio::test]
async fn the_memory_store_refuses_queue_mode() {
    let toml = queued()
        .upstream_url("http://127.0.0.1:9")
        .store(crate::support::fixture::StoreConfig::memory())
        .toml();
    let err = hookgate::config::load(&hookgate::config::figment_from_str(&toml)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("providers.stripe.mode"), "{text}");
    assert!(text.contains("not durable"), "{text}");
}

#[tokio::test]
async fn operators_list_show_replay_and_purge_from_the_command_line() {
    use crate::cli::hookgate;
    let up = Upstream::start().await;
    up.set(Behavior::Status(422));
    let gate = queued().upstream(&up).start().await;
    let config = gate.fixture().config_file();
    assert_eq!(gate.deliver(&stripe_event("evt_cli")).await.status, 202);
    until("the dead-lettering attempt", || up.count() == 1).await;
    let run = |args: &[&str]| {
        let out = hookgate()
            .arg("queue")
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The settle lands just after the attempt: wait for the dead letter.
    let listed = poll(
        || std::future::ready(run(&["list", "--state", "dead"])),
        |l| l.1.contains("stripe:evt_cli"),
    )
    .await;
    assert_eq!(listed.0, Some(0), "{listed:?}");
    assert!(listed.1.contains("dead\tstripe:evt_cli"), "{listed:?}");
    assert!(listed.1.contains("last_status=422"), "{listed:?}");

    let shown = run(&["show", "--provider", "stripe", "EVT_CLI"]);
    assert_eq!(shown.0, Some(0), "{shown:?}");
    assert!(shown.1.contains("stripe:evt_cli"), "{shown:?}");
    assert_eq!(
        run(&["show", "--provider", "stripe", "evt_none"]).0,
        Some(1)
    );
    let unknown = run(&["list", "--provider", "nope"]);
    assert_eq!(unknown.0, Some(64));
    assert!(unknown.2.contains("configured: stripe"), "{unknown:?}");
    assert_eq!(run(&["purge"]).0, Some(64), "purge needs --dead");

    up.set(Behavior::Status(200));
    let replayed = run(&["replay", "--dead", "--provider", "stripe"]);
    assert_eq!(replayed.0, Some(0), "{replayed:?}");
    assert!(replayed.1.contains("1 job(s)"), "{replayed:?}");
    until("the replayed delivery", || up.count() == 2).await;
    let purged = run(&["purge", "--dead"]);
    assert_eq!(purged.0, Some(0));
    assert!(
        purged.1.contains("0 dead job(s)"),
        "delivered, so none left: {purged:?}"
    );
    gate.shutdown().await;
}

#[tokio::test]
async fn the_admin_queue_endpoints_list_and_replay_only_with_the_token() {
    use http::Method;
    let up = Upstream::start().await;
    up.set(Behavior::Status(404));
    let fixture = queued().upstream(&up);
    let token_file = fixture.dir().join("admin-token");
    std::fs::write(&token_file, "adm1n-t0ken-do-not-log").unwrap();
    let gate = fixture
        .server_extra(&format!("admin_token = \"file:{}\"", token_file.display()))
        .start()
        .await;
    assert_eq!(gate.deliver(&stripe_event("evt_adm")).await.status, 202);
    let admin = |method: Method, path: &'static str, auth: Option<&'static str>| {
        let headers: Vec<(String, String)> = auth
            .map(|a| vec![("authorization".to_owned(), a.to_owned())])
            .unwrap_or_default();
        let addr = gate.admin_addr;
        async move { crate::support::gate::send(addr, method, path, &headers, "").await }
    };
    let list = |auth| admin(Method::GET, "/queue?state=dead", auth);
    let listed = poll(
        || list(Some("bearer adm1n-t0ken-do-not-log")),
        |l| l.json()["jobs"].as_array().is_some_and(|j| !j.is_empty()),
    )
    .await;
    assert_eq!(listed.status, 200, "the scheme's name in any case");
    let job = &listed.json()["jobs"][0];
    assert_eq!(job["key"], "evt_adm");
    assert_eq!(job["state"], "dead");
    assert_eq!(job["last_status"], 404);
    for auth in [None, Some("Bearer wrong"), Some("adm1n-t0ken-do-not-log")] {
        let refused = list(auth).await;
        assert_eq!(refused.status, 401, "{auth:?}");
        assert_eq!(refused.headers["www-authenticate"], "Bearer");
        assert!(
            !String::from_utf8_lossy(&refused.body).contains("evt_adm"),
            "no event ids without the token"
        );
    }
    let token = Some("Bearer adm1n-t0ken-do-not-log");
    for path in ["/queue?state=daed", "/queue?state="] {
        let misspelt = admin(Method::GET, path, token).await;
        assert_eq!(
            misspelt.status, 400,
            "{path}: not every job, as if it matched"
        );
        assert_eq!(misspelt.json()["error"], "bad_request");
    }

    let replay = |auth| admin(Method::POST, "/queue/replay?dead=true", auth);
    assert_eq!(replay(None).await.status, 401);
    assert_eq!(replay(Some("Bearer wrong")).await.status, 401);
    let refused = replay(Some("Bearer wrong")).await;
    assert!(
        !String::from_utf8_lossy(&refused.body).contains("adm1n"),
        "no token echoed"
    );
    assert_eq!(up.count(), 1, "nothing replayed without the token");

    up.set(Behavior::Status(200));
    let done = replay(token).await;
    assert_eq!(done.status, 200);
    assert_eq!(done.json()["replayed"], 1);
    until("the replayed delivery", || up.count() == 2).await;

    // Rotated in its file (as a Kubernetes Secret is), the old token stops
    // working without a restart.
    std::fs::write(&token_file, "r0tated-t0ken-do-not-log").unwrap();
    let rotated = poll(|| replay(token), |a| a.status == 401).await;
    assert_eq!(rotated.status, 401, "the old token is revoked");
    assert_eq!(
        replay(Some("Bearer r0tated-t0ken-do-not-log")).await.status,
        200
    );
    // Removed, it grants nothing: an admin credential fails closed.
    std::fs::remove_file(&token_file).unwrap();
    let removed = poll(
        || replay(Some("Bearer r0tated-t0ken-do-not-log")),
        |a| a.status == 401,
    )
    .await;
    assert_eq!(removed.status, 401, "a removed token is revoked");
    gate.shutdown().await;
}

#[tokio::test]
async fn without_an_admin_token_the_queue_endpoints_are_refused() {
    let up = Upstream::start().await;
    let gate = queued().upstream(&up).start().await;
    let any_token = [("authorization".to_owned(), "Bearer anything".to_owned())];
    for (method, path) in [
        (http::Method::GET, "/queue"),
        (http::Method::POST, "/queue/replay?dead=true"),
    ] {
        let answer =
            crate::support::gate::send(gate.admin_addr, method, path, &any_token, "").await;
        assert_eq!(answer.status, 401, "{path}");
    }
    gate.shutdown().await;
}
