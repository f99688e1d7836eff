//! The whole gate on `store.backend = "postgres"`: deliveries, readiness
//! and fail-closed while the database is away, and `hookgate keys`.

use std::process::{Command, Output};
use std::time::Duration;

use hookgate::provider::Scheme;
use http::Method;

use crate::support::gate::{
    self, GateConfig, SECRET, post, provider, secret_file, signed, stripe_event,
};
use crate::support::postgres_server::PostgresServer;
use crate::support::upstream::Upstream;

fn keys(config: &std::path::Path, action: &str, key: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookgate"))
        .args(["keys", action, "--provider", "stripe", key, "--config"])
        .arg(config)
        .output()
        .unwrap()
}

async fn readyz(gate: &hookgate::Running) -> u16 {
    gate::send(gate.admin_addr, Method::GET, "/readyz", &[], "")
        .await
        .status
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_runs_on_postgres_fails_closed_and_recovers() {
    let mut pg = PostgresServer::start();
    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start().await;
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.store = format!(
        "backend = \"postgres\"\nurl = \"{}\"\nlease = \"5s\"\ntimeout = \"1s\"\n",
        pg.url()
    );
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "s", SECRET)],
        "",
    );
    let path = dir.path().join("gate.toml");
    std::fs::write(&path, config.toml()).unwrap();
    let gate = gate::start(&config).await;
    let send = |id: &'static str| {
        let body = stripe_event(id);
        let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
        let addr = gate.addr;
        async move { post(addr, "/webhooks/stripe", &headers, &body).await }
    };
    assert_eq!(readyz(&gate).await, 200);
    assert_eq!(send("evt_pg").await.result(), "forwarded");
    assert_eq!(send("evt_pg").await.result(), "duplicate");

    // Partition maintenance reports its health on /metrics.
    let mut text = String::new();
    for _ in 0..30 {
        let m = gate::send(gate.admin_addr, Method::GET, "/metrics", &[], "").await;
        text = String::from_utf8_lossy(&m.body).into_owned();
        if text.contains("hookgate_postgres_partitions_ahead 3") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        text.contains("hookgate_postgres_partitions_ahead 3"),
        "{text}"
    );
    let last = text
        .lines()
        .find_map(|l| l.strip_prefix("hookgate_postgres_last_maintenance_timestamp_seconds "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(last > 1.7e9, "maintenance ran: {last}");
    assert!(text.contains("hookgate_store_operation_duration_seconds_count{backend=\"postgres\",operation=\"claim\"} 2"), "{text}");

    let get = keys(&path, "get", "evt_PG");
    let shown = String::from_utf8_lossy(&get.stdout);
    assert!(
        get.status.success() && shown.contains("completed (status 200"),
        "{shown}{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let forget = keys(&path, "forget", "evt_pg");
    assert!(
        String::from_utf8_lossy(&forget.stdout).contains("forgotten"),
        "{}",
        String::from_utf8_lossy(&forget.stderr)
    );
    assert_eq!(send("evt_pg").await.result(), "forwarded");
    assert_eq!(up.count(), 2);

    pg.kill();
    assert_eq!(readyz(&gate).await, 503);
    let down = send("evt_pg_during").await;
    assert_eq!(down.status, 503);
    assert_eq!(down.json()["error"], "store_unavailable");
    assert_eq!(up.count(), 2, "nothing forwarded without a claim");

    pg.restart();
    let mut last = String::new();
    for _ in 0..50 {
        last = send("evt_pg_during").await.result().to_owned();
        if last == "forwarded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last, "forwarded", "recovered without a restart");
    assert_eq!(readyz(&gate).await, 200);
    assert_eq!(up.count(), 3);
    gate.shutdown().await;
}
