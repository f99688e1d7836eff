//! How the outbox suite gets each durable backend, and breaks its outbox.

use std::path::PathBuf;
use std::sync::Arc;

use hookgate::store::{PostgresStore, SqliteStore};
use tempfile::TempDir;

use super::OutboxHarness;
use crate::store_conformance::harness::open_postgres;
use crate::support::postgres_server::PostgresServer;

pub struct SqliteOutbox {
    _dir: TempDir,
    path: PathBuf,
    store: Arc<SqliteStore>,
}

impl SqliteOutbox {
    fn sql(&self, sql: &str) {
        let conn = rusqlite::Connection::open(&self.path).expect("open the sqlite file");
        conn.execute_batch(sql).expect(sql);
    }
}

impl OutboxHarness for SqliteOutbox {
    type Store = SqliteStore;

    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("hookgate.db");
        let store = SqliteStore::open(&path).await.expect("open sqlite store");
        Self {
            _dir: dir,
            path,
            store: Arc::new(store),
        }
    }

    fn store(&self) -> Arc<SqliteStore> {
        Arc::clone(&self.store)
    }

    async fn replica(&self) -> Arc<SqliteStore> {
        let store = SqliteStore::open(&self.path).await.expect("open replica");
        Arc::new(store)
    }

    async fn break_outbox(&self) {
        self.sql(
            "CREATE TRIGGER broken BEFORE INSERT ON outbox
             BEGIN SELECT RAISE(ABORT, 'injected'); END;",
        );
    }

    async fn repair_outbox(&self) {
        self.sql("DROP TRIGGER broken");
    }
}

pub struct PostgresOutbox {
    server: PostgresServer,
    store: Arc<PostgresStore>,
}

impl PostgresOutbox {
    async fn sql(&self, sql: &str) {
        let (client, connection) =
            tokio_postgres::connect(&self.server.url(), tokio_postgres::NoTls)
                .await
                .expect("connect to the test server");
        tokio::spawn(connection);
        client.batch_execute(sql).await.expect(sql);
    }
}

impl OutboxHarness for PostgresOutbox {
    type Store = PostgresStore;

    async fn start() -> Self {
        let server = PostgresServer::start();
        let store = open_postgres(&server.url()).await;
        Self {
            server,
            store: Arc::new(store),
        }
    }

    fn store(&self) -> Arc<PostgresStore> {
        Arc::clone(&self.store)
    }

    async fn replica(&self) -> Arc<PostgresStore> {
        Arc::new(open_postgres(&self.server.url()).await)
    }

    async fn break_outbox(&self) {
        self.sql(
            "CREATE FUNCTION hookgate_test_broken() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'injected'; END $$;
             CREATE TRIGGER broken BEFORE INSERT ON hookgate_outbox
                 FOR EACH ROW EXECUTE FUNCTION hookgate_test_broken();",
        )
        .await;
    }

    async fn repair_outbox(&self) {
        self.sql("DROP TRIGGER broken ON hookgate_outbox; DROP FUNCTION hookgate_test_broken();")
            .await;
    }
}
