//! Partition upkeep for `processed_events`: one partition per UTC day,
//! created ahead of need and dropped whole past the retention, so expiry is
//! never a bulk `DELETE` on the hot table. Also purges the rare claim rows
//! nobody completed or released (a gate that died mid-delivery).
//!
//! Partitions this store manages are named `processed_events_pYYYYMMDD` and
//! hold `[YYYY-MM-DD 00:00 UTC, next day)`; others (a DEFAULT partition an
//! operator added, say) are left alone.

use std::time::{Duration, SystemTime};

use deadpool_postgres::Client;

/// Days after today that always have a partition: a maintenance outage of
/// that long goes unnoticed by deliveries.
pub(super) const DAYS_AHEAD: i32 = 3;

/// Kept past `retention` before a partition is dropped: a record lives its
/// retention from its completion, which comes up to a lease after the
/// claim's `received_at` that places it. A day covers any sane lease and
/// costs one partition.
const GRACE: Duration = Duration::from_secs(86_400);

/// DDL on a partition takes a lock on `processed_events` that claims queue
/// behind: wait briefly for it, and give up (until the next pass) rather than
/// stall deliveries.
const DDL_LOCK_TIMEOUT: &str = "200ms";

/// Replicas take turns at DDL ("hookgatf": next to the migration lock).
const MAINTENANCE_LOCK: i64 = 0x686f_6f6b_6761_7466;

/// Stale claim rows deleted per statement.
const PURGE_BATCH: i64 = 500;

/// How the partitions stood at the last successful maintenance pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PartitionHealth {
    /// Rows over all partitions, from the planner's statistics (updated by
    /// autovacuum's ANALYZE, so it lags).
    pub estimated_rows: u64,
    /// Age of the oldest partition's first day; `None` before the first pass.
    pub oldest_partition_age: Option<Duration>,
    /// Partitions for days after today (the target is
    /// `PostgresStore::DAYS_AHEAD`).
    pub partitions_ahead: u32,
    /// When a pass last succeeded.
    pub last_maintenance: Option<SystemTime>,
}

/// Lists the managed partitions with their day, as `(name, day)`.
const PARTITIONS: &str = "
SELECT c.relname::text AS name,
       to_date(substr(c.relname, 19), 'YYYYMMDD') AS day,
       c.reltuples
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'processed_events'::regclass
  AND c.relname ~ '^processed_events_p[0-9]{8}$'";

/// One full pass: create ahead, drop past retention, purge stale claims,
/// then measure. Each step is its own short transaction.
pub(super) async fn run(
    client: &mut Client,
    retention: Duration,
) -> Result<PartitionHealth, tokio_postgres::Error> {
    create_partitions(client, 0).await?;
    drop_partitions(client, retention).await?;
    purge_claims(client).await?;
    purge_delivered(client).await?;
    let mut health = measure(client).await?;
    health.last_maintenance = Some(SystemTime::now());
    Ok(health)
}

/// Creates the partitions from `days_back` days before today to
/// `DAYS_AHEAD` days after it, those missing.
pub(super) async fn create_partitions(
    client: &mut Client,
    days_back: i32,
) -> Result<(), tokio_postgres::Error> {
    let tx = ddl_transaction(client).await?;
    let days = tx
        .query(
            "SELECT to_char(d, 'YYYYMMDD'), to_char(d, 'YYYY-MM-DD'),
                    to_char(d + interval '1 day', 'YYYY-MM-DD')
             FROM generate_series(
                 date_trunc('day', now() AT TIME ZONE 'UTC') - make_interval(days => $1),
                 date_trunc('day', now() AT TIME ZONE 'UTC') + make_interval(days => $2),
                 interval '1 day') AS d",
            &[&days_back, &DAYS_AHEAD],
        )
        .await?;
    for day in days {
        let (name, from, to): (&str, &str, &str) = (day.get(0), day.get(1), day.get(2));
        // The values come from to_char above: digits and dashes only.
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS processed_events_p{name} PARTITION OF processed_events
             FOR VALUES FROM ('{from} 00:00:00+00') TO ('{to} 00:00:00+00')"
        ))
        .await?;
    }
    tx.commit().await
}

/// Drops each partition whose last day ended more than `retention` (plus
/// [`GRACE`]) ago, one transaction per partition so that one lock timeout
/// does not hold back the others.
async fn drop_partitions(
    client: &mut Client,
    retention: Duration,
) -> Result<(), tokio_postgres::Error> {
    let horizon = (retention + GRACE).as_secs_f64();
    let expired = client
        .query(
            &format!(
                "SELECT name FROM ({PARTITIONS}) p
                 WHERE (day + 1)::timestamp AT TIME ZONE 'UTC' + make_interval(secs => $1) <= now()
                 ORDER BY day"
            ),
            &[&horizon],
        )
        .await?;
    for row in expired {
        let name: &str = row.get(0);
        let tx = ddl_transaction(client).await?;
        // The name matched PARTITIONS' pattern: letters, '_' and digits.
        tx.batch_execute(&format!("DROP TABLE IF EXISTS {name}"))
            .await?;
        tx.commit().await?;
        tracing::info!(
            partition = name,
            "postgres store: dropped a partition past retention"
        );
    }
    Ok(())
}

/// Deletes claim rows whose lease ended an hour ago (so no live gate holds
/// them); `claim` takes over an expired row anyway, this only keeps keys
/// never redelivered from lingering.
async fn purge_claims(client: &Client) -> Result<u64, tokio_postgres::Error> {
    purge_in_batches(
        client,
        "DELETE FROM hookgate_claims WHERE ctid = ANY(ARRAY(
             SELECT ctid FROM hookgate_claims
             WHERE lease_expires_at < now() - interval '1 hour'
             LIMIT $1 FOR UPDATE SKIP LOCKED))",
    )
    .await
}

/// Deletes delivered outbox rows past their retention; pending and dead
/// rows stay (dead ones until an operator purges them).
async fn purge_delivered(client: &Client) -> Result<u64, tokio_postgres::Error> {
    purge_in_batches(
        client,
        "DELETE FROM hookgate_outbox WHERE id = ANY(ARRAY(
             SELECT id FROM hookgate_outbox
             WHERE state = 'delivered' AND expires_at <= now()
             LIMIT $1 FOR UPDATE SKIP LOCKED))",
    )
    .await
}

/// Runs a `DELETE` of at most `$1` rows until it deletes fewer: small
/// batches, so no long lock and no long transaction on a busy table.
async fn purge_in_batches(client: &Client, sql: &str) -> Result<u64, tokio_postgres::Error> {
    let statement = client.prepare_cached(sql).await?;
    let mut total = 0;
    loop {
        let deleted = client.execute(&statement, &[&PURGE_BATCH]).await?;
        total += deleted;
        if deleted < PURGE_BATCH as u64 {
            return Ok(total);
        }
    }
}

/// Reads the partitions' state for [`PartitionHealth`].
pub(super) async fn measure(client: &Client) -> Result<PartitionHealth, tokio_postgres::Error> {
    let row = client
        .query_one(
            &format!(
                "SELECT COALESCE(sum(GREATEST(reltuples, 0)), 0)::float8,
                        EXTRACT(EPOCH FROM now() - min(day)::timestamp AT TIME ZONE 'UTC')::float8,
                        count(*) FILTER (WHERE day > (now() AT TIME ZONE 'UTC')::date)
                 FROM ({PARTITIONS}) p"
            ),
            &[],
        )
        .await?;
    let rows: f64 = row.get(0);
    let oldest: Option<f64> = row.get(1);
    let ahead: i64 = row.get(2);
    Ok(PartitionHealth {
        // Float to integer casts saturate; the estimate is never negative.
        estimated_rows: rows as u64,
        oldest_partition_age: oldest.map(|s| Duration::from_secs_f64(s.max(0.0))),
        partitions_ahead: u32::try_from(ahead).unwrap_or(u32::MAX),
        last_maintenance: None,
    })
}

/// A transaction that holds the maintenance lock and bounds its DDL's lock
/// waits. Waiting for the advisory lock is bounded too (another replica's
/// pass is short).
async fn ddl_transaction(
    client: &mut Client,
) -> Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.batch_execute("SET LOCAL lock_timeout = '5s'").await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MAINTENANCE_LOCK])
        .await?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))
        .await?;
    Ok(tx)
}
