//! The whole gate on `store.backend = "postgres"`: deliveries, partition
//! health on `/metrics`, and `hookgate keys`. (Readiness and failing closed
//! while the database is away are the shared fault suite's, in `faults`.)

use std::time::Duration;

use crate::cli::run_ok;
use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::gate::stripe_event;
use crate::support::postgres_server::PostgresServer;
use crate::support::store_server::StoreServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_runs_on_postgres() {
    let pg = PostgresServer::start();
    let store = StoreConfig::on(&pg).timeout(PostgresServer::GATE_TIMEOUT);
    let gate = GateFixture::stripe().store(store).start().await;
    let path = gate.fixture().config_file();
    let body = stripe_event("evt_pg");
    assert_eq!(gate.admin("/readyz").await.status, 200);
    assert_eq!(gate.deliver(&body).await.result(), "forwarded");
    assert_eq!(gate.deliver(&body).await.result(), "duplicate");

    // Partition maintenance reports its health on /metrics.
    let mut text = String::new();
    for _ in 0..30 {
        text = gate.metrics().await;
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

    let shown = run_ok(&path, &["keys", "get", "--provider", "stripe", "evt_PG"]);
    assert!(shown.contains("completed (status 200"), "{shown}");
    let forgot = run_ok(&path, &["keys", "forget", "--provider", "stripe", "evt_pg"]);
    assert!(forgot.contains("forgotten"), "{forgot}");
    assert_eq!(gate.deliver(&body).await.result(), "forwarded");
    assert_eq!(gate.upstream().count(), 2);
    gate.shutdown().await;
}
