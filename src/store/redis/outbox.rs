//! Queue mode on the redis store (SPEC section 1b).
//!
//! **Shards.** A Redis Cluster runs a script only over keys of one slot, and
//! an accept must write a dedupe entry and its job in one script. So the
//! outbox is cut into 16 shards, each under its own hash tag `{qNN}`, and a
//! queue-mode provider's dedupe keys live in the shard of their event:
//! `{prefix}:{qNN}:{provider}:{key}`, NN being FNV-1a of `provider:key`
//! mod 16 (stable across processes and versions, unlike std's hasher).
//! Forward-mode providers keep `{prefix}:{provider}:{key}`, so switching a
//! provider's mode starts a fresh dedupe history for it.
//!
//! **Per shard**, beside those dedupe keys (the `#` keeps them apart from
//! any dedupe key, since provider names cannot hold it):
//! - `{prefix}:{qNN}:#due`: a sorted set of the pending jobs, scored by
//!   when each may next be taken: its due time, or while leased the end of
//!   its lease. Taking a job re-scores it to the lease's end, so a lease
//!   that runs out makes the job due again with no reclaim step: reclaim is
//!   as atomic as the take. The issue suggested streams with consumer
//!   groups; a sorted set scored this way does what `XAUTOCLAIM` would, and
//!   also schedules each retry at its own time, which a stream cannot.
//! - `{prefix}:{qNN}:#job:{id}`: a hash per job (provider, key, state,
//!   method, target, headers, body, received and due times, attempts, lease
//!   token and end, last status and error, finished time, expiry). A
//!   delivered job's hash expires with its dedupe retention.
//! - `{prefix}:{qNN}:#jobs` and `{prefix}:{qNN}:#dead`: every job, and the
//!   dead letter, by received time, for listing; an id whose hash expired
//!   is dropped from them when a listing meets it.
//! - `{prefix}:{qNN}:#seq`: the shard's counter. A job's id is
//!   `seq * 16 + shard`, so settling finds the shard from the id.
//!
//! **Atomicity.** Redis does not roll a script back when a command fails in
//! it, so the accept script checks everything first (the dedupe entries,
//! the type of every key it will write, that no job hash is in the way),
//! then writes the outbox, then the dedupe entries last: a failure leaves
//! no dedupe entry without its job. A batch (SendGrid) whose events fall in
//! several shards runs the check on every shard first and writes only if
//! none stands in the way, then writes shard by shard. Each event's entry
//! and job are still written together, but the batch as a whole is not:
//! a concurrent delivery of one of its events between the check and the
//! writes, or redis failing between two shards' writes, leaves the earlier
//! shards' events accepted while the answer is an error; the provider's
//! retry then finds them as duplicates and accepts the rest.
//!
//! The relay polls every shard: a cheap count of due jobs on each, then a
//! take on those that have some, sharing the limit among them in turn.

mod rows;
mod scripts;
mod shard;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::{join_all, try_join_all};

use self::rows::{Row, job, number, summary, text};
use self::scripts::SCRIPTS;
pub(super) use self::shard::Shard;
use self::shard::share;
use super::connection::Conn;
use super::{Fields, RedisStore, decode_tagged, millis};
use crate::store::Result;
use crate::store::clock::{from_unix_ms, unix_ms};
use crate::store::outbox::{
    Accept, AcceptPolicy, Accepted, Depth, Job, JobFilter, JobState, JobSummary, Outbox, Settle,
};
use crate::store::{LeaseToken, ScopedKey, StoreError};

/// The most ids one depth script reads: each costs a hash read, and redis
/// serves nobody else while a script runs. Read whole, a backlog of
/// 200,000 jobs held it up to 83 ms per shard; in pages of 128 ids, no
/// call took over 4.1 ms (docs/BENCHMARKS.md, "The redis stall, probed
/// again").
const DEPTH_PAGE: usize = 128;
/// The depth script's sets: `due` (pending and leased jobs), `dead`.
const DEPTH_DUE: u8 = 1;
const DEPTH_DEAD: u8 = 2;
/// The longest wait a script is given (100 years): past it the
/// milliseconds would not fit the scripts' number formatting.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Outbox for RedisStore {
    /// A write is acknowledged once it is in the server's memory (and its
    /// replicas' when the client asks, which this store does not): whether
    /// it survives a crash of redis depends on the server's persistence,
    /// `appendonly yes` with `appendfsync always` for every acknowledged
    /// accept, `everysec` for all but the last second. Nothing the client
    /// can switch on, so this only documents it (README, redis store).
    async fn require_durable_commits(&self) -> Result<()> {
        Ok(())
    }

    async fn accept(&self, items: Vec<Accept>, policy: AcceptPolicy) -> Result<Vec<Accepted>> {
        if let Some(item) = items.iter().find(|i| !self.queue.contains(&i.key.provider)) {
            return Err(StoreError::Unavailable(format!(
                "redis: provider {} is not in queue mode on this store",
                item.key.provider
            )));
        }
        let mut shards: BTreeMap<Shard, Vec<usize>> = BTreeMap::new();
        for (n, item) in items.iter().enumerate() {
            shards.entry(Shard::of(&item.key)).or_default().push(n);
        }
        let mut outcomes = vec![Accepted::Enqueued; items.len()];
        if shards.len() > 1 {
            let mut blocked = false;
            for (&shard, members) in &shards {
                let found = self.accept_shard(shard, &items, members, &policy, false);
                blocked |= fill(&mut outcomes, members, found.await?.1, &items, &policy)?;
            }
            if blocked {
                return Ok(outcomes);
            }
        }
        for (&shard, members) in &shards {
            let (written, found) = self
                .accept_shard(shard, &items, members, &policy, true)
                .await?;
            let blocked = fill(&mut outcomes, members, found, &items, &policy)?;
            if blocked && !written {
                break;
            }
        }
        Ok(outcomes)
    }

    async fn take_due(&self, lease: Duration, limit: usize) -> Result<Vec<Job>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let conn = &self.conn().await?;
        let counts = try_join_all(Shard::all().map(|shard| async move {
            let mut call = SCRIPTS.count_due.prepare_invoke();
            call.key(shard.key(&self.prefix, "due"));
            call.invoke_async::<u64>(&mut conn.clone()).await
        }))
        .await
        .map_err(|e| self.error(e))?;
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        let quotas = share(&counts, limit, start);
        let token = LeaseToken::generate();
        let takes = Shard::all()
            .zip(quotas)
            .filter(|(_, quota)| *quota > 0)
            .map(|(shard, quota)| {
                let token = &token;
                async move {
                    let mut call = SCRIPTS.take.prepare_invoke();
                    call.key(shard.key(&self.prefix, "due"))
                        .arg(shard.job_prefix(&self.prefix))
                        .arg(millis(lease.min(LONGEST)))
                        .arg(quota)
                        .arg(&token.0);
                    call.invoke_async::<Vec<Row>>(&mut conn.clone()).await
                }
            });
        let mut jobs = Vec::new();
        let mut failed = None;
        for taken in join_all(takes).await {
            match taken {
                Ok(rows) => {
                    for row in rows {
                        jobs.push(job(row, &token)?);
                    }
                }
                Err(e) => failed = Some(self.error(e)),
            }
        }
        match failed {
            // What the other shards leased is handed on, not left to expire.
            Some(e) if jobs.is_empty() => Err(e),
            Some(e) => {
                tracing::warn!(error = %e, "redis outbox: taking from a shard failed");
                Ok(jobs)
            }
            None => Ok(jobs),
        }
    }

    async fn settle(&self, id: i64, token: &LeaseToken, settle: Settle) -> Result<bool> {
        let Some(shard) = Shard::of_job(id) else {
            return Ok(false);
        };
        let (state, wait, status, error) = match settle {
            Settle::Delivered { status } => ("delivered", Duration::ZERO, Some(status), None),
            Settle::Retry {
                after,
                status,
                error,
            } => ("pending", after, status, Some(error)),
            Settle::Dead { status, error } => ("dead", Duration::ZERO, status, Some(error)),
        };
        let mut call = SCRIPTS.settle.prepare_invoke();
        call.key(format!("{}{id}", shard.job_prefix(&self.prefix)))
            .key(shard.key(&self.prefix, "due"))
            .key(shard.key(&self.prefix, "dead"))
            .arg(&token.0)
            .arg(state)
            .arg(u64::try_from(wait.min(LONGEST).as_millis()).unwrap_or(0))
            .arg(status.map(|s| s.to_string()).unwrap_or_default())
            .arg(if error.is_some() { "1" } else { "0" })
            .arg(error.unwrap_or_default())
            .arg(id);
        let acted: i64 = call
            .invoke_async(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        Ok(acted == 1)
    }

    async fn jobs(&self, filter: JobFilter, limit: usize) -> Result<Vec<JobSummary>> {
        let mut all = Vec::new();
        for rows in self.scan::<Vec<Row>>(&filter, "list", limit).await? {
            for row in rows {
                all.push(summary(row)?);
            }
        }
        all.sort_by_key(|j| std::cmp::Reverse((j.received_at, j.id)));
        all.truncate(limit);
        Ok(all)
    }

    async fn replay(&self, filter: JobFilter) -> Result<u64> {
        let counts = self.scan::<u64>(&filter, "replay", 0).await?;
        Ok(counts.into_iter().sum())
    }

    async fn purge(&self, filter: JobFilter) -> Result<u64> {
        let counts = self.scan::<u64>(&filter, "purge", 0).await?;
        Ok(counts.into_iter().sum())
    }

    async fn depth(&self) -> Result<Vec<Depth>> {
        let conn = &self.conn().await?;
        // One shard after the other: one page at a time ahead of the
        // claims and accepts that share the connection (16 walks at once
        // kept 16 pages ahead of every accept: its p99 went from 7 to 26 ms
        // under a backlog of 200,000 jobs).
        let mut shards = Vec::new();
        for shard in Shard::all() {
            shards.push(self.shard_depth(conn, shard).await?);
        }
        let mut by: BTreeMap<String, Depth> = BTreeMap::new();
        for row in shards.into_iter().flatten() {
            let mut fields = row.into_iter();
            let mut next = || fields.next().flatten();
            let provider = text(next(), "provider")?;
            let d = by.entry(provider.clone()).or_insert_with(|| Depth {
                provider,
                ..Depth::default()
            });
            d.pending += number::<u64>(next(), "pending")?;
            d.leased += number::<u64>(next(), "leased")?;
            d.dead += number::<u64>(next(), "dead")?;
            if let Some(oldest) = next() {
                let oldest = from_unix_ms(number(Some(oldest), "received time")?);
                d.oldest_pending = Some(d.oldest_pending.map_or(oldest, |t| t.min(oldest)));
            }
        }
        Ok(by.into_values().collect())
    }
}

impl RedisStore {
    /// What one shard holds, as the depth script's rows (partial counts per
    /// provider, page by page: `Outbox::depth` adds them up). The walk is
    /// by rank and not atomic: a job taken, settled or accepted during it
    /// shifts the ranks after it, so jobs can be counted twice or missed
    /// (a job taken ahead of the walk counts as pending, then as leased).
    async fn shard_depth(&self, conn: &Conn, shard: Shard) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        for set in [DEPTH_DUE, DEPTH_DEAD] {
            let mut first = 0;
            loop {
                let mut call = SCRIPTS.depth.prepare_invoke();
                call.key(shard.key(&self.prefix, "due"))
                    .key(shard.key(&self.prefix, "dead"))
                    .arg(shard.job_prefix(&self.prefix))
                    .arg(set)
                    .arg(first)
                    .arg(DEPTH_PAGE);
                let mut page = call
                    .invoke_async::<Vec<Row>>(&mut conn.clone())
                    .await
                    .map_err(|e| self.error(e))?
                    .into_iter();
                let walked: usize = number(
                    page.next().and_then(|r| r.into_iter().next().flatten()),
                    "page size",
                )?;
                rows.extend(page);
                if walked < DEPTH_PAGE {
                    break;
                }
                first += walked;
            }
        }
        Ok(rows)
    }

    /// Runs the accept script for the items of one shard (`members`, by
    /// index); returns whether it wrote, and what it found of each.
    async fn accept_shard(
        &self,
        shard: Shard,
        items: &[Accept],
        members: &[usize],
        policy: &AcceptPolicy,
        write: bool,
    ) -> Result<(bool, Vec<Fields>)> {
        let answer = &policy.answer;
        let flag = |on: bool| if on { "1" } else { "0" };
        let mut call = SCRIPTS.accept.prepare_invoke();
        call.key(shard.key(&self.prefix, "due"))
            .key(shard.key(&self.prefix, "jobs"))
            .key(shard.key(&self.prefix, "seq"));
        for &n in members {
            call.key(self.key(&items[n].key));
        }
        call.arg(shard.job_prefix(&self.prefix))
            .arg(shard.0)
            .arg(flag(write))
            .arg(flag(policy.reject_mismatch))
            .arg(millis(policy.retention.min(LONGEST)))
            .arg(answer.status)
            .arg(flag(answer.content_type.is_some()))
            .arg(answer.content_type.as_deref().unwrap_or(""))
            .arg(&answer.body[..])
            .arg(flag(answer.truncated));
        for &n in members {
            let Accept {
                key,
                fingerprint,
                job,
            } = &items[n];
            call.arg(fingerprint)
                .arg(&key.provider)
                .arg(&key.key)
                .arg(&job.method)
                .arg(&job.target)
                .arg(&job.headers[..])
                .arg(&job.body[..]);
        }
        let (written, found): (i64, Vec<Fields>) = call
            .invoke_async(&mut self.conn().await?)
            .await
            .map_err(|e| self.error(e))?;
        if found.len() != members.len() {
            return Err(StoreError::Corrupt(
                "redis: the accept answered for another number of events".into(),
            ));
        }
        Ok((written == 1, found))
    }

    /// Runs the scan script (`op`: list, replay, purge) on every shard the
    /// filter may reach: one, when it names a provider and a key.
    async fn scan<T: redis::FromRedisValue>(
        &self,
        filter: &JobFilter,
        op: &str,
        limit: usize,
    ) -> Result<Vec<T>> {
        let shards: Vec<Shard> = match (&filter.provider, &filter.key) {
            (Some(p), Some(k)) => vec![Shard::of(&ScopedKey::new(p.as_str(), k.as_str()))],
            _ => Shard::all().collect(),
        };
        let exact = |v: &Option<String>| v.as_ref().map(|v| format!("={v}")).unwrap_or_default();
        let (provider, key) = (exact(&filter.provider), exact(&filter.key));
        let state = filter.state.map(JobState::as_str).unwrap_or("");
        let low = filter
            .since
            .map_or("-inf".into(), |t| unix_ms(t).to_string());
        let high = filter
            .before
            .map_or("+inf".into(), |t| format!("({}", unix_ms(t)));
        let limit = if op == "list" {
            i64::try_from(limit).unwrap_or(i64::MAX)
        } else {
            -1
        };
        let conn = self.conn().await?;
        let calls = shards.into_iter().map(|shard| {
            let (provider, key, low, high, conn) = (&provider, &key, &low, &high, &conn);
            async move {
                let mut call = SCRIPTS.scan.prepare_invoke();
                call.key(shard.key(&self.prefix, "due"))
                    .key(shard.key(&self.prefix, "dead"))
                    .key(shard.key(&self.prefix, "jobs"))
                    .arg(op)
                    .arg(shard.job_prefix(&self.prefix))
                    .arg(state)
                    .arg(provider)
                    .arg(key)
                    .arg(low)
                    .arg(high)
                    .arg(limit);
                call.invoke_async::<T>(&mut conn.clone()).await
            }
        });
        try_join_all(calls).await.map_err(|e| self.error(e))
    }
}

/// Turns what the accept script found of `members` into their outcomes;
/// returns whether one of them stands in the way of the accept.
fn fill(
    outcomes: &mut [Accepted],
    members: &[usize],
    found: Vec<Fields>,
    items: &[Accept],
    policy: &AcceptPolicy,
) -> Result<bool> {
    let mut blocked = false;
    for (&n, fields) in members.iter().zip(found) {
        let outcome = if fields.is_empty() {
            Accepted::Enqueued
        } else {
            let (stored, existing, _) = decode_tagged(fields)?;
            Accepted::found(&stored, &items[n].fingerprint, existing)
        };
        blocked |= outcome.blocks(policy);
        outcomes[n] = outcome;
    }
    Ok(blocked)
}
