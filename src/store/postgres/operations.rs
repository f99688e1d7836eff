//! The store operations: each one or two statements, whose SQL says why
//! it is atomic. `schema` explains the two tables they work on.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::{PostgresStore, maintenance};
use crate::store::Result;
use crate::store::{
    Backend, Claim, Existing, KeyRecord, LeaseToken, ScopedKey, Snapshot, StoreError,
};

/// The live completed record of a key, newest first (a key forgotten and
/// processed again has an older, no longer live, row too).
const SELECT_COMPLETED: &str = "
SELECT fingerprint, response_status, response_content_type, response_body, response_truncated,
       EXTRACT(EPOCH FROM expires_at - now())::float8
FROM processed_events
WHERE provider = $1 AND provider_event_id = $2 AND state = 'completed' AND expires_at > now()
ORDER BY completed_at DESC
LIMIT 1";

/// Takes the key unless someone holds an unexpired lease. When the WHERE
/// fails, the conflicting row is still locked until the transaction ends,
/// which `SELECT_HELD` relies on. The lease starts at the insert
/// (`clock_timestamp()`), not at the transaction's start (`now()`), which
/// may lie a lock wait earlier.
pub(super) const INSERT_CLAIM: &str = "
INSERT INTO hookgate_claims AS c
    (provider, provider_event_id, lease_token, fingerprint, received_at, lease_expires_at)
VALUES ($1, $2, $3, $4, clock_timestamp(), clock_timestamp() + make_interval(secs => $5))
ON CONFLICT (provider, provider_event_id) DO UPDATE
SET lease_token = excluded.lease_token,
    fingerprint = excluded.fingerprint,
    received_at = excluded.received_at,
    lease_expires_at = excluded.lease_expires_at
WHERE c.lease_expires_at <= now()";

/// The live claim of a key and the seconds left on its lease. "Live" as of
/// the transaction's start, like `INSERT_CLAIM`'s WHERE, so the row that
/// insert found held is found here.
pub(super) const SELECT_HELD: &str = "
SELECT fingerprint, EXTRACT(EPOCH FROM lease_expires_at - clock_timestamp())::float8
FROM hookgate_claims
WHERE provider = $1 AND provider_event_id = $2 AND lease_expires_at > now()";

/// Compare-and-set on the token, and the record written, in one statement
/// (so one transaction): the claim row moves to `processed_events` whole.
const COMPLETE: &str = "
WITH done AS (
    DELETE FROM hookgate_claims
    WHERE provider = $1 AND provider_event_id = $2 AND lease_token = $3
      AND lease_expires_at > now()
    RETURNING provider, provider_event_id, received_at, lease_token, lease_expires_at, fingerprint
)
INSERT INTO processed_events (provider, provider_event_id, received_at, completed_at, expires_at,
    state, lease_token, lease_expires_at, fingerprint,
    response_status, response_content_type, response_body, response_truncated)
SELECT provider, provider_event_id, received_at, now(), now() + make_interval(secs => $4),
    'completed', lease_token, lease_expires_at, fingerprint, $5, $6, $7, $8
FROM done";

const RELEASE: &str = "
DELETE FROM hookgate_claims
WHERE provider = $1 AND provider_event_id = $2 AND lease_token = $3 AND lease_expires_at > now()";

/// Drops the claim and retires the live record, in one statement; counts
/// what was live. The record stays, marked, as the audit trail of the replay.
const FORGET: &str = "
WITH claim AS (
    DELETE FROM hookgate_claims
    WHERE provider = $1 AND provider_event_id = $2
    RETURNING lease_expires_at > now() AS live
), record AS (
    UPDATE processed_events SET state = 'forgotten', expires_at = now()
    WHERE provider = $1 AND provider_event_id = $2 AND state = 'completed' AND expires_at > now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM claim WHERE live) + (SELECT count(*) FROM record)";

impl Backend for PostgresStore {
    /// Exactly one `Fresh` among concurrent claims, across replicas: the
    /// primary key of `hookgate_claims` lets one insert through, and the
    /// others wait on it and then find it held. The record lookup is done
    /// twice: first as a cheap read for the common duplicate, then again
    /// after the insert, in a new statement (so a new snapshot) inside the
    /// claim's transaction: a delivery that completed while we waited on
    /// its claim row is seen there, and our claim is rolled back.
    async fn claim(&self, key: &ScopedKey, fingerprint: &str, lease: Duration) -> Result<Claim> {
        let inner = &self.inner;
        let err = |e| inner.error(e);
        let mut client = inner.client().await?;
        if let Some((stored, snapshot)) = completed(&client, key).await.map_err(err)? {
            return Ok(Claim::held(
                &stored,
                fingerprint,
                Existing::Completed(snapshot),
            ));
        }
        let token = LeaseToken::generate();
        let tx = client.transaction().await.map_err(err)?;
        let insert = tx.prepare_cached(INSERT_CLAIM).await.map_err(err)?;
        let params: [&(dyn ToSql + Sync); 5] = [
            &key.provider,
            &key.key,
            &token.0,
            &fingerprint,
            &lease.as_secs_f64(),
        ];
        if tx.execute(&insert, &params).await.map_err(err)? == 0 {
            let held = tx.prepare_cached(SELECT_HELD).await.map_err(err)?;
            let row = tx
                .query_opt(&held, &[&key.provider, &key.key])
                .await
                .map_err(err)?
                .ok_or_else(|| StoreError::Corrupt("postgres: a locked claim vanished".into()))?;
            tx.commit().await.map_err(err)?;
            let (stored, left): (String, f64) = (row.get(0), row.get(1));
            return Ok(Claim::held(&stored, fingerprint, in_flight(left)));
        }
        if let Some((stored, snapshot)) = completed(&tx, key).await.map_err(err)? {
            tx.rollback().await.map_err(err)?;
            return Ok(Claim::held(
                &stored,
                fingerprint,
                Existing::Completed(snapshot),
            ));
        }
        tx.commit().await.map_err(err)?;
        Ok(Claim::Fresh(token))
    }

    async fn complete(
        &self,
        key: &ScopedKey,
        token: &LeaseToken,
        snapshot: &Snapshot,
        retention: Duration,
    ) -> Result<bool> {
        let inner = &self.inner;
        let mut client = inner.client().await?;
        let statement = client
            .prepare_cached(COMPLETE)
            .await
            .map_err(|e| inner.error(e))?;
        // A record must not outlive its partition. The configured retention
        // is already the longest any provider uses, so this only binds when
        // a caller asks for more than the store was opened with.
        let retention = retention.min(inner.retention);
        let status = i32::from(snapshot.status);
        let params: [&(dyn ToSql + Sync); 8] = [
            &key.provider,
            &key.key,
            &token.0,
            &retention.as_secs_f64(),
            &status,
            &snapshot.content_type,
            &&snapshot.body[..],
            &snapshot.truncated,
        ];
        let written = match client.execute(&statement, &params).await {
            // No partition for the claim's day: maintenance has not run for
            // DAYS_AHEAD days, or the clock jumped. Create it and retry; the
            // failed statement changed nothing.
            Err(e) if e.code() == Some(&SqlState::CHECK_VIOLATION) => {
                tracing::warn!("postgres store: no partition for a record; creating it");
                maintenance::create_partitions(&mut client, 1)
                    .await
                    .map_err(|e| inner.error(e))?;
                client.execute(&statement, &params).await
            }
            other => other,
        }
        .map_err(|e| inner.error(e))?;
        Ok(written == 1)
    }

    async fn release(&self, key: &ScopedKey, token: &LeaseToken) -> Result<bool> {
        let params: [&(dyn ToSql + Sync); 3] = [&key.provider, &key.key, &token.0];
        Ok(self.inner.execute(RELEASE, &params).await? == 1)
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<KeyRecord>> {
        let inner = &self.inner;
        let err = |e| inner.error(e);
        let client = inner.client().await?;
        if let Some((fingerprint, snapshot, left)) =
            completed_for(&client, key).await.map_err(err)?
        {
            let state = Existing::Completed(snapshot);
            let expires_in = Some(left);
            return Ok(Some(KeyRecord {
                fingerprint,
                state,
                expires_in,
            }));
        }
        let held = client.prepare_cached(SELECT_HELD).await.map_err(err)?;
        let row = client
            .query_opt(&held, &[&key.provider, &key.key])
            .await
            .map_err(err)?;
        Ok(row.map(|row| KeyRecord {
            fingerprint: row.get(0),
            state: in_flight(row.get(1)),
            expires_in: None,
        }))
    }

    async fn forget(&self, key: &ScopedKey) -> Result<bool> {
        let rows = self.inner.query(FORGET, &[&key.provider, &key.key]).await?;
        Ok(rows.first().is_some_and(|row| row.get::<_, i64>(0) > 0))
    }

    /// Answers once the server answers and the schema is in place.
    async fn ping(&self) -> Result<()> {
        let inner = &self.inner;
        let client = inner.client().await?;
        client
            .simple_query("SELECT 1")
            .await
            .map_err(|e| inner.error(e))?;
        Ok(())
    }
}

/// The key's live completed record, as (fingerprint, snapshot).
pub(super) async fn completed(
    client: &impl GenericClient,
    key: &ScopedKey,
) -> Result<Option<(String, Snapshot)>, tokio_postgres::Error> {
    Ok(completed_for(client, key)
        .await?
        .map(|(fingerprint, snapshot, _)| (fingerprint, snapshot)))
}

/// Like `completed`, with the retention left.
async fn completed_for(
    client: &impl GenericClient,
    key: &ScopedKey,
) -> Result<Option<(String, Snapshot, Duration)>, tokio_postgres::Error> {
    let statement = client.prepare_cached(SELECT_COMPLETED).await?;
    let row = client
        .query_opt(&statement, &[&key.provider, &key.key])
        .await?;
    Ok(row.map(|row| {
        let left = Duration::try_from_secs_f64(row.get(5)).unwrap_or_default();
        (row.get(0), snapshot(&row), left)
    }))
}

fn snapshot(row: &Row) -> Snapshot {
    let status: i32 = row.get(1);
    let body: Vec<u8> = row.get(3);
    Snapshot {
        // Written from a u16 by `complete`.
        status: u16::try_from(status).unwrap_or(u16::MAX),
        content_type: row.get(2),
        body: body.into(),
        truncated: row.get(4),
    }
}

/// Retry-After has a one-second resolution: never say zero.
pub(super) fn in_flight(seconds_left: f64) -> Existing {
    let left = Duration::try_from_secs_f64(seconds_left).unwrap_or_default();
    Existing::InFlight {
        retry_after: left.max(Duration::from_secs(1)),
    }
}
