//! How the outbox suite gets each durable backend, and breaks its outbox.
//! Sqlite and postgres reuse the dedupe suite's harnesses; redis opens its
//! store with `stripe`, the suite's provider, in queue mode.

use std::sync::Arc;

use hookgate::store::RedisStore;

pub use crate::store_conformance::cluster::RedisClusterOutbox;
pub use crate::store_conformance::harness::{
    PostgresHarness as PostgresOutbox, SqliteHarness as SqliteOutbox,
};

use super::OutboxHarness;
use crate::store_conformance::harness::{Harness, REDIS_OP_TIMEOUT, REDIS_PREFIX};
use crate::support::redis_server::RedisServer;

/// A trigger that fails every insert into the outbox.
const SQLITE_BROKEN: &str = "CREATE TRIGGER broken BEFORE INSERT ON outbox
                             BEGIN SELECT RAISE(ABORT, 'injected'); END;";
const POSTGRES_BROKEN: &str = "
CREATE FUNCTION hookgate_test_broken() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN RAISE EXCEPTION 'injected'; END $$;
CREATE TRIGGER broken BEFORE INSERT ON hookgate_outbox
    FOR EACH ROW EXECUTE FUNCTION hookgate_test_broken();";

impl OutboxHarness for SqliteOutbox {
    async fn break_outbox(&self) {
        sqlite(self, SQLITE_BROKEN);
    }

    async fn repair_outbox(&self) {
        sqlite(self, "DROP TRIGGER broken");
    }
}

fn sqlite(h: &SqliteOutbox, sql: &str) {
    let conn = rusqlite::Connection::open(h.path()).expect("open the sqlite file");
    conn.execute_batch(sql).expect(sql);
}

impl OutboxHarness for PostgresOutbox {
    async fn break_outbox(&self) {
        postgres(self, POSTGRES_BROKEN).await;
    }

    async fn repair_outbox(&self) {
        let repair =
            "DROP TRIGGER broken ON hookgate_outbox; DROP FUNCTION hookgate_test_broken();";
        postgres(self, repair).await;
    }
}

async fn postgres(h: &PostgresOutbox, sql: &str) {
    let url = h.server().url();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(connection);
    client.batch_execute(sql).await.expect(sql);
}

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

impl Harness for RedisOutbox {
    type Store = RedisStore;

    async fn start() -> Self {
        let server = RedisServer::start();
        let store = Arc::new(Self::open(&server.url()).await);
        Self { server, store }
    }

    fn store(&self) -> Arc<RedisStore> {
        Arc::clone(&self.store)
    }

    async fn replica(&self) -> Arc<RedisStore> {
        Arc::new(Self::open(&self.server.url()).await)
    }
}

impl OutboxHarness for RedisOutbox {
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
