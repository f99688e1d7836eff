//! Postgres-only behaviour: partitions created ahead and dropped past
//! retention, durability across reopen, the audit trail, a claim racing a
//! completion, URLs and TLS. (Killing and restarting the server is the
//! shared fault suite's, in `faults`.)

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hookgate::store::{Backend, Claim, Existing, PostgresStore};
use tokio::sync::Barrier;

use super::faults::OP_TIMEOUT;
use super::harness::{
    LONG, POSTGRES_OP_TIMEOUT, RETAIN, claim_and_complete, completes, fresh, key, open_postgres,
    snapshot,
};
use crate::support::postgres_server::PostgresServer;

const DAY: Duration = Duration::from_secs(86_400);

/// A plain connection for looking at (and tampering with) the tables.
async fn raw(server: &PostgresServer) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(connection);
    client
}

/// How many rows `table` holds.
async fn row_count(client: &tokio_postgres::Client, table: &str) -> i64 {
    let count = format!("SELECT count(*) FROM {table}");
    client.query_one(&count, &[]).await.unwrap().get(0)
}

/// The partitions of `processed_events`, by name, oldest first.
async fn partitions(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'processed_events'::regclass ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The partition name of the UTC day `offset` days from today.
async fn partition_of_day(client: &tokio_postgres::Client, offset: i32) -> String {
    client
        .query_one(
            "SELECT 'processed_events_p' || to_char(
                 date_trunc('day', now() AT TIME ZONE 'UTC') + make_interval(days => $1),
                 'YYYYMMDD')",
            &[&offset],
        )
        .await
        .unwrap()
        .get(0)
}

/// Creates the partition for the UTC day `offset` days from today by hand.
async fn create_partition(client: &tokio_postgres::Client, offset: i32) -> String {
    let name = partition_of_day(client, offset).await;
    let day = &name["processed_events_p".len()..];
    client
        .batch_execute(&format!(
            "CREATE TABLE {name} PARTITION OF processed_events
             FOR VALUES FROM ('{day} 00:00:00+00') TO (('{day}'::date + 1)::timestamp AT TIME ZONE 'UTC')"
        ))
        .await
        .unwrap();
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn open_creates_partitions_for_today_and_the_days_ahead() {
    let server = PostgresServer::start();
    let store = open_postgres(&server.url()).await;
    let client = raw(&server).await;

    let mut expected = Vec::new();
    for offset in 0..=PostgresStore::DAYS_AHEAD {
        expected.push(partition_of_day(&client, offset).await);
    }
    assert_eq!(partitions(&client).await, expected);

    let health = store.health();
    assert_eq!(health.partitions_ahead, PostgresStore::DAYS_AHEAD as u32);
    let age = health.oldest_partition_age.expect("an oldest partition");
    assert!(age <= DAY, "today's partition is {age:?} old");
    let when = health.last_maintenance.expect("maintained at open");
    assert!(when.elapsed().unwrap_or_default() < Duration::from_secs(60));

    // A second replica opening the same database migrates nothing twice.
    let replica = open_postgres(&server.url()).await;
    replica.run_maintenance().await.unwrap();
    assert_eq!(partitions(&client).await, expected);
    let versions = row_count(&client, "hookgate_schema_migrations").await;
    assert_eq!(versions, 4, "one row per migration, each applied once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn maintenance_drops_partitions_past_retention_and_keeps_the_rest() {
    let server = PostgresServer::start();
    let retention = 2 * DAY;
    let store = PostgresStore::open(&server.url(), POSTGRES_OP_TIMEOUT, retention)
        .await
        .unwrap();
    let client = raw(&server).await;
    let old = create_partition(&client, -10).await;
    let recent = create_partition(&client, -2).await;
    client
        .execute(
            &format!(
                "INSERT INTO {old} (provider, provider_event_id, received_at, completed_at,
                     expires_at, state, lease_token, lease_expires_at, fingerprint,
                     response_status, response_body)
                 SELECT 'stripe', 'evt_old', d, d, d, 'completed', 't', d, 'fp', 200, ''
                 FROM (SELECT (date_trunc('day', now() AT TIME ZONE 'UTC')
                               - interval '10 days') AT TIME ZONE 'UTC' AS d) x"
            ),
            &[],
        )
        .await
        .unwrap();
    assert!(partitions(&client).await.contains(&old));

    let before = SystemTime::now();
    store.run_maintenance().await.unwrap();
    let now = partitions(&client).await;
    assert!(!now.contains(&old), "{old} is past retention: {now:?}");
    assert!(now.contains(&recent), "{recent} is within retention");
    assert!(now.contains(&partition_of_day(&client, 0).await));

    let health = store.health();
    assert!(health.last_maintenance.is_some_and(|t| t >= before));
    let age = health.oldest_partition_age.unwrap();
    assert!(age > 2 * DAY && age <= 3 * DAY, "oldest is {age:?} old");
    assert_eq!(health.partitions_ahead, PostgresStore::DAYS_AHEAD as u32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_partition_is_created_when_a_record_needs_it() {
    let server = PostgresServer::start();
    let store = open_postgres(&server.url()).await;
    let client = raw(&server).await;
    let today = partition_of_day(&client, 0).await;
    client
        .batch_execute(&format!("DROP TABLE {today}"))
        .await
        .unwrap();

    claim_and_complete(&store, &key("evt_1")).await;
    assert!(partitions(&client).await.contains(&today));
    let replay = store.claim(&key("evt_1"), "fp", LONG).await.unwrap();
    assert_eq!(replay, Claim::Existing(Existing::Completed(snapshot())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_survive_a_reopen() {
    let server = PostgresServer::start();
    let store = open_postgres(&server.url()).await;
    claim_and_complete(&store, &key("evt_done")).await;
    let held = fresh(store.claim(&key("evt_held"), "fp", LONG).await.unwrap());
    drop(store);

    let store = open_postgres(&server.url()).await;
    let replay = store.claim(&key("evt_done"), "fp", LONG).await.unwrap();
    assert_eq!(replay, Claim::Existing(Existing::Completed(snapshot())));
    let claim = store.claim(&key("evt_held"), "fp", LONG).await.unwrap();
    assert!(
        matches!(claim, Claim::Existing(Existing::InFlight { .. })),
        "{claim:?}"
    );
    // The holder's token still owns its claim after the reopen.
    assert!(completes(&store, &key("evt_held"), &held, &snapshot()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forget_keeps_the_record_as_an_audit_trail() {
    let server = PostgresServer::start();
    let store = open_postgres(&server.url()).await;
    let first = claim_and_complete(&store, &key("evt_1")).await;
    assert!(store.forget(&key("evt_1")).await.unwrap());
    let second = claim_and_complete(&store, &key("evt_1")).await;

    let client = raw(&server).await;
    let rows = client
        .query(
            "SELECT state, lease_token, response_status FROM processed_events
             WHERE provider = 'stripe' AND provider_event_id = 'evt_1' ORDER BY received_at",
            &[],
        )
        .await
        .unwrap();
    let rows: Vec<(String, String, i32)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        [
            ("forgotten".to_owned(), first.0, 202),
            ("completed".to_owned(), second.0, 202),
        ]
    );
    let claims = row_count(&client, "hookgate_claims").await;
    assert_eq!(claims, 0, "a completed key leaves no claim row behind");
}

/// Claims that arrive while the holder completes see it in flight or
/// completed, never free: a claim that waited on the holder's row looks for
/// the record again before it believes it won.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_racing_a_completion_never_win() {
    const CLAIMS: usize = 20;
    let server = PostgresServer::start();
    let stores = [
        Arc::new(open_postgres(&server.url()).await),
        Arc::new(open_postgres(&server.url()).await),
    ];
    let client = raw(&server).await;
    for round in 0..20 {
        let key = key(&format!("evt_complete_race_{round}"));
        let token = fresh(stores[0].claim(&key, "fp", LONG).await.unwrap());
        let start = Arc::new(Barrier::new(CLAIMS + 1));
        let claims: Vec<_> = (0..CLAIMS)
            .map(|i| {
                let (store, key) = (Arc::clone(&stores[i % 2]), key.clone());
                let start = Arc::clone(&start);
                tokio::spawn(async move {
                    start.wait().await;
                    store.claim(&key, "fp", LONG).await
                })
            })
            .collect();
        start.wait().await;
        assert!(completes(&*stores[1], &key, &token, &snapshot()).await);
        for claim in claims {
            match claim.await.unwrap().unwrap() {
                Claim::Existing(Existing::InFlight { .. } | Existing::Completed(_)) => {}
                other => panic!("round {round}: a claim during completion got {other:?}"),
            }
        }
        // A claim that got in after the holder's row went, and then found
        // the record, took itself back.
        let claims = row_count(&client, "hookgate_claims").await;
        assert_eq!(claims, 0, "round {round}: a claim row outlived the race");
    }
}

/// The client connections to this test's database other than `client`'s
/// own (not autovacuum's workers, which come and go).
async fn connections(client: &tokio_postgres::Client) -> i64 {
    let sql = "SELECT count(*) FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND backend_type = 'client backend'";
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// A fresh claim of `name` made from core 1's thread, on a runtime of its
/// own that ends with the call, as a core's does when the gate stops; the
/// connections `client` sees right after it, while that runtime lives.
fn claim_on_core_one(
    store: &Arc<PostgresStore>,
    client: &Arc<tokio_postgres::Client>,
    name: &'static str,
) -> i64 {
    let (store, client) = (Arc::clone(store), Arc::clone(client));
    std::thread::spawn(move || {
        hookgate::cores::become_core(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            fresh(store.claim(&key(name), "fp", LONG).await.unwrap());
            connections(&client).await
        })
    })
    .join()
    .expect("the claim on core 1")
}

/// A core claims on a pool of its own, whose connections' tasks run on its
/// thread: it makes a connection rather than take the idle one the main
/// runtime made, and when its runtime stops, the main runtime's connections
/// go on serving, and the core's next runtime connects again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_core_claims_on_connections_of_its_own() {
    let server = PostgresServer::start();
    let store = Arc::new(open_postgres(&server.url()).await);
    let client = Arc::new(raw(&server).await);
    fresh(
        store
            .claim(&key("evt_main_first"), "fp", LONG)
            .await
            .unwrap(),
    );
    let before = connections(&client).await;

    let during = claim_on_core_one(&store, &client, "evt_core_first");
    assert_eq!(
        during,
        before + 1,
        "core 1 used a connection of the main runtime"
    );

    fresh(
        store
            .claim(&key("evt_main_again"), "fp", LONG)
            .await
            .unwrap(),
    );
    claim_on_core_one(&store, &client, "evt_core_again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_url_never_shows_the_password() {
    const PASSWORD: &str = "s3cr3t-Pa55word";
    let bad = format!("postgres://postgres:{PASSWORD}@127.0.0.1:notaport/db");
    let err = PostgresStore::open(&bad, OP_TIMEOUT, RETAIN)
        .await
        .err()
        .expect("an invalid URL");
    assert!(!format!("{err} {err:?}").contains(PASSWORD), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_is_used_when_the_url_asks_and_the_certificate_must_verify() {
    let server = PostgresServer::start_tls();
    let root = server.tls_root();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url(),
        root.display()
    );
    let store = open_postgres(&url).await;
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
    // Looked at over a plain connection: the store's are encrypted.
    let encrypted: i64 = raw(&server)
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE s.ssl AND a.datname = 'hookgate'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(encrypted >= 1, "no TLS connection from the store");

    // Without the root, the self-signed certificate is refused.
    let untrusted = format!("{}?sslmode=require", server.url());
    let store = PostgresStore::open(&untrusted, OP_TIMEOUT, RETAIN)
        .await
        .unwrap();
    let err = store.claim(&key("evt_2"), "fp", LONG).await.unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");

    // A root without TLS required is a mistake, not a silent plain connection.
    let plain = format!("{}?sslrootcert={}", server.url(), root.display());
    let err = PostgresStore::open(&plain, OP_TIMEOUT, RETAIN)
        .await
        .err()
        .expect("sslrootcert without sslmode");
    assert!(err.to_string().contains("sslmode"), "{err}");
}
