//! Queue mode on the sqlite store: the `outbox` table beside
//! `processed_events`, written in the same transaction as the dedupe
//! entries it belongs to.

use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{Connection, Row as SqlRow, params, params_from_iter};

use super::{SqliteStore, select_live};
use crate::store::Result;
use crate::store::clock::{after, from_unix_ms, now_ms, unix_ms};
use crate::store::outbox::{
    Accept, AcceptPolicy, Accepted, Depth, FilterValue, Job, JobFilter, JobState, JobSummary,
    NewJob, Outbox, Settle,
};
use crate::store::{LeaseToken, ScopedKey};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS outbox (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    provider         TEXT    NOT NULL,
    event_key        TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
    method           TEXT    NOT NULL,
    target           TEXT    NOT NULL,
    headers          BLOB    NOT NULL,
    body             BLOB    NOT NULL,
    received_at      INTEGER NOT NULL,
    due_at           INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    last_status      INTEGER,
    last_error       TEXT,
    finished_at      INTEGER,
    expires_at       INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (state, due_at);
CREATE INDEX IF NOT EXISTS outbox_key ON outbox (provider, event_key);
";

/// Deletes one batch of delivered jobs past their retention.
pub(super) fn purge_batch(c: &mut Connection, now: i64, limit: i64) -> Result<usize> {
    let mut stmt = c.prepare_cached(
        "DELETE FROM outbox WHERE rowid IN (
             SELECT rowid FROM outbox WHERE state = 'delivered' AND expires_at <= ?1 LIMIT ?2)",
    )?;
    Ok(stmt.execute(params![now, limit])?)
}

impl Outbox for SqliteStore {
    /// Commits are on disk (fsync) before they are answered: queue mode
    /// answers 202 once its accept is durable, power loss included.
    async fn require_durable_commits(&self) -> Result<()> {
        self.run(|c| Ok(c.pragma_update(None, "synchronous", "FULL")?))
            .await
    }

    /// Records the dedupe entry and the job of every new event, in one
    /// transaction, unless an event is held by a delivery in flight or (per
    /// `policy`) arrived with a changed payload: then nothing is recorded.
    async fn accept(&self, items: Vec<Accept>, policy: AcceptPolicy) -> Result<Vec<Accepted>> {
        self.run(move |c| {
            if !c.is_autocommit() {
                // Inside the store thread's batch, which holds the lock.
                return accept_in(c, &items, &policy);
            }
            super::immediate(c, |c| accept_in(c, &items, &policy))
        })
        .await
    }

    /// Leases up to `limit` due jobs for `lease`.
    async fn take_due(&self, lease: Duration, limit: usize) -> Result<Vec<Job>> {
        self.run(move |c| {
            let now = now_ms();
            let token = LeaseToken::generate();
            let mut stmt = c.prepare_cached(
                "UPDATE outbox SET lease_token = ?1, lease_expires_at = ?2, attempts = attempts + 1
                 WHERE id IN (SELECT id FROM outbox
                     WHERE state = 'pending' AND due_at <= ?3
                       AND (lease_expires_at IS NULL OR lease_expires_at <= ?3)
                     ORDER BY due_at LIMIT ?4)
                 RETURNING id, provider, event_key, method, target, headers, body, received_at,
                     attempts",
            )?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = stmt.query_map(params![token.0, after(now, lease), now, limit], |r| {
                Ok(Job {
                    id: r.get(0)?,
                    key: ScopedKey::new(r.get::<_, String>(1)?, r.get::<_, String>(2)?),
                    job: NewJob {
                        method: r.get(3)?,
                        target: r.get(4)?,
                        headers: r.get::<_, Vec<u8>>(5)?.into(),
                        body: r.get::<_, Vec<u8>>(6)?.into(),
                    },
                    received_at: from_unix_ms(r.get(7)?),
                    attempt: r.get(8)?,
                    token: token.clone(),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Records how an attempt ended, if `token` still holds the job.
    async fn settle(&self, id: i64, token: &LeaseToken, settle: Settle) -> Result<bool> {
        let token = token.clone();
        self.run(move |c| {
            let now = now_ms();
            let (state, due, status, error) = match &settle {
                Settle::Delivered { status } => ("delivered", now, Some(*status), None),
                Settle::Retry {
                    after: wait,
                    status,
                    error,
                } => ("pending", after(now, *wait), *status, Some(error)),
                Settle::Dead { status, error } => ("dead", now, *status, Some(error)),
            };
            let changed = c
                .prepare_cached(
                    "UPDATE outbox SET state = ?3, due_at = ?4, last_status = ?5, last_error = ?6,
                         lease_token = NULL, lease_expires_at = NULL,
                         finished_at = CASE WHEN ?3 = 'pending' THEN NULL ELSE ?7 END
                     WHERE id = ?1 AND lease_token = ?2 AND state = 'pending'",
                )?
                .execute(params![id, token.0, state, due, status, error, now])?;
            Ok(changed == 1)
        })
        .await
    }

    /// The jobs `filter` selects, newest first, at most `limit`.
    async fn jobs(&self, filter: JobFilter, limit: usize) -> Result<Vec<JobSummary>> {
        self.run(move |c| {
            let (clause, args) = filter_sql(&filter);
            let sql = format!(
                "SELECT id, provider, event_key, state, attempts, received_at, due_at, last_status,
                     last_error FROM outbox WHERE {clause} ORDER BY received_at DESC, id DESC
                 LIMIT {}",
                i64::try_from(limit).unwrap_or(i64::MAX)
            );
            let mut stmt = c.prepare(&sql)?;
            let rows = stmt.query_map(params_from_iter(args), summary)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Puts the jobs `filter` selects back to pending, due now, as a new
    /// series of attempts; returns how many. The dedupe record is not
    /// consulted: a replay is an operator's decision.
    async fn replay(&self, filter: JobFilter) -> Result<u64> {
        self.run(move |c| {
            let (clause, mut args) = filter_sql(&filter);
            args.push(Value::Integer(now_ms()));
            let n = args.len();
            let sql = format!(
                "UPDATE outbox SET state = 'pending', due_at = ?{n}, attempts = 0,
                     lease_token = NULL, lease_expires_at = NULL, finished_at = NULL
                 WHERE {clause}"
            );
            Ok(c.execute(&sql, params_from_iter(args))? as u64)
        })
        .await
    }

    /// Deletes the jobs `filter` selects; returns how many.
    async fn purge(&self, filter: JobFilter) -> Result<u64> {
        self.run(move |c| {
            let (clause, args) = filter_sql(&filter);
            let sql = format!("DELETE FROM outbox WHERE {clause}");
            Ok(c.execute(&sql, params_from_iter(args))? as u64)
        })
        .await
    }

    /// Pending (leased or not) and dead jobs per provider.
    async fn depth(&self) -> Result<Vec<Depth>> {
        self.run(|c| {
            let now = now_ms();
            let mut stmt = c.prepare_cached(
                "SELECT provider,
                     sum(state = 'pending' AND coalesce(lease_expires_at, 0) <= ?1),
                     sum(state = 'pending' AND coalesce(lease_expires_at, 0) > ?1),
                     sum(state = 'dead'),
                     min(CASE WHEN state = 'pending' THEN received_at END)
                 FROM outbox WHERE state IN ('pending', 'dead') GROUP BY provider",
            )?;
            let rows = stmt.query_map(params![now], |r| {
                Ok(Depth {
                    provider: r.get(0)?,
                    pending: r.get::<_, i64>(1)?.max(0) as u64,
                    leased: r.get::<_, i64>(2)?.max(0) as u64,
                    dead: r.get::<_, i64>(3)?.max(0) as u64,
                    oldest_pending: r.get::<_, Option<i64>>(4)?.map(from_unix_ms),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

/// The accept's reads, then (when nothing stands in the way) its writes.
fn accept_in(c: &Connection, items: &[Accept], policy: &AcceptPolicy) -> Result<Vec<Accepted>> {
    let now = now_ms();
    let mut outcomes = Vec::with_capacity(items.len());
    let mut blocked = false;
    for item in items {
        let outcome = match select_live(c, &item.key, now)? {
            None => Accepted::Enqueued,
            Some(row) => {
                let (stored, existing) = row.split(now)?;
                Accepted::found(&stored, &item.fingerprint, existing)
            }
        };
        blocked |= outcome.blocks(policy);
        outcomes.push(outcome);
    }
    if blocked {
        return Ok(outcomes);
    }
    let expires = after(now, policy.retention);
    let answer = &policy.answer;
    for (item, _) in items
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| **o == Accepted::Enqueued)
    {
        c.prepare_cached(
            "INSERT OR REPLACE INTO processed_events (provider, provider_event_id, state,
                 fingerprint, response_status, response_content_type, response_body,
                 response_truncated, expires_at, received_at)
             VALUES (?1, ?2, 'completed', ?3, ?4, ?5, ?6, 0, ?7, ?8)",
        )?
        .execute(params![
            item.key.provider,
            item.key.key,
            item.fingerprint,
            answer.status,
            answer.content_type,
            &answer.body[..],
            expires,
            now
        ])?;
        c.prepare_cached(
            "INSERT INTO outbox (provider, event_key, state, method, target, headers, body,
                 received_at, due_at, expires_at)
             VALUES (?1, ?2, 'pending', ?3, ?4, ?5, ?6, ?7, ?7, ?8)",
        )?
        .execute(params![
            item.key.provider,
            item.key.key,
            item.job.method,
            item.job.target,
            &item.job.headers[..],
            &item.job.body[..],
            now,
            expires
        ])?;
    }
    Ok(outcomes)
}

/// The WHERE clause and its parameters (numbered from 1) for `filter`.
fn filter_sql(filter: &JobFilter) -> (String, Vec<Value>) {
    let (clause, values) = filter.to_sql(|n| format!("?{n}"));
    let args = values.into_iter().map(|v| match v {
        FilterValue::Text(text) => Value::Text(text),
        FilterValue::Time(t) => Value::Integer(unix_ms(t)),
    });
    (clause, args.collect())
}

fn summary(r: &SqlRow<'_>) -> rusqlite::Result<JobSummary> {
    let state: String = r.get(3)?;
    Ok(JobSummary {
        id: r.get(0)?,
        key: ScopedKey::new(r.get::<_, String>(1)?, r.get::<_, String>(2)?),
        state: JobState::parse(&state).unwrap_or(JobState::Pending),
        attempts: r.get(4)?,
        received_at: from_unix_ms(r.get(5)?),
        due_at: from_unix_ms(r.get(6)?),
        last_status: r.get(7)?,
        last_error: r.get(8)?,
    })
}
