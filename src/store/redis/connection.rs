//! The connection to redis: one server through the crate's
//! `ConnectionManager`, or a Redis Cluster through its cluster client,
//! which follows `MOVED` and `ASK` redirections and a failover by itself.
//! The store's scripts and commands see one type, [`Conn`], either way.
//! Single commands to one server go through a [`Batcher`], which writes
//! those of concurrent deliveries together; each core that serves
//! deliveries has its own connection and batcher (`crate::cores`), so a
//! store call never leaves the core's thread: 0.80 of the gate's CPU per
//! fresh event and 0.84 per duplicate against one connection shared by
//! the cores, for 1.16 times redis-server's per fresh event (smaller
//! batches; docs/BENCHMARKS.md).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::OnceCell;

use super::batch::{Batcher, Shared};
use crate::cores::{MainRuntime, PerCore};

/// Few, quick reconnect attempts: while redis is down each operation should
/// fail fast (the gate answers 503), and the next one tries again.
const RECONNECT_RETRIES: usize = 2;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);

/// How the store reaches redis. Boxed: the clients are large, and the
/// store enum is as large as its largest backend.
pub(super) enum Link {
    Single(Box<SingleLink>),
    Cluster(Box<ClusterLink>),
}

pub(super) struct SingleLink {
    /// One connection per core that serves deliveries (`crate::cores`),
    /// and one (index 0) for every other runtime: a core's commands, their
    /// batch and the connection's own task stay on that core's thread.
    /// Each connects on its first use.
    lanes: PerCore<Lane>,
    client: Client,
    config: ConnectionManagerConfig,
}

struct Lane {
    /// Reconnects by itself after I/O failures; cloning it is cheap and
    /// shares the connection. Replaced after a refused AUTH.
    manager: Shared,
    /// Started on first use, on the runtime that uses the lane.
    batcher: OnceLock<Batcher>,
}

pub(super) struct ClusterLink {
    client: ClusterClient,
    /// The runtime the store was opened on (the gate's main one): the
    /// cluster connection's task is spawned where it is made, and one
    /// connection serves every core (`crate::cores`), so it is made there
    /// rather than on the first core that needs it.
    main: MainRuntime,
    /// Connected on first use (so opening needs no live cluster), then
    /// kept: the cluster connection reconnects to nodes and refreshes the
    /// slot map on its own.
    connection: OnceCell<ClusterConnection>,
}

impl Link {
    /// One server at `url`; nothing is connected until the first use.
    pub(super) fn single(url: &str, op_timeout: Duration) -> Result<Self, RedisError> {
        let client = Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(op_timeout))
            .set_response_timeout(Some(op_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(op_timeout);
        let lanes = PerCore::try_new(|_| {
            let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
            Ok::<_, RedisError>(Lane {
                manager: Arc::new(Mutex::new(manager)),
                batcher: OnceLock::new(),
            })
        })?;
        Ok(Self::Single(Box::new(SingleLink {
            lanes,
            client,
            config,
        })))
    }

    /// A cluster reached through `seeds` (any of its nodes: the client
    /// discovers the rest); nothing is connected until the first use.
    pub(super) fn cluster(seeds: &[String], op_timeout: Duration) -> Result<Self, RedisError> {
        let wait = u64::try_from(RECONNECT_MIN_DELAY.as_millis()).unwrap_or(u64::MAX);
        let client = ClusterClient::builder(seeds.iter().map(String::as_str))
            .connection_timeout(op_timeout)
            .response_timeout(op_timeout)
            .retries(RECONNECT_RETRIES as u32)
            .min_retry_wait(wait)
            .max_retry_wait(u64::try_from(op_timeout.as_millis()).unwrap_or(u64::MAX))
            .build()?;
        Ok(Self::Cluster(Box::new(ClusterLink {
            client,
            main: MainRuntime::capture(),
            connection: OnceCell::new(),
        })))
    }

    /// A handle for one operation.
    pub(super) async fn conn(&self) -> Result<Conn, RedisError> {
        match self {
            Self::Single(link) => {
                let lane = link.lanes.get();
                Ok(Conn::Single(
                    lane.batcher
                        .get_or_init(|| Batcher::spawn(Arc::clone(&lane.manager)))
                        .clone(),
                ))
            }
            Self::Cluster(link) => {
                // Boxed: the connecting future (some 1.9 KiB, redis's and the
                // main runtime's) would otherwise sit inline in every
                // operation's future, and so in every delivery's, on every
                // backend (`store::dispatch!`), for a path taken only until
                // a first connect succeeds.
                let connect = || Box::pin(link.connect());
                let connection = link.connection.get_or_try_init(connect).await?;
                Ok(Conn::Cluster(connection.clone()))
            }
        }
    }

    /// After a refused AUTH: the manager retries only I/O failures, so the
    /// refusal would stick until the gate restarts. A fresh (lazy) manager
    /// tries again on the next operation, so fixing the password heals it.
    /// Only the calling core's lane, whose command was refused: the other
    /// lanes' connections may still be logged in.
    pub(super) fn renew(&self) {
        if let Self::Single(link) = self
            && let Ok(fresh) =
                ConnectionManager::new_lazy_with_config(link.client.clone(), link.config.clone())
        {
            let lane = link.lanes.get();
            *lane.manager.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
        }
    }
}

impl ClusterLink {
    async fn connect(&self) -> Result<ClusterConnection, RedisError> {
        let client = self.client.clone();
        self.main
            .run(async move { client.get_async_connection().await })
            .await
            .unwrap_or_else(|e| Err(RedisError::from((ErrorKind::Io, "connect", e))))
    }
}

/// One operation's connection, to one server or to the cluster.
#[derive(Clone)]
pub(super) enum Conn {
    /// Single commands are batched; pipelines go to the manager as they are.
    Single(Batcher),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(batcher) => Box::pin(batcher.send(cmd)),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(batcher) => {
                let mut manager = batcher.manager();
                Box::pin(async move { manager.req_packed_commands(pipeline, offset, count).await })
            }
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(batcher) => batcher.manager().get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
