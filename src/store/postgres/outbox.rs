//! Queue mode on the postgres store: the `hookgate_outbox` table (schema
//! V3), written in the same transaction as the dedupe records it belongs
//! to, and leased by any number of relays with `FOR UPDATE SKIP LOCKED`.
//!
//! An accept serializes with concurrent claims and accepts of the same key
//! the way `claim` does, with the same call (`claim_key`): it inserts the
//! key's row in `hookgate_claims` (waiting on whoever holds it), looks for a
//! completed record again in a new statement, and only then writes the
//! record and the job. The claim row is deleted before the commit, so
//! nobody ever sees it.

use std::time::Duration;

use deadpool_postgres::{Client, GenericClient, Transaction};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::operations::{Looked, claim_key};
use super::{PostgresStore, maintenance};
use crate::store::Result;
use crate::store::outbox::{
    Accept, AcceptPolicy, Accepted, Depth, FilterValue, Job, JobFilter, JobState, JobSummary,
    NewJob, Outbox, Settle,
};
use crate::store::{LeaseToken, ScopedKey};

/// How long an accept's serializing claim row would hold the key if the
/// transaction outlived its connection; it never commits, so this only
/// bounds the lock-free case.
const ACCEPT_LEASE_SECS: f64 = 30.0;

const RECORD: &str = "
INSERT INTO processed_events (provider, provider_event_id, received_at, completed_at, expires_at,
    state, lease_token, lease_expires_at, fingerprint,
    response_status, response_content_type, response_body, response_truncated)
VALUES ($1, $2, now(), now(), now() + make_interval(secs => $3), 'completed', $4, now(), $5,
    $6, $7, $8, $9)";

const ENQUEUE: &str = "
INSERT INTO hookgate_outbox (provider, event_key, state, method, target, headers, body,
    received_at, due_at, expires_at)
VALUES ($1, $2, 'pending', $3, $4, $5, $6, now(), now(), now() + make_interval(secs => $7))";

const UNCLAIM: &str = "
DELETE FROM hookgate_claims WHERE provider = $1 AND provider_event_id = $2 AND lease_token = $3";

/// Takes due jobs no other relay is taking: rows locked by a concurrent
/// take are skipped, not waited for.
const TAKE: &str = "
UPDATE hookgate_outbox o
SET lease_token = $1, lease_expires_at = clock_timestamp() + make_interval(secs => $2),
    attempts = o.attempts + 1
FROM (SELECT id FROM hookgate_outbox
      WHERE state = 'pending' AND due_at <= now()
        AND (lease_expires_at IS NULL OR lease_expires_at <= now())
      ORDER BY due_at LIMIT $3 FOR UPDATE SKIP LOCKED) due
WHERE o.id = due.id
RETURNING o.id, o.provider, o.event_key, o.method, o.target, o.headers, o.body, o.received_at,
    o.attempts";

const SETTLE: &str = "
UPDATE hookgate_outbox
SET state = $3,
    due_at = CASE WHEN $3 = 'pending' THEN now() + make_interval(secs => $4) ELSE due_at END,
    last_status = $5, last_error = $6, lease_token = NULL, lease_expires_at = NULL,
    finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
WHERE id = $1 AND lease_token = $2 AND state = 'pending'";

const DEPTH: &str = "
SELECT provider,
    count(*) FILTER (WHERE state = 'pending' AND coalesce(lease_expires_at <= now(), true)),
    count(*) FILTER (WHERE state = 'pending' AND lease_expires_at > now()),
    count(*) FILTER (WHERE state = 'dead'),
    min(received_at) FILTER (WHERE state = 'pending')
FROM hookgate_outbox WHERE state IN ('pending', 'dead') GROUP BY provider";

impl Outbox for PostgresStore {
    /// A commit is durable once the server answers it, as long as the
    /// server keeps `synchronous_commit` on (its default); a server that
    /// turned it off is reported at start.
    async fn require_durable_commits(&self) -> Result<()> {
        let inner = &self.inner;
        let client = inner.client().await?;
        let row = client
            .query_one("SHOW synchronous_commit", &[])
            .await
            .map_err(|e| inner.error(e))?;
        let setting: String = row.get(0);
        if setting == "off" {
            tracing::warn!(
                "postgres store: synchronous_commit is off, so an accepted delivery can be lost \
                 in a server crash; queue mode wants it on"
            );
        }
        Ok(())
    }

    async fn accept(&self, items: Vec<Accept>, policy: AcceptPolicy) -> Result<Vec<Accepted>> {
        let inner = &self.inner;
        let mut client = inner.client().await?;
        match accept_once(&mut client, &items, &policy).await {
            // No partition for today: create it and try again (the failed
            // transaction was rolled back whole).
            Err(e) if e.code() == Some(&SqlState::CHECK_VIOLATION) => {
                tracing::warn!("postgres store: no partition for an accepted record; creating it");
                maintenance::create_partitions(&mut client, 1)
                    .await
                    .map_err(|e| inner.error(e))?;
                accept_once(&mut client, &items, &policy).await
            }
            other => other,
        }
        .map_err(|e| inner.error(e))
    }

    async fn take_due(&self, lease: Duration, limit: usize) -> Result<Vec<Job>> {
        let token = LeaseToken::generate();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 3] = [&token.0, &lease.as_secs_f64(), &limit];
        let rows = self.inner.query(TAKE, &params).await?;
        Ok(rows
            .iter()
            .map(|r| Job {
                id: r.get(0),
                key: ScopedKey::new(r.get::<_, String>(1), r.get::<_, String>(2)),
                job: NewJob {
                    method: r.get(3),
                    target: r.get(4),
                    headers: r.get::<_, Vec<u8>>(5).into(),
                    body: r.get::<_, Vec<u8>>(6).into(),
                },
                received_at: r.get(7),
                attempt: attempt(r.get(8)),
                token: token.clone(),
            })
            .collect())
    }

    async fn settle(&self, id: i64, token: &LeaseToken, settle: Settle) -> Result<bool> {
        let (state, wait, status, error) = match settle {
            Settle::Delivered { status } => (JobState::Delivered, 0.0, Some(status), None),
            Settle::Retry {
                after,
                status,
                error,
            } => (JobState::Pending, after.as_secs_f64(), status, Some(error)),
            Settle::Dead { status, error } => (JobState::Dead, 0.0, status, Some(error)),
        };
        let status = status.map(i32::from);
        let params: [&(dyn ToSql + Sync); 6] =
            [&id, &token.0, &state.as_str(), &wait, &status, &error];
        Ok(self.inner.execute(SETTLE, &params).await? == 1)
    }

    async fn jobs(&self, filter: JobFilter, limit: usize) -> Result<Vec<JobSummary>> {
        let (clause, args) = filter_sql(&filter);
        let sql = format!(
            "SELECT id, provider, event_key, state, attempts, received_at, due_at, last_status,
                 last_error FROM hookgate_outbox WHERE {clause}
             ORDER BY received_at DESC, id DESC LIMIT {}",
            i64::try_from(limit).unwrap_or(i64::MAX)
        );
        let rows = self.inner.query(&sql, &params(&args)).await?;
        Ok(rows
            .iter()
            .map(|r| JobSummary {
                id: r.get(0),
                key: ScopedKey::new(r.get::<_, String>(1), r.get::<_, String>(2)),
                state: JobState::parse(r.get(3)).unwrap_or(JobState::Pending),
                attempts: attempt(r.get(4)),
                received_at: r.get(5),
                due_at: r.get(6),
                last_status: r
                    .get::<_, Option<i32>>(7)
                    .and_then(|s| u16::try_from(s).ok()),
                last_error: r.get(8),
            })
            .collect())
    }

    async fn replay(&self, filter: JobFilter) -> Result<u64> {
        let (clause, args) = filter_sql(&filter);
        self.execute(
            &format!(
                "UPDATE hookgate_outbox SET state = 'pending', due_at = now(), attempts = 0,
                 lease_token = NULL, lease_expires_at = NULL, finished_at = NULL
             WHERE {clause}"
            ),
            &args,
        )
        .await
    }

    async fn purge(&self, filter: JobFilter) -> Result<u64> {
        let (clause, args) = filter_sql(&filter);
        self.execute(
            &format!("DELETE FROM hookgate_outbox WHERE {clause}"),
            &args,
        )
        .await
    }

    async fn depth(&self) -> Result<Vec<Depth>> {
        let inner = &self.inner;
        let client = inner.client().await?;
        let rows = client.query(DEPTH, &[]).await.map_err(|e| inner.error(e))?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(rows
            .iter()
            .map(|r| Depth {
                provider: r.get(0),
                pending: count(r.get(1)),
                leased: count(r.get(2)),
                dead: count(r.get(3)),
                oldest_pending: r.get(4),
            })
            .collect())
    }
}

impl PostgresStore {
    async fn execute(&self, sql: &str, args: &[FilterValue]) -> Result<u64> {
        self.inner.execute(sql, &params(args)).await
    }
}

/// One accept transaction: the reads (serialized per key with concurrent
/// claims and accepts), then, when nothing stands in the way, the writes.
/// Keys are taken in sorted order, so two batches sharing keys never wait
/// on each other in a cycle.
async fn accept_once(
    client: &mut Client,
    items: &[Accept],
    policy: &AcceptPolicy,
) -> Result<Vec<Accepted>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let token = LeaseToken::generate();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        (&items[a].key.provider, &items[a].key.key)
            .cmp(&(&items[b].key.provider, &items[b].key.key))
    });
    let mut outcomes = vec![Accepted::Enqueued; items.len()];
    let mut blocked = false;
    for i in order {
        let outcome = look(&tx, &items[i], &token).await?;
        blocked |= outcome.blocks(policy);
        outcomes[i] = outcome;
    }
    if blocked {
        tx.rollback().await?;
        return Ok(outcomes);
    }
    let retention = policy.retention.as_secs_f64();
    let answer = &policy.answer;
    for (item, _) in items
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| **o == Accepted::Enqueued)
    {
        let (provider, key) = (&item.key.provider, &item.key.key);
        let record = tx.prepare_cached(RECORD).await?;
        let status = i32::from(answer.status);
        let values: [&(dyn ToSql + Sync); 9] = [
            provider,
            key,
            &retention,
            &token.0,
            &item.fingerprint,
            &status,
            &answer.content_type,
            &&answer.body[..],
            &answer.truncated,
        ];
        tx.execute(&record, &values).await?;
        let enqueue = tx.prepare_cached(ENQUEUE).await?;
        let job = &item.job;
        let values: [&(dyn ToSql + Sync); 7] = [
            provider,
            key,
            &job.method,
            &job.target,
            &&job.headers[..],
            &&job.body[..],
            &retention,
        ];
        tx.execute(&enqueue, &values).await?;
    }
    for item in items {
        let unclaim = tx.prepare_cached(UNCLAIM).await?;
        tx.execute(&unclaim, &[&item.key.provider, &item.key.key, &token.0])
            .await?;
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// What the store holds of one item's key, inside the accept's transaction:
/// a completed record, a delivery in flight, or nothing (then the key's
/// claim row is ours until the transaction ends).
async fn look(
    tx: &Transaction<'_>,
    item: &Accept,
    token: &LeaseToken,
) -> Result<Accepted, tokio_postgres::Error> {
    let looked = claim_key(tx, &item.key, token, &item.fingerprint, ACCEPT_LEASE_SECS).await?;
    Ok(match looked {
        Looked::Fresh => Accepted::Enqueued,
        Looked::Held { stored, existing } => Accepted::found(&stored, &item.fingerprint, existing),
    })
}

fn attempt(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// The query's parameters, as `tokio-postgres` takes them.
fn params(values: &[FilterValue]) -> Vec<&(dyn ToSql + Sync)> {
    values
        .iter()
        .map(|v| match v {
            FilterValue::Text(t) => t as &(dyn ToSql + Sync),
            FilterValue::Time(t) => t as &(dyn ToSql + Sync),
        })
        .collect()
}

/// The WHERE clause and its parameters (`$1`, `$2`, ...) for `filter`.
fn filter_sql(filter: &JobFilter) -> (String, Vec<FilterValue>) {
    filter.to_sql(|n| format!("${n}"))
}
