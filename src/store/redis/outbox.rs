//! Queue mode on the redis store: not built yet; the config refuses queue
//! mode on redis, so these answer an error rather than lose anything.

use std::time::Duration;

use super::RedisStore;
use crate::store::outbox::{
    Accept, AcceptPolicy, Accepted, Depth, Job, JobFilter, JobSummary, Outbox, Settle,
};
use crate::store::{LeaseToken, StoreError};

fn missing() -> StoreError {
    StoreError::Unavailable("the redis store has no outbox yet".to_owned())
}

impl Outbox for RedisStore {
    async fn require_durable_commits(&self) -> Result<(), StoreError> {
        Err(missing())
    }

    async fn accept(&self, _: Vec<Accept>, _: AcceptPolicy) -> Result<Vec<Accepted>, StoreError> {
        Err(missing())
    }

    async fn take_due(&self, _: Duration, _: usize) -> Result<Vec<Job>, StoreError> {
        Err(missing())
    }

    async fn settle(&self, _: i64, _: &LeaseToken, _: Settle) -> Result<bool, StoreError> {
        Err(missing())
    }

    async fn jobs(&self, _: JobFilter, _: usize) -> Result<Vec<JobSummary>, StoreError> {
        Err(missing())
    }

    async fn replay(&self, _: JobFilter) -> Result<u64, StoreError> {
        Err(missing())
    }

    async fn purge(&self, _: JobFilter) -> Result<u64, StoreError> {
        Err(missing())
    }

    async fn depth(&self) -> Result<Vec<Depth>, StoreError> {
        Err(missing())
    }
}
