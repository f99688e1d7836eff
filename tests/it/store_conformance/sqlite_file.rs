//! Sqlite-only behaviour: durability across restarts, the file's shape, the
//! purge, and clear errors for a bad path or a damaged file.

use std::time::Duration;

use hookgate::store::{
    Backend, BackendSettings, Claim, Existing, SqliteStore, Store, StoreError, StoreSettings,
};

use super::harness::{LONG, completes, fresh, key, snapshot};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remembers_keys_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookgate.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let token = fresh(store.claim(&key("done"), "fp-a", LONG).await.unwrap());
    assert!(completes(&store, &key("done"), &token, &snapshot()).await);
    let held = fresh(store.claim(&key("held"), "fp-b", LONG).await.unwrap());
    drop(store);

    let store = SqliteStore::open(&path).await.unwrap();
    let claim = store.claim(&key("done"), "fp-a", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(snapshot())));
    let claim = store.claim(&key("held"), "fp-b", LONG).await.unwrap();
    assert!(
        matches!(claim, Claim::Existing(Existing::InFlight { .. })),
        "{claim:?}"
    );
    // The holder from before the restart still owns its claim.
    assert!(completes(&store, &key("held"), &held, &snapshot()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_is_wal_with_the_documented_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookgate.db");
    let _store = SqliteStore::open(&path).await.unwrap();

    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let primary_key = texts(
        &path,
        "SELECT name FROM pragma_table_info('processed_events') WHERE pk > 0 ORDER BY pk",
    );
    assert_eq!(primary_key, ["provider", "provider_event_id"]);
}

/// The first column of every row `sql` selects, read from the file itself.
fn texts(path: &std::path::Path, sql: &str) -> Vec<String> {
    rusqlite::Connection::open(path)
        .unwrap()
        .prepare(sql)
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purge_deletes_expired_rows_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookgate.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let short = Duration::from_millis(100);
    fresh(store.claim(&key("lapsed"), "fp", short).await.unwrap());
    let token = fresh(store.claim(&key("retired"), "fp", LONG).await.unwrap());
    assert!(
        store
            .complete(&key("retired"), &token, &snapshot(), short)
            .await
            .unwrap()
    );
    // Claimed before the bulk: a live row at the head of the table is
    // neither purged nor in the way of the rows behind it.
    fresh(store.claim(&key("live"), "fp", LONG).await.unwrap());
    for i in 0..1200 {
        fresh(
            store
                .claim(&key(&format!("bulk_{i}")), "fp", short)
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // More than two batches: the purge loops until none is left.
    assert_eq!(store.purge_expired().await.unwrap(), 1202);
    let ids = texts(&path, "SELECT provider_event_id FROM processed_events");
    assert_eq!(ids, ["live"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("hookgate.db");
    let err = SqliteStore::open(&path)
        .await
        .err()
        .expect("open must fail");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(
        !path.parent().unwrap().exists(),
        "the directory must not be created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn damaged_file_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookgate.db");
    std::fs::write(&path, [0x5a_u8; 4096]).unwrap();
    let err = SqliteStore::open(&path)
        .await
        .err()
        .expect("open must fail");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opens_through_store_settings() {
    let dir = tempfile::tempdir().unwrap();
    let settings = StoreSettings {
        backend: BackendSettings::Sqlite {
            path: dir.path().join("hookgate.db"),
        },
        op_timeout: Duration::from_secs(2),
    };
    let store = Store::open(&settings).await.expect("open");
    assert_eq!(store.backend_name(), "sqlite");
    store.ping().await.unwrap();
    fresh(store.claim(&key("evt_1"), "fp", LONG).await.unwrap());
}

/// A file written before snapshots said whether they were truncated gains
/// the column at open, and its rows read as whole answers; the index on
/// `expires_at` it had goes (the purge reads rows by rowid now), and its
/// live rows, however old their claim, stay through a purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_from_before_the_truncated_column_is_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE processed_events (
                provider TEXT NOT NULL, provider_event_id TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('in_flight', 'completed')),
                lease_token TEXT, fingerprint TEXT NOT NULL, response_status INTEGER,
                response_content_type TEXT, response_body BLOB, lease_expires_at INTEGER,
                expires_at INTEGER NOT NULL, received_at INTEGER NOT NULL,
                PRIMARY KEY (provider, provider_event_id));
             CREATE INDEX processed_events_expires_at ON processed_events (expires_at);
             INSERT INTO processed_events VALUES ('stripe', 'old', 'completed', NULL, 'fp', 200,
                'text/plain', x'6f6b', NULL, 9999999999999, 0);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let indexes = texts(
        &path,
        "SELECT name FROM pragma_index_list('processed_events') WHERE origin = 'c'",
    );
    assert_eq!(indexes, Vec::<String>::new());
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    match store.claim(&key("old"), "fp", LONG).await.unwrap() {
        Claim::Existing(Existing::Completed(s)) => {
            assert_eq!(
                (s.status, s.body.as_ref(), s.truncated),
                (200, &b"ok"[..], false)
            );
        }
        other => panic!("expected the old completed row, got {other:?}"),
    }
    let cut = hookgate::store::Snapshot {
        truncated: true,
        ..snapshot()
    };
    let token = fresh(store.claim(&key("new"), "fp", LONG).await.unwrap());
    assert!(completes(&store, &key("new"), &token, &cut).await);
    drop(store);
    let store = SqliteStore::open(&path).await.unwrap();
    let claim = store.claim(&key("new"), "fp", LONG).await.unwrap();
    assert_eq!(claim, Claim::Existing(Existing::Completed(cut)));
}
