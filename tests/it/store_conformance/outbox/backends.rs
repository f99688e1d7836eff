//! How the outbox suite gets each durable backend, and breaks its outbox.
//! Sqlite and postgres reuse the dedupe suite's harnesses; redis opens its
//! store with `stripe`, the suite's provider, in queue mode.

use hookgate::store::RedisStore;

pub use crate::store_conformance::cluster::RedisClusterOutbox;
pub use crate::store_conformance::harness::{
    PostgresHarness as PostgresOutbox, SqliteHarness as SqliteOutbox,
};

use super::OutboxHarness;
use crate::store_conformance::harness::{REDIS_PREFIX, ServerHarness};

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

/// Redis with `stripe` in queue mode: its keys and jobs live in the
/// outbox shards.
pub type RedisOutbox = ServerHarness<RedisStore, true>;

/// Every shard's due set: making them strings breaks every accept.
fn due_keys() -> Vec<String> {
    (0..16)
        .map(|n| format!("{REDIS_PREFIX}:{{q{n:02}}}:#due"))
        .collect()
}

async fn redis(h: &RedisOutbox, cmd: &redis::Cmd) {
    let client = redis::Client::open(h.server().url()).expect("a redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test server");
    let _: redis::Value = cmd.query_async(&mut conn).await.expect("a raw command");
}

impl OutboxHarness for RedisOutbox {
    async fn break_outbox(&self) {
        let mut set = redis::cmd("MSET");
        for key in due_keys() {
            set.arg(key).arg("broken");
        }
        redis(self, &set).await;
    }

    async fn repair_outbox(&self) {
        redis(self, redis::cmd("DEL").arg(due_keys())).await;
    }
}
