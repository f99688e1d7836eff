//! The outbox of queue mode (SPEC section 1b): deliveries accepted for the
//! relay, recorded in the same atomic operation as their dedupe entries,
//! then leased, attempted, and settled as delivered, retried or dead.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::Result;
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

impl Accepted {
    /// What an accept makes of a key it found held or done, comparing
    /// fingerprints as a claim does.
    pub fn found(stored_fingerprint: &str, incoming: &str, existing: Existing) -> Self {
        match super::Claim::held(stored_fingerprint, incoming, existing) {
            super::Claim::Existing(existing) => Self::Existing(existing),
            super::Claim::Mismatch {
                stored_fingerprint,
                existing,
            } => Self::Mismatch {
                stored_fingerprint,
                existing,
            },
            super::Claim::Fresh(_) => unreachable!("held() never answers Fresh"),
        }
    }

    /// Whether this outcome stops the whole accept: a key in flight, or a
    /// changed payload that `policy` rejects.
    pub fn blocks(&self, policy: &AcceptPolicy) -> bool {
        match self {
            Self::Enqueued => false,
            Self::Existing(existing) => matches!(existing, Existing::InFlight { .. }),
            Self::Mismatch { existing, .. } => {
                policy.reject_mismatch || matches!(existing, Existing::InFlight { .. })
            }
        }
    }
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

/// The value of one placeholder of [`JobFilter::to_sql`].
#[derive(Clone, Debug)]
pub enum FilterValue {
    Text(String),
    Time(SystemTime),
}

impl JobFilter {
    /// The WHERE clause on the outbox table that selects these jobs, and
    /// its placeholders' values, numbered from 1 by `placeholder`
    /// (`|n| format!("?{n}")` on sqlite, `$n` on postgres). No condition
    /// selects every job.
    pub fn to_sql(&self, placeholder: impl Fn(usize) -> String) -> (String, Vec<FilterValue>) {
        let text = |column: &'static str, value: Option<&str>| {
            value.map(|v| (column, FilterValue::Text(v.to_owned())))
        };
        let time = |column: &'static str, value: Option<SystemTime>| {
            value.map(|t| (column, FilterValue::Time(t)))
        };
        let conditions = [
            text("state = ", self.state.map(JobState::as_str)),
            text("provider = ", self.provider.as_deref()),
            text("event_key = ", self.key.as_deref()),
            time("received_at >= ", self.since),
            time("received_at < ", self.before),
        ];
        let mut clause = "1 = 1".to_owned();
        let mut values = Vec::new();
        for (column, value) in conditions.into_iter().flatten() {
            values.push(value);
            clause.push_str(&format!(" AND {column}{}", placeholder(values.len())));
        }
        (clause, values)
    }
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

/// The outbox contract every durable backend implements (SPEC section 1b).
/// Job ids are unique per store; a lease token proves the relay that took a
/// job still holds it.
pub trait Outbox: Send + Sync {
    /// Commits are durable (on disk, or on the server) before they answer.
    fn require_durable_commits(&self) -> impl Future<Output = Result<()>> + Send;

    /// Records the dedupe entry and the job of every new event atomically,
    /// unless an event is held by a delivery in flight or (per `policy`)
    /// arrived with a changed payload: then nothing is recorded.
    fn accept(
        &self,
        items: Vec<Accept>,
        policy: AcceptPolicy,
    ) -> impl Future<Output = Result<Vec<Accepted>>> + Send;

    /// Leases up to `limit` due jobs for `lease`; a job whose lease ran out
    /// is due again.
    fn take_due(
        &self,
        lease: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Job>>> + Send;

    /// Records how an attempt ended, if `token` still holds the job.
    fn settle(
        &self,
        id: i64,
        token: &LeaseToken,
        settle: Settle,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// The jobs `filter` selects, newest first, at most `limit`.
    fn jobs(
        &self,
        filter: JobFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<JobSummary>>> + Send;

    /// Puts the jobs `filter` selects back to pending, due now, as a new
    /// series of attempts; returns how many. The dedupe record is not
    /// consulted: a replay is an operator's decision.
    fn replay(&self, filter: JobFilter) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes the jobs `filter` selects; returns how many.
    fn purge(&self, filter: JobFilter) -> impl Future<Output = Result<u64>> + Send;

    /// Pending (leased or not) and dead jobs per provider.
    fn depth(&self) -> impl Future<Output = Result<Vec<Depth>>> + Send;
}

/// The memory store keeps nothing across a restart, so the config refuses
/// queue mode on it; reaching it anyway is an error, never a silent loss.
fn not_durable() -> StoreError {
    StoreError::Unavailable("the memory store has no outbox (it is not durable)".to_owned())
}

/// `Store` hands each outbox operation to the configured backend. The
/// relay's operations are bounded by the store's timeout and timed, like the
/// dedupe operations; an operator's (list, replay, purge, depth) may touch
/// many jobs and run unbounded.
macro_rules! outbox_dispatching {
    (
        timed { $($op:ident($($arg:ident: $ty:ty),*) -> $ok:ty;)* }
        untimed { $($uop:ident($($uarg:ident: $uty:ty),*) -> $uok:ty;)* }
    ) => {
        impl Outbox for super::Store {
            $(
                async fn $op(&self, $($arg: $ty),*) -> Result<$ok> {
                    let started = std::time::Instant::now();
                    let op = async move { outbox_backend!(self, s => s.$op($($arg),*)) };
                    let result = match tokio::time::timeout(self.op_timeout, op).await {
                        Ok(result) => result,
                        Err(_) => Err(StoreError::Timeout(self.op_timeout)),
                    };
                    if let Some(metrics) = &self.metrics {
                        metrics.store(self.backend_name(), stringify!($op), started.elapsed());
                    }
                    result
                }
            )*
            $(
                async fn $uop(&self, $($uarg: $uty),*) -> Result<$uok> {
                    outbox_backend!(self, s => s.$uop($($uarg),*))
                }
            )*
        }

    };
}

macro_rules! outbox_backend {
    ($self:ident, $s:ident => $call:expr) => {
        match &$self.backend {
            super::Dispatch::Memory(_) => Err(not_durable()),
            super::Dispatch::Sqlite($s) => $call.await,
            super::Dispatch::Redis($s) => $call.await,
            super::Dispatch::Postgres($s) => Box::pin($call).await,
        }
    };
}

outbox_dispatching! {
    timed {
        accept(items: Vec<Accept>, policy: AcceptPolicy) -> Vec<Accepted>;
        take_due(lease: Duration, limit: usize) -> Vec<Job>;
        settle(id: i64, token: &LeaseToken, settle: Settle) -> bool;
    }
    untimed {
        require_durable_commits() -> ();
        jobs(filter: JobFilter, limit: usize) -> Vec<JobSummary>;
        replay(filter: JobFilter) -> u64;
        purge(filter: JobFilter) -> u64;
        depth() -> Vec<Depth>;
    }
}
