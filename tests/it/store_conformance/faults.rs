//! The shared fault suite: what happens when the store's server goes away
//! and comes back, under a running store and under a running gate. The
//! same test bodies run against redis-server and PostgreSQL; where the two
//! differ (redis-server without persistence comes back empty, postgres
//! keeps its data), the server says so (`StoreServer::persists`).

use std::time::{Duration, Instant};

use hookgate::store::{Backend, BackendSettings, Claim, Existing, Store, StoreSettings};

use super::harness::{LONG, REDIS_PREFIX, RETAIN, claim_and_complete, fresh, key, snapshot};
use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::gate::stripe_event;
use crate::support::postgres_server::PostgresServer;
use crate::support::redis_server::RedisServer;
use crate::support::store_server::StoreServer;

/// Bound of one store operation in these tests.
pub const OP_TIMEOUT: Duration = Duration::from_millis(500);
const PASSWORD: &str = "s3cr3t-Pa55word";

/// Instantiates every test below for one server, in a module named after it.
macro_rules! faults {
    ($backend:ident, $server:ident) => {
        mod $backend {
            instantiate!(super::$server;
                killed_server_fails_fast_and_restart_heals,
                opens_while_the_server_is_down_and_heals,
                errors_never_show_the_password,
                the_gate_fails_closed_and_recovers,
            );
        }
    };
}

faults!(redis, RedisServer);
faults!(postgres, PostgresServer);

/// What the store-level tests need beyond starting and stopping a server.
pub trait FaultServer: StoreServer {
    /// How long the store may take to heal once the server is back.
    const HEALS_WITHIN: Duration;

    fn backend(url: String) -> BackendSettings;

    /// The store's settings for `url`, with the suite's operation timeout.
    fn settings(url: String) -> StoreSettings {
        StoreSettings {
            backend: Self::backend(url),
            op_timeout: OP_TIMEOUT,
        }
    }

    /// A URL carrying `password` that the server refuses, with the error
    /// checks particular to it.
    fn refusing_url(&self, password: &str) -> String;

    fn check_refusal(_error: &str) {}
}

impl FaultServer for RedisServer {
    const HEALS_WITHIN: Duration = Duration::from_secs(10);

    fn backend(url: String) -> BackendSettings {
        let prefix = REDIS_PREFIX.into();
        let queue = Vec::new();
        let cluster = false;
        BackendSettings::Redis {
            url,
            prefix,
            queue,
            cluster,
        }
    }

    /// The server has no password: AUTH is refused.
    fn refusing_url(&self, password: &str) -> String {
        self.url()
            .replace("redis://", &format!("redis://:{password}@"))
    }
}

impl FaultServer for PostgresServer {
    const HEALS_WITHIN: Duration = Duration::from_secs(15);

    fn backend(url: String) -> BackendSettings {
        let retention = RETAIN;
        BackendSettings::Postgres { url, retention }
    }

    /// Trust auth accepts any password: the database is what is missing.
    fn refusing_url(&self, password: &str) -> String {
        self.url()
            .replace("postgres@", &format!("postgres:{password}@"))
            .replace("/hookgate", "/no_such_database")
    }

    fn check_refusal(error: &str) {
        assert!(error.contains("no_such_database"), "{error}");
    }
}

/// Polls `ping` until it answers; the store must heal without reopening.
pub async fn until_ping_answers<S: FaultServer>(store: &Store) {
    let deadline = Instant::now() + S::HEALS_WITHIN;
    while let Err(error) = store.ping().await {
        assert!(Instant::now() < deadline, "store did not recover: {error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A claim fails, within the operation timeout.
async fn fails_fast<S: FaultServer>(store: &Store, id: &str) {
    let started = Instant::now();
    let result = store.claim(&key(id), "fp", LONG).await;
    assert!(
        result.is_err(),
        "claim succeeded with {} down: {result:?}",
        S::BACKEND
    );
    assert!(started.elapsed() < OP_TIMEOUT + Duration::from_millis(250));
}

async fn killed_server_fails_fast_and_restart_heals<S: FaultServer>() {
    let mut server = S::start();
    let store = Store::open(&S::settings(server.url())).await.unwrap();
    claim_and_complete(&store, &key("evt_1")).await;

    server.kill();
    for _ in 0..3 {
        fails_fast::<S>(&store, "evt_2").await;
        assert!(store.ping().await.is_err());
    }

    server.restart();
    until_ping_answers::<S>(&store).await;
    let again = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    if server.persists() {
        assert_eq!(again, Claim::Existing(Existing::Completed(snapshot())));
    } else {
        // Nothing was persisted, so the restarted server starts empty.
        fresh(again);
    }
    fresh(store.claim(&key("evt_2"), "fp", LONG).await.unwrap());
}

async fn opens_while_the_server_is_down_and_heals<S: FaultServer>() {
    let mut server = S::start();
    server.kill();
    let store = Store::open(&S::settings(server.url()))
        .await
        .expect("open must not need the server");
    assert_eq!(store.backend_name(), S::BACKEND);
    assert!(store.ping().await.is_err());
    fails_fast::<S>(&store, "evt_1").await;

    server.restart();
    until_ping_answers::<S>(&store).await;
    // The schema (if any) was created on the first operation that reached it.
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
}

async fn errors_never_show_the_password<S: FaultServer>() {
    let mut server = S::start();
    let store = Store::open(&S::settings(server.refusing_url(PASSWORD)))
        .await
        .unwrap();
    let err = store.claim(&key("evt_1"), "fp", LONG).await.unwrap_err();
    S::check_refusal(&err.to_string());
    assert!(!format!("{err} {err:?}").contains(PASSWORD), "{err:?}");
    server.kill();
    let err = store.claim(&key("evt_1"), "fp", LONG).await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains(PASSWORD), "{err:?}");
}

/// The whole gate on the server: ready and forwarding; with the server away
/// not ready (but alive) and refusing with 503, nothing forwarded; once it
/// is back, ready and forwarding again without a restart.
async fn the_gate_fails_closed_and_recovers<S: FaultServer>() {
    let mut server = S::start();
    let store = StoreConfig::on(&server).timeout(S::GATE_TIMEOUT);
    let gate = GateFixture::stripe().store(store).start().await;
    let up = gate.upstream();
    let readyz = || async { gate.admin("/readyz").await.status.as_u16() };
    assert_eq!(readyz().await, 200);
    let before = gate.deliver(&stripe_event("evt_before")).await;
    assert_eq!(before.result(), "forwarded");

    server.kill();
    assert_eq!(readyz().await, 503);
    assert_eq!(
        gate.admin("/healthz").await.status,
        200,
        "alive while not ready"
    );
    let down = gate.deliver(&stripe_event("evt_during")).await;
    assert_eq!(down.status, 503);
    assert_eq!(down.json()["error"], "store_unavailable");
    assert!(down.headers.contains_key("retry-after"));
    assert_eq!(up.count(), 1, "nothing forwarded without a claim");

    server.restart();
    // Readiness comes back on its own, before any delivery.
    let mut status = 0;
    for _ in 0..50 {
        status = readyz().await;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(status, 200);
    let mut last = String::new();
    for _ in 0..50 {
        last = gate
            .deliver(&stripe_event("evt_during"))
            .await
            .result()
            .to_owned();
        if last == "forwarded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last, "forwarded", "recovered without a restart");
    assert_eq!(readyz().await, 200);
    assert_eq!(up.count(), 2);
    gate.shutdown().await;
}
