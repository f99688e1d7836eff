//! How the outbox suite gets each durable backend, and breaks its outbox.

use std::path::PathBuf;
use std::sync::Arc;

use hookgate::store::{PostgresStore, RedisStore, SqliteStore};
use tempfile::TempDir;

pub use crate::store_conformance::cluster::RedisClusterOutbox;

use super::OutboxHarness;
use crate::store_conformance::harness::{REDIS_OP_TIMEOUT, REDIS_PREFIX, open_postgres};
use crate::support::postgres_server::PostgresServer;
use crate::support::redis_server::RedisServer;

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

/// Redis with `stripe`, the suite's provider, in queue mode: its keys and
/// jobs live in the outbox shards.
pub struct RedisOutbox {
    server: RedisServer,
    store: Arc<RedisStore>,
}

impl RedisOutbox {
    async fn open(url: &str) -> RedisStore {
        RedisStore::open(url, REDIS_PREFIX, REDIS_OP_TIMEOUT)
            .await
            .expect("open redis store")
            .queue_mode(["stripe".to_owned()])
    }

    /// Every shard's due set: making them strings breaks every accept.
    fn due_keys() -> Vec<String> {
        (0..16)
            .map(|n| format!("{REDIS_PREFIX}:{{q{n:02}}}:#due"))
            .collect()
    }

    async fn command(&self, cmd: &redis::Cmd) {
        let client = redis::Client::open(self.server.url()).expect("a redis URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to the test server");
        let _: redis::Value = cmd.query_async(&mut conn).await.expect("a raw command");
    }
}

impl OutboxHarness for RedisOutbox {
    type Store = RedisStore;

    async fn start() -> Self {
        let server = RedisServer::start();
        let store = Self::open(&server.url()).await;
        Self {
            server,
            store: Arc::new(store),
        }
    }

    fn store(&self) -> Arc<RedisStore> {
        Arc::clone(&self.store)
    }

    async fn replica(&self) -> Arc<RedisStore> {
        Arc::new(Self::open(&self.server.url()).await)
    }

    async fn break_outbox(&self) {
        let mut set = redis::cmd("MSET");
        for key in Self::due_keys() {
            set.arg(key).arg("broken");
        }
        self.command(&set).await;
    }

    async fn repair_outbox(&self) {
        self.command(redis::cmd("DEL").arg(Self::due_keys())).await;
    }
}
