//! How the conformance suite gets a store of each backend, plus the values
//! the tests share.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hookgate::store::{
    Backend, Claim, Existing, KeyRecord, LeaseToken, MemoryStore, PostgresStore, RedisStore,
    ScopedKey, Snapshot, SqliteStore,
};
use tempfile::TempDir;
use tokio::sync::Barrier;

use crate::support::postgres_server::PostgresServer;
use crate::support::redis_server::RedisServer;
use crate::support::store_server::StoreServer;

/// A lease no test outlives.
pub const LONG: Duration = Duration::from_secs(30);
/// A retention no test outlives.
pub const RETAIN: Duration = Duration::from_secs(3600);
/// Bound of one redis operation in these tests.
pub const REDIS_OP_TIMEOUT: Duration = Duration::from_secs(2);
pub const REDIS_PREFIX: &str = "hookgate-test";
/// Bound of one postgres operation (and of connecting) in these tests.
pub const POSTGRES_OP_TIMEOUT: Duration = Duration::from_secs(5);

/// A fresh, empty store of one backend, and what it needs kept alive.
pub trait Harness: Send + Sync + Sized + 'static {
    type Store: Backend + 'static;

    fn start() -> impl Future<Output = Self> + Send;

    fn store(&self) -> Arc<Self::Store>;

    /// A second store instance over the same data, as a second gate replica
    /// would open it. Memory cannot share, so it hands out the same store.
    fn replica(&self) -> impl Future<Output = Arc<Self::Store>> + Send;
}

pub struct MemoryHarness(Arc<MemoryStore>);

impl Harness for MemoryHarness {
    type Store = MemoryStore;

    async fn start() -> Self {
        Self(Arc::new(MemoryStore::new(10_000)))
    }

    fn store(&self) -> Arc<MemoryStore> {
        Arc::clone(&self.0)
    }

    async fn replica(&self) -> Arc<MemoryStore> {
        self.store()
    }
}

pub struct SqliteHarness {
    _dir: TempDir,
    path: PathBuf,
    store: Arc<SqliteStore>,
}

impl SqliteHarness {
    /// The store's file, for a test that reaches in beside the store.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Harness for SqliteHarness {
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
        Arc::new(
            SqliteStore::open(&self.path)
                .await
                .expect("open sqlite replica"),
        )
    }
}

/// The sqlite store, called as a lone delivery on a core calls it: the
/// test's own thread (where the test body runs) is made a core with one
/// delivery in flight, so its claims, marks and releases run on the store's
/// second connection, on that thread (`StoreThread::run_here_when_alone`).
/// Tasks the tests spawn (all of a race's claims but the test's own) run
/// on the runtime's workers, off the cores, and go to the store's thread:
/// both paths on one file at once.
pub struct SqliteOnCoreHarness {
    inner: SqliteHarness,
    _delivering: hookgate::cores::Delivering,
}

impl Harness for SqliteOnCoreHarness {
    type Store = SqliteStore;

    async fn start() -> Self {
        hookgate::cores::become_core(1);
        let delivering = hookgate::cores::Delivering::start();
        assert!(hookgate::cores::alone(), "the test thread is not a core");
        Self {
            inner: SqliteHarness::start().await,
            _delivering: delivering,
        }
    }

    fn store(&self) -> Arc<SqliteStore> {
        self.inner.store()
    }

    async fn replica(&self) -> Arc<SqliteStore> {
        self.inner.replica().await
    }
}

/// A store served by a server the test starts (redis-server, PostgreSQL).
pub trait ServedStore: Backend + Sized + 'static {
    type Server: StoreServer + Sync;

    /// The store on the server at `url`; with `queue`, `stripe` (the
    /// suites' provider) in queue mode where the backend cares.
    fn open(url: &str, queue: bool) -> impl Future<Output = Self> + Send;
}

/// A fresh server and a store on it; a replica is a second store opened on
/// the same server. `QUEUE`: see [`ServedStore::open`].
pub struct ServerHarness<S: ServedStore, const QUEUE: bool = false> {
    server: S::Server,
    store: Arc<S>,
}

impl<S: ServedStore, const QUEUE: bool> ServerHarness<S, QUEUE> {
    pub fn server(&self) -> &S::Server {
        &self.server
    }
}

pub type RedisHarness = ServerHarness<RedisStore>;
pub type PostgresHarness = ServerHarness<PostgresStore>;
pub use super::cluster::RedisClusterHarness;

impl<S: ServedStore, const QUEUE: bool> Harness for ServerHarness<S, QUEUE> {
    type Store = S;

    async fn start() -> Self {
        let server = S::Server::start();
        let store = Arc::new(S::open(&server.url(), QUEUE).await);
        Self { server, store }
    }

    fn store(&self) -> Arc<S> {
        Arc::clone(&self.store)
    }

    async fn replica(&self) -> Arc<S> {
        Arc::new(S::open(&self.server.url(), QUEUE).await)
    }
}

impl ServedStore for RedisStore {
    type Server = RedisServer;

    /// Queue mode moves `stripe`'s keys into the outbox shards.
    async fn open(url: &str, queue: bool) -> Self {
        let queued = queue.then(|| "stripe".to_owned());
        open_redis(url).await.queue_mode(queued)
    }
}

impl ServedStore for PostgresStore {
    type Server = PostgresServer;

    async fn open(url: &str, _queue: bool) -> Self {
        open_postgres(url).await
    }
}

pub async fn open_redis(url: &str) -> RedisStore {
    RedisStore::open(url, REDIS_PREFIX, REDIS_OP_TIMEOUT)
        .await
        .expect("open redis store")
}

pub async fn open_postgres(url: &str) -> PostgresStore {
    PostgresStore::open(url, POSTGRES_OP_TIMEOUT, RETAIN)
        .await
        .expect("open postgres store")
}

pub fn key(id: &str) -> ScopedKey {
    ScopedKey::new("stripe", id)
}

/// A snapshot whose body is not UTF-8, to prove bodies are stored as bytes.
pub fn snapshot() -> Snapshot {
    Snapshot {
        status: 202,
        content_type: Some("application/json; charset=utf-8".into()),
        body: Bytes::from_static(b"{\"ok\":true}\n\xff\x00\xfe\x80\r\n"),
        truncated: false,
    }
}

/// The token of a `Fresh` claim; anything else fails the test.
pub fn fresh(claim: Claim) -> LeaseToken {
    match claim {
        Claim::Fresh(token) => token,
        other => panic!("expected a fresh claim, got {other:?}"),
    }
}

/// Whether `store` took the completion of `key` by `token` with this
/// snapshot, kept for [`RETAIN`]; a store error fails the test.
pub async fn completes(
    store: &impl Backend,
    key: &ScopedKey,
    token: &LeaseToken,
    snapshot: &Snapshot,
) -> bool {
    let done = store.complete(key, token, snapshot, RETAIN).await;
    done.unwrap_or_else(|e| panic!("completing {key}: {e}"))
}

/// Claims `key` fresh and completes it with `snapshot()`; returns the
/// token that did.
pub async fn claim_and_complete(store: &impl Backend, key: &ScopedKey) -> LeaseToken {
    let token = fresh(store.claim(key, "fp", LONG).await.unwrap());
    assert!(
        completes(store, key, &token, &snapshot()).await,
        "{key} was not completed"
    );
    token
}

/// 50 claims of each key at once, spread over `stores`: exactly one wins.
/// Many rounds, because a lost race shows only when the timing lines up.
/// One claim is the caller's own, made on its thread (a core's, with
/// `SqliteOnCoreHarness`); the others are tasks on the runtime's workers.
pub async fn race<S: Backend + 'static>(stores: Vec<Arc<S>>) {
    const CLAIMS: usize = 50;
    for round in 0..20 {
        let key = key(&format!("evt_race_{round}"));
        let start = Arc::new(Barrier::new(CLAIMS));
        let tasks: Vec<_> = (1..CLAIMS)
            .map(|i| {
                let (store, key) = (Arc::clone(&stores[i % stores.len()]), key.clone());
                let start = Arc::clone(&start);
                tokio::spawn(async move {
                    start.wait().await;
                    store.claim(&key, "fp", LONG).await
                })
            })
            .collect();
        let own = async {
            start.wait().await;
            stores[0].claim(&key, "fp", LONG).await
        };
        let others = async {
            let mut claims = Vec::with_capacity(tasks.len());
            for task in tasks {
                claims.push(task.await.expect("claim task"));
            }
            claims
        };
        let (own, others) = tokio::join!(own, others);
        let (mut fresh, mut in_flight) = (0, 0);
        for claim in std::iter::once(own).chain(others) {
            match claim.expect("claim") {
                Claim::Fresh(_) => fresh += 1,
                Claim::Existing(Existing::InFlight { .. }) => in_flight += 1,
                other => panic!("unexpected outcome in a race: {other:?}"),
            }
        }
        assert_eq!((fresh, in_flight), (1, CLAIMS - 1), "round {round}");
    }
}

/// Fails the test unless `key` is held in flight.
pub async fn assert_in_flight(store: &impl Backend, key: &ScopedKey) {
    let record = store.get(key).await.unwrap();
    assert!(
        matches!(
            &record,
            Some(KeyRecord {
                state: Existing::InFlight { .. },
                ..
            })
        ),
        "expected {key} in flight, got {record:?}"
    );
}
