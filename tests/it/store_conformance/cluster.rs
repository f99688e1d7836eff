//! The redis store on a real Redis Cluster (three masters, three replicas on
//! loopback): the dedupe and outbox conformance suites run on it through
//! `RedisClusterHarness` and `RedisClusterOutbox`, each test under its own
//! key prefix in one shared cluster; and the keys spread over every master.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hookgate::store::outbox::{Accept, AcceptPolicy, NewJob, Outbox};
use hookgate::store::{Backend, RedisStore, ScopedKey};

use super::harness::{Harness, LONG, REDIS_OP_TIMEOUT, RETAIN, completes, fresh, snapshot};
use super::outbox::OutboxHarness;
use crate::support::redis_cluster::RedisCluster;

/// A prefix no other test in this process uses.
fn unique_prefix() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("hookgate-cluster-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn open(prefix: &str, queue: &[&str]) -> RedisStore {
    let seeds = [RedisCluster::shared().url()];
    RedisStore::open_cluster(&seeds, prefix, REDIS_OP_TIMEOUT)
        .await
        .expect("open the cluster store")
        .queue_mode(queue.iter().map(|p| (*p).to_owned()))
}

/// The shared cluster, started on first use (off the async runtime: it
/// waits on processes).
async fn cluster() -> &'static RedisCluster {
    tokio::task::spawn_blocking(RedisCluster::shared)
        .await
        .expect("start the shared cluster")
}

/// A store on the shared cluster under a prefix of its own; with `QUEUE`,
/// `stripe` (the suites' provider) is in queue mode.
pub struct ClusterHarness<const QUEUE: bool> {
    prefix: String,
    store: Arc<RedisStore>,
}

pub type RedisClusterHarness = ClusterHarness<false>;
pub type RedisClusterOutbox = ClusterHarness<true>;

impl<const QUEUE: bool> ClusterHarness<QUEUE> {
    async fn open(prefix: &str) -> RedisStore {
        open(prefix, if QUEUE { &["stripe"] } else { &[] }).await
    }

    /// Sets (or deletes) every shard's due set, one slot at a time.
    async fn due_sets(&self, broken: bool) {
        let client = redis::cluster::ClusterClient::new(vec![RedisCluster::shared().url()])
            .expect("a cluster client");
        let mut conn = client
            .get_async_connection()
            .await
            .expect("connect to the cluster");
        for n in 0..16 {
            let key = format!("{}:{{q{n:02}}}:#due", self.prefix);
            let cmd = if broken {
                redis::cmd("SET").arg(&key).arg("broken").clone()
            } else {
                redis::cmd("DEL").arg(&key).clone()
            };
            let _: redis::Value = cmd.query_async(&mut conn).await.expect("a raw command");
        }
    }
}

impl<const QUEUE: bool> Harness for ClusterHarness<QUEUE> {
    type Store = RedisStore;

    async fn start() -> Self {
        cluster().await;
        let prefix = unique_prefix();
        let store = Arc::new(Self::open(&prefix).await);
        Self { prefix, store }
    }

    fn store(&self) -> Arc<RedisStore> {
        Arc::clone(&self.store)
    }

    async fn replica(&self) -> Arc<RedisStore> {
        Arc::new(Self::open(&self.prefix).await)
    }
}

impl OutboxHarness for RedisClusterOutbox {
    async fn break_outbox(&self) {
        self.due_sets(true).await;
    }

    async fn repair_outbox(&self) {
        self.due_sets(false).await;
    }
}

/// Dedupe keys of a forward-mode provider and a queue-mode provider's keys
/// and jobs land on all three masters: no slot is special, so none of them
/// carries all the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_and_jobs_spread_over_every_master() {
    const EVENTS: usize = 300;
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let seeds = [cluster.url()];
    let store = RedisStore::open_cluster(&seeds, "spread", REDIS_OP_TIMEOUT)
        .await
        .expect("open the cluster store")
        .queue_mode(["queued".to_owned()]);
    for n in 0..EVENTS {
        let key = ScopedKey::new("forwarded", format!("evt_{n}"));
        let token = fresh(store.claim(&key, "fp", LONG).await.unwrap());
        assert!(completes(&store, &key, &token, &snapshot()).await);
    }
    let accepts = (0..EVENTS)
        .map(|n| Accept {
            key: ScopedKey::new("queued", format!("evt_{n}")),
            fingerprint: "fp".into(),
            job: NewJob {
                method: "POST".into(),
                target: "/".into(),
                headers: "content-type: application/json\r\n".into(),
                body: "{}".into(),
            },
        })
        .collect();
    let policy = AcceptPolicy {
        answer: snapshot(),
        retention: RETAIN,
        reject_mismatch: true,
    };
    store.accept(accepts, policy).await.expect("accept");

    let masters = cluster.masters();
    let counts: Vec<(u16, u64)> = masters.iter().map(|&p| (p, cluster.keys_on(p))).collect();
    println!("keys per master (port, keys): {counts:?}");
    assert_eq!(counts.len(), 3, "three masters: {counts:?}");
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    // Each event is a dedupe key; a queued one adds a job hash, and each
    // of the 16 shards its due set, job index and sequence.
    assert!(total >= (EVENTS * 3) as u64, "{total} keys: {counts:?}");
    for (port, keys) in &counts {
        assert!(
            *keys as f64 > total as f64 / 3.0 * 0.6,
            "master {port} holds {keys} of {total} keys: {counts:?}"
        );
    }
}
