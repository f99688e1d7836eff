//! The store operations: each one or two statements, whose SQL says why
//! it is atomic. `schema` explains the two tables they work on.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::{PostgresStore, maintenance};
use crate::store::Result;
use crate::store::{Backend, Claim, Existing, KeyRecord, LeaseToken, ScopedKey, Snapshot};

/// The live completed record of a key, newest first (a key forgotten and
/// processed again has an older, no longer live, row too).
const SELECT_COMPLETED: &str = "
SELECT fingerprint, response_status, response_content_type, response_body, response_truncated,
       EXTRACT(EPOCH FROM expires_at - now())::float8
FROM processed_events
WHERE provider = $1 AND provider_event_id = $2 AND state = 'completed' AND expires_at > now()
ORDER BY completed_at DESC
LIMIT 1";

/// Takes the key unless someone holds an unexpired lease, or finds what
/// holds it: the insert and the record's lookup after it in one round trip
/// (schema V4's `hookgate_claim`, which says why in that order).
const CLAIM: &str = "SELECT * FROM hookgate_claim($1, $2, $3, $4, $5)";

/// The live claim of a key and the seconds left on its lease, for `keys
/// get`. "Live" as of the transaction's start, as in `hookgate_claim`.
const SELECT_HELD: &str = "
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
    /// after the insert, in a new statement (so a new snapshot): a delivery
    /// that completed while we waited on its claim row is seen there, and
    /// our claim is taken back (`claim_key`).
    async fn claim(&self, key: &ScopedKey, fingerprint: &str, lease: Duration) -> Result<Claim> {
        let inner = &self.inner;
        let client = inner.client().await?;
        let token = LeaseToken::generate();
        let looked = claim_key(&client, key, &token, fingerprint, lease.as_secs_f64())
            .await
            .map_err(|e| inner.error(e))?;
        Ok(match looked {
            Looked::Fresh => Claim::Fresh(token),
            Looked::Held { stored, existing } => Claim::held(&stored, fingerprint, existing),
        })
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

/// What `claim_key` found: the key is the caller's now, or someone's
/// record or live claim holds it (with its stored fingerprint).
pub(super) enum Looked {
    Fresh,
    Held { stored: String, existing: Existing },
}

/// Claims `key` for `token` unless it is held: a duplicate in one round
/// trip, anything else in two (schema V4's `hookgate_claim`, which says
/// why). Inside a transaction a fresh claim's row stays locked until it
/// ends.
pub(super) async fn claim_key(
    client: &impl GenericClient,
    key: &ScopedKey,
    token: &LeaseToken,
    fingerprint: &str,
    lease_secs: f64,
) -> Result<Looked, tokio_postgres::Error> {
    if let Some((stored, snapshot, _)) = completed_for(client, key).await? {
        let existing = Existing::Completed(snapshot);
        return Ok(Looked::Held { stored, existing });
    }
    let statement = client.prepare_cached(CLAIM).await?;
    let params: [&(dyn ToSql + Sync); 5] =
        [&key.provider, &key.key, &token.0, &fingerprint, &lease_secs];
    let row = client.query_one(&statement, &params).await?;
    let existing = match row.get::<_, &str>(6) {
        "fresh" => return Ok(Looked::Fresh),
        "in_flight" => in_flight(row.get(5)),
        // "completed", the function's one other state: the record's
        // columns are in `SELECT_COMPLETED`'s order.
        _ => Existing::Completed(snapshot(&row)),
    };
    Ok(Looked::Held {
        stored: row.get(0),
        existing,
    })
}

/// The key's live completed record: its fingerprint, its answer and the
/// retention left.
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
fn in_flight(seconds_left: f64) -> Existing {
    let left = Duration::try_from_secs_f64(seconds_left).unwrap_or_default();
    Existing::InFlight {
        retry_after: left.max(Duration::from_secs(1)),
    }
}
