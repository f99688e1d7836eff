//! The outbox of queue mode (SPEC section 1b): deliveries accepted for the
//! relay, recorded in the same atomic operation as their dedupe entries,
//! then leased, attempted, and settled as delivered, retried or dead.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::{Existing, LeaseToken, ScopedKey, Snapshot, StoreError};

/// What the relay will send for one accepted event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewJob {
    pub method: String,
    /// The path and query on the upstream.
    pub target: String,
    /// The headers to forward, as an HTTP/1 header block (`name: value\r\n`
    /// lines): values may be any bytes but CR, LF and NUL, which HTTP
    /// itself forbids, so the block is lossless.
    pub headers: Bytes,
    pub body: Bytes,
}

/// One event to accept: its dedupe entry and, when fresh, its job.
#[derive(Clone, Debug)]
pub struct Accept {
    pub key: ScopedKey,
    pub fingerprint: String,
    pub job: NewJob,
}

/// The dedupe side of an accept, per event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// New: the dedupe entry and the job were recorded.
    Enqueued,
    /// Known, with the same payload fingerprint.
    Existing(Existing),
    /// Known, with a different payload fingerprint.
    Mismatch {
        stored_fingerprint: String,
        existing: Existing,
    },
}

/// How an accept treats what it finds: it records nothing unless every
/// event is new or a settled duplicate.
#[derive(Clone, Debug)]
pub struct AcceptPolicy {
    /// Stored for the dedupe entries: what a duplicate is answered.
    pub answer: Snapshot,
    /// How long the dedupe entries (and delivered jobs) are kept.
    pub retention: Duration,
    /// A mismatch aborts the accept (`on_mismatch = "reject"`).
    pub reject_mismatch: bool,
}

/// A job the relay took, under a lease.
#[derive(Clone, Debug)]
pub struct Job {
    pub id: i64,
    pub key: ScopedKey,
    pub job: NewJob,
    pub received_at: SystemTime,
    /// This attempt's number, from 1.
    pub attempt: u32,
    pub token: LeaseToken,
}

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    Delivered {
        status: u16,
    },
    Retry {
        after: Duration,
        status: Option<u16>,
        error: String,
    },
    Dead {
        status: Option<u16>,
        error: String,
    },
}

/// A job's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Pending,
    Delivered,
    Dead,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Dead => "dead",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(Self::Pending),
            "delivered" => Some(Self::Delivered),
            "dead" => Some(Self::Dead),
            _ => None,
        }
    }
}

/// What an operator sees of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSummary {
    pub id: i64,
    pub key: ScopedKey,
    pub state: JobState,
    pub attempts: u32,
    pub received_at: SystemTime,
    pub due_at: SystemTime,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
}

/// Which jobs an operator command acts on.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub provider: Option<String>,
    /// One event's key (without the provider).
    pub key: Option<String>,
    /// Received at or after.
    pub since: Option<SystemTime>,
    /// Received before.
    pub before: Option<SystemTime>,
}

/// Depth per provider and state, for the queue gauges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Depth {
    pub provider: String,
    pub pending: u64,
    pub leased: u64,
    pub dead: u64,
    /// When the oldest pending job was received.
    pub oldest_pending: Option<SystemTime>,
}

/// The outbox operations on the configured store. Only sqlite has an
/// outbox so far; the config refuses queue mode on the others, so their
/// answer here is an error, never a silent loss.
impl super::Store {
    fn outbox(&self) -> Result<&super::SqliteStore, StoreError> {
        match &self.backend {
            super::Dispatch::Sqlite(store) => Ok(store),
            _ => Err(StoreError::Unavailable(format!(
                "the {} store has no outbox (queue mode runs on sqlite)",
                self.backend_name()
            ))),
        }
    }

    /// Bounds an outbox operation by the store's timeout and times it.
    async fn outbox_op<T>(
        &self,
        operation: &'static str,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(self.op_timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(self.op_timeout)),
        };
        if let Some(metrics) = &self.metrics {
            metrics.store(self.backend_name(), operation, started.elapsed());
        }
        result
    }

    /// See [`super::SqliteStore::require_durable_commits`].
    pub async fn require_durable_commits(&self) -> Result<(), StoreError> {
        match &self.backend {
            super::Dispatch::Sqlite(store) => store.require_durable_commits().await,
            _ => Ok(()),
        }
    }

    pub async fn accept(
        &self,
        items: Vec<Accept>,
        policy: AcceptPolicy,
    ) -> Result<Vec<Accepted>, StoreError> {
        let store = self.outbox()?;
        self.outbox_op("accept", store.accept(items, policy)).await
    }

    pub async fn take_due(&self, lease: Duration, limit: usize) -> Result<Vec<Job>, StoreError> {
        let store = self.outbox()?;
        self.outbox_op("take", store.take_due(lease, limit)).await
    }

    pub async fn settle(
        &self,
        id: i64,
        token: &LeaseToken,
        settle: Settle,
    ) -> Result<bool, StoreError> {
        let store = self.outbox()?;
        self.outbox_op("settle", store.settle(id, token, settle))
            .await
    }

    pub async fn jobs(
        &self,
        filter: JobFilter,
        limit: usize,
    ) -> Result<Vec<JobSummary>, StoreError> {
        self.outbox()?.jobs(filter, limit).await
    }

    pub async fn replay(&self, filter: JobFilter) -> Result<u64, StoreError> {
        self.outbox()?.replay(filter).await
    }

    pub async fn purge(&self, filter: JobFilter) -> Result<u64, StoreError> {
        self.outbox()?.purge(filter).await
    }

    pub async fn depth(&self) -> Result<Vec<Depth>, StoreError> {
        self.outbox()?.depth().await
    }
}
