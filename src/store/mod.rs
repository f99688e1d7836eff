//! The dedupe store: one contract (SPEC section 4), several backends.
//!
//! `claim` is atomic: of any number of concurrent claims of one key, across
//! any number of gate replicas sharing the store, exactly one is `Fresh`.
//! `complete` and `release` act only while the caller's token still owns the
//! key, so a holder whose lease expired can never overwrite a newer one.

mod clock;
mod memory;
pub mod outbox;
mod postgres;
mod redis;
mod sqlite;

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::metrics::Metrics;

pub use self::memory::MemoryStore;
pub use self::postgres::{PartitionHealth, PostgresStore};
pub use self::redis::RedisStore;
pub use self::sqlite::SqliteStore;

/// An idempotency key scoped by its provider: `{provider}:{key}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScopedKey {
    pub provider: String,
    pub key: String,
}

impl ScopedKey {
    pub fn new(provider: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            key: key.into(),
        }
    }
}

impl fmt::Display for ScopedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.provider, self.key)
    }
}

/// Proof of ownership of an in-flight claim: 128 random bits, hex-encoded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseToken(pub String);

impl LeaseToken {
    /// 128 random bits as 32 hex digits.
    pub fn generate() -> Self {
        Self(const_hex::encode(rand::random::<u128>().to_be_bytes()))
    }
}

/// What is replayed to a duplicate: the first successful upstream answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub status: u16,
    pub content_type: Option<String>,
    /// At most `store.max_response_bytes` of the answer's body.
    pub body: Bytes,
    /// The app said more than `body` holds (over the limit, or cut off).
    pub truncated: bool,
}

/// The state of a key someone else already holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Another delivery holds an unexpired lease.
    InFlight { retry_after: Duration },
    /// The event was processed; this is what the app answered.
    Completed(Snapshot),
}

/// The outcome of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nobody held the key (or a lease had expired): the caller owns it now.
    Fresh(LeaseToken),
    /// The key is held or done, with the same payload fingerprint.
    Existing(Existing),
    /// The key is held or done with a different payload fingerprint.
    Mismatch {
        stored_fingerprint: String,
        existing: Existing,
    },
}

impl Claim {
    /// Builds the outcome for a key found held, comparing fingerprints. An
    /// empty fingerprint on either side means detection is disabled.
    pub fn held(stored_fingerprint: &str, incoming: &str, existing: Existing) -> Self {
        if stored_fingerprint.is_empty() || incoming.is_empty() || stored_fingerprint == incoming {
            Self::Existing(existing)
        } else {
            Self::Mismatch {
                stored_fingerprint: stored_fingerprint.to_owned(),
                existing,
            }
        }
    }
}

/// What `hookgate keys get` shows of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub fingerprint: String,
    pub state: Existing,
    /// How long a completed key is still remembered (its retention left);
    /// `None` in flight (see the lease) or when the store cannot say.
    pub expires_in: Option<Duration>,
}

/// A store failure. Messages never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store unreachable: {0}")]
    Unavailable(String),
    #[error("store operation timed out after {0:?}")]
    Timeout(Duration),
    #[error("store data is corrupt: {0}")]
    Corrupt(String),
}

/// A store operation's result.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The contract every backend implements.
pub trait Backend: Send + Sync {
    /// Claims `key` for a lease of `lease`, unless someone holds it.
    fn claim(
        &self,
        key: &ScopedKey,
        fingerprint: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim>> + Send;

    /// Marks the key completed for `retention`, if `token` still owns it.
    fn complete(
        &self,
        key: &ScopedKey,
        token: &LeaseToken,
        snapshot: &Snapshot,
        retention: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Forgets an in-flight claim, if `token` still owns it.
    fn release(
        &self,
        key: &ScopedKey,
        token: &LeaseToken,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// The key's current state, if any.
    fn get(&self, key: &ScopedKey) -> impl Future<Output = Result<Option<KeyRecord>>> + Send;

    /// Forgets the key whatever its state (operator force-replay).
    fn forget(&self, key: &ScopedKey) -> impl Future<Output = Result<bool>> + Send;

    /// Answers when the store is reachable.
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;
}

/// Which backend to open, with its parameters (built from the config).
#[derive(Clone, Debug)]
pub enum BackendSettings {
    Memory {
        capacity: usize,
    },
    Sqlite {
        path: PathBuf,
    },
    /// `queue` names the providers in queue mode: their keys carry an
    /// outbox shard's hash tag (see the redis backend).
    Redis {
        url: String,
        prefix: String,
        queue: Vec<String>,
        /// `url` is a node of a Redis Cluster.
        cluster: bool,
    },
    /// Postgres's `retention` is the longest any provider keeps a key: its
    /// partitions are dropped only past it.
    Postgres {
        url: String,
        retention: Duration,
    },
}

/// Runtime store settings.
#[derive(Clone, Debug)]
pub struct StoreSettings {
    pub backend: BackendSettings,
    /// Upper bound of one store operation; past it the store counts as down.
    pub op_timeout: Duration,
}

/// The configured backend, dispatched by enum so the pipeline is not
/// generic, with every operation bounded by the store's timeout and, once
/// [`Store::timed_by`] gave it the gate's metrics, timed.
pub struct Store {
    backend: Dispatch,
    op_timeout: Duration,
    metrics: Option<Arc<Metrics>>,
}

enum Dispatch {
    Memory(MemoryStore),
    Sqlite(SqliteStore),
    Redis(RedisStore),
    Postgres(PostgresStore),
}

/// A future over the enum is as large as its largest arm, and every
/// delivery in flight holds one. tokio-postgres's futures are 2.0 to 2.5
/// KiB against at most about 0.9 KiB for the other backends (with the
/// redis cluster's connect boxed, `redis::connection`), so the postgres arm
/// is boxed: one allocation beside a network round trip, and up to 1.6 KiB
/// less for each delivery on every backend (docs/BENCHMARKS.md, Memory,
/// "The deliveries' futures").
macro_rules! dispatch {
    ($self:ident, $operation:expr, $s:ident => $call:expr) => {{
        let started = Instant::now();
        let fut = async {
            match &$self.backend {
                Dispatch::Memory($s) => $call.await,
                Dispatch::Sqlite($s) => $call.await,
                Dispatch::Redis($s) => $call.await,
                Dispatch::Postgres($s) => Box::pin($call).await,
            }
        };
        let result = match tokio::time::timeout($self.op_timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout($self.op_timeout)),
        };
        if let Some(metrics) = &$self.metrics {
            metrics.store($self.backend_name(), $operation, started.elapsed());
        }
        result
    }};
}

impl Store {
    /// Opens the backend. Redis and postgres connect lazily and reconnect on
    /// their own, so opening succeeds while they are down; the first
    /// operation reports it.
    pub async fn open(settings: &StoreSettings) -> Result<Self> {
        let backend = match &settings.backend {
            BackendSettings::Memory { capacity } => Dispatch::Memory(MemoryStore::new(*capacity)),
            BackendSettings::Sqlite { path } => Dispatch::Sqlite(SqliteStore::open(path).await?),
            BackendSettings::Redis {
                url,
                prefix,
                queue,
                cluster,
            } => {
                let store = if *cluster {
                    RedisStore::open_cluster(std::slice::from_ref(url), prefix, settings.op_timeout)
                        .await?
                } else {
                    RedisStore::open(url, prefix, settings.op_timeout).await?
                };
                Dispatch::Redis(store.queue_mode(queue.iter().cloned()))
            }
            BackendSettings::Postgres { url, retention } => {
                Dispatch::Postgres(PostgresStore::open(url, settings.op_timeout, *retention).await?)
            }
        };
        Ok(Self {
            backend,
            op_timeout: settings.op_timeout,
            metrics: None,
        })
    }

    /// The bound of one operation.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Records every operation's duration in `metrics`
    /// (`hookgate_store_operation_duration_seconds`).
    pub fn timed_by(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The partition maintenance's health, on the postgres backend.
    pub fn partition_health(&self) -> Option<PartitionHealth> {
        match &self.backend {
            Dispatch::Postgres(store) => Some(store.health()),
            _ => None,
        }
    }

    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Dispatch::Memory(_) => "memory",
            Dispatch::Sqlite(_) => "sqlite",
            Dispatch::Redis(_) => "redis",
            Dispatch::Postgres(_) => "postgres",
        }
    }
}

/// `Store` implements the contract by handing each operation to the
/// configured backend (`dispatch!`): one line per operation, named once.
macro_rules! dispatching {
    ($($op:ident($($arg:ident: $ty:ty),*) -> $ok:ty;)*) => {
        impl Backend for Store {
            $(
                async fn $op(&self, $($arg: $ty),*) -> Result<$ok> {
                    dispatch!(self, stringify!($op), s => s.$op($($arg),*))
                }
            )*
        }
    };
}

dispatching! {
    claim(key: &ScopedKey, fingerprint: &str, lease: Duration) -> Claim;
    complete(key: &ScopedKey, token: &LeaseToken, snapshot: &Snapshot, retention: Duration) -> bool;
    release(key: &ScopedKey, token: &LeaseToken) -> bool;
    get(key: &ScopedKey) -> Option<KeyRecord>;
    forget(key: &ScopedKey) -> bool;
    ping() -> ();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens are stored and compared as text: `hex` spells the bits as
    /// `{:032x}` did before it.
    #[test]
    fn lease_tokens_are_32_lowercase_hex_digits() {
        for bits in [0, 1, 0x0123_4567_89ab_cdef, u128::MAX] {
            assert_eq!(
                const_hex::encode(bits.to_be_bytes()),
                format!("{bits:032x}")
            );
        }
        let (a, b) = (LeaseToken::generate(), LeaseToken::generate());
        assert_ne!(a, b);
        assert_eq!(a.0.len(), 32);
        assert!(a.0.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
    }
}
