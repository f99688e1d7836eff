//! The tables, and the migrations that create and evolve them.
//!
//! Two tables, because PostgreSQL cannot enforce `UNIQUE (provider,
//! provider_event_id)` on a table partitioned by `received_at` (a partitioned
//! table's unique constraints must include the partition key):
//!
//! - `hookgate_claims`, small and unpartitioned, is the gate. Its primary key
//!   `(provider, provider_event_id)` is what makes a claim exclusive: the
//!   claim is an `INSERT ... ON CONFLICT`. It holds only keys in flight; a
//!   row is deleted when its holder completes or releases it.
//! - `processed_events`, partitioned by day of `received_at`, is the record:
//!   one row per completed delivery, holding the response snapshot replayed
//!   to duplicates, kept for the retention and then dropped a whole partition
//!   at a time. Its primary key `(provider, provider_event_id, received_at)`
//!   gives every partition the index the duplicate lookup uses.
//!
//! Why the pair keeps one event id unique across the whole retention window:
//! a record is written only by `complete`, in the same statement that deletes
//! the holder's claim row, so at most one delivery per key can write one; and
//! a new claim is `Fresh` only if, after its insert into `hookgate_claims`
//! succeeded, a fresh look finds no live record (see `PostgresStore::claim`).

use deadpool_postgres::Transaction;

/// `pg_advisory_xact_lock` key serializing migrations across replicas that
/// start at once ("hookgate" in ASCII).
const MIGRATION_LOCK: i64 = 0x686f_6f6b_6761_7465;

/// Applied in order, each once, recorded in `hookgate_schema_migrations`.
/// Never edit a released entry: append a new one.
const MIGRATIONS: &[(i32, &str)] = &[(1, V1), (2, V2), (3, V3), (4, V4)];

const V1: &str = "
CREATE TABLE hookgate_claims (
    provider          text        NOT NULL,
    provider_event_id text        NOT NULL,
    lease_token       text        NOT NULL,
    fingerprint       text        NOT NULL,
    received_at       timestamptz NOT NULL,
    lease_expires_at  timestamptz NOT NULL,
    PRIMARY KEY (provider, provider_event_id)
);

-- `state` is 'completed', or 'forgotten' once an operator ran `hookgate keys
-- forget` (the row stays as an audit trail, no longer replayed). The lease
-- columns say which claim completed the event and until when it was held.
CREATE TABLE processed_events (
    provider              text        NOT NULL,
    provider_event_id     text        NOT NULL,
    received_at           timestamptz NOT NULL,
    completed_at          timestamptz NOT NULL,
    expires_at            timestamptz NOT NULL,
    state                 text        NOT NULL CHECK (state IN ('completed', 'forgotten')),
    lease_token           text        NOT NULL,
    lease_expires_at      timestamptz NOT NULL,
    fingerprint           text        NOT NULL,
    response_status       integer     NOT NULL,
    response_content_type text,
    response_body         bytea       NOT NULL,
    PRIMARY KEY (provider, provider_event_id, received_at)
) PARTITION BY RANGE (received_at);
";

/// Whether the stored answer is all the app said (a constant default: no
/// table rewrite, on the parent and every partition at once).
const V2: &str = "
ALTER TABLE processed_events ADD COLUMN response_truncated boolean NOT NULL DEFAULT false;
";

/// Queue mode's outbox (SPEC section 1b): one row per accepted event,
/// unpartitioned (delivered rows are purged past their retention in small
/// batches by maintenance; dead ones stay until an operator purges them).
/// A leased row has a token and an expiry; an expired lease is due again.
const V3: &str = "
CREATE TABLE hookgate_outbox (
    id               bigserial   PRIMARY KEY,
    provider         text        NOT NULL,
    event_key        text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('pending', 'delivered', 'dead')),
    method           text        NOT NULL,
    target           text        NOT NULL,
    headers          bytea       NOT NULL,
    body             bytea       NOT NULL,
    received_at      timestamptz NOT NULL,
    due_at           timestamptz NOT NULL,
    attempts         integer     NOT NULL DEFAULT 0,
    lease_token      text,
    lease_expires_at timestamptz,
    last_status      integer,
    last_error       text,
    finished_at      timestamptz,
    expires_at       timestamptz NOT NULL
);
CREATE INDEX hookgate_outbox_due ON hookgate_outbox (due_at) WHERE state = 'pending';
CREATE INDEX hookgate_outbox_key ON hookgate_outbox (provider, event_key);
CREATE INDEX hookgate_outbox_received ON hookgate_outbox (received_at);
CREATE INDEX hookgate_outbox_expired ON hookgate_outbox (expires_at) WHERE state = 'delivered';
";

/// A claim's insert and what follows it in one call, so one round trip:
/// the gate's CPU and latency per fresh event on this store were mostly its
/// six round trips (a lookup, `BEGIN`, the insert, the lookup again,
/// `COMMIT`, then the mark), four of them the claim's after its first
/// lookup. That lookup stays a plain statement before the call (`claim_key`
/// in `operations.rs`): the common duplicate ends there, and a version that
/// made it inside the call too cost PostgreSQL more per duplicate than it
/// saved (docs/BENCHMARKS.md, The overhead work). In order, as
/// `PostgresStore::claim` explains:
///
/// 1. the claim's insert, which waits on whoever holds the key's row; when
///    its WHERE fails, the holder's live claim (locked until the caller's
///    transaction ends);
/// 2. the key's live completed record: a PL/pgSQL function that is
///    `VOLATILE` takes a new snapshot for each statement, so a delivery that
///    completed while the insert waited is seen here, and the claim just
///    taken is deleted (a row it may have replaced had expired, which every
///    reader treats as no claim at all).
///
/// One row: the stored fingerprint, the record's answer and retention left
/// (`completed`), or the lease left (`in_flight`), and the state; `fresh`
/// when the claim is the caller's. The lookups' text is `SELECT_COMPLETED`'s
/// and `SELECT_HELD`'s in `operations.rs`.
const V4: &str = "
CREATE FUNCTION hookgate_claim(
    p_provider text, p_event_id text, p_token text, p_fingerprint text, p_lease float8)
RETURNS TABLE (
    fingerprint text, response_status integer, response_content_type text,
    response_body bytea, response_truncated boolean, seconds_left float8, state text)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
BEGIN
    INSERT INTO hookgate_claims AS c
        (provider, provider_event_id, lease_token, fingerprint, received_at, lease_expires_at)
    VALUES (p_provider, p_event_id, p_token, p_fingerprint, clock_timestamp(),
            clock_timestamp() + make_interval(secs => p_lease))
    ON CONFLICT (provider, provider_event_id) DO UPDATE
    SET lease_token = excluded.lease_token,
        fingerprint = excluded.fingerprint,
        received_at = excluded.received_at,
        lease_expires_at = excluded.lease_expires_at
    WHERE c.lease_expires_at <= now();
    IF NOT FOUND THEN
        RETURN QUERY
            SELECT c.fingerprint, NULL::integer, NULL::text, NULL::bytea, NULL::boolean,
                   EXTRACT(EPOCH FROM c.lease_expires_at - clock_timestamp())::float8,
                   'in_flight'::text
            FROM hookgate_claims c
            WHERE c.provider = p_provider AND c.provider_event_id = p_event_id
              AND c.lease_expires_at > now();
        IF NOT FOUND THEN
            RAISE EXCEPTION 'hookgate_claim: a locked claim vanished';
        END IF;
        RETURN;
    END IF;

    RETURN QUERY
        SELECT e.fingerprint, e.response_status, e.response_content_type, e.response_body,
               e.response_truncated, EXTRACT(EPOCH FROM e.expires_at - now())::float8,
               'completed'::text
        FROM processed_events e
        WHERE e.provider = p_provider AND e.provider_event_id = p_event_id
          AND e.state = 'completed' AND e.expires_at > now()
        ORDER BY e.completed_at DESC
        LIMIT 1;
    IF FOUND THEN
        DELETE FROM hookgate_claims c
        WHERE c.provider = p_provider AND c.provider_event_id = p_event_id
          AND c.lease_token = p_token;
        RETURN;
    END IF;

    RETURN QUERY SELECT NULL::text, NULL::integer, NULL::text, NULL::bytea, NULL::boolean,
                        NULL::float8, 'fresh'::text;
END
$fn$;
";

/// Brings the schema up to date; safe to run from every replica at every
/// start. The advisory lock makes concurrent starts take turns, so two
/// replicas never race on the same `CREATE TABLE`.
pub(super) async fn migrate(tx: &Transaction<'_>) -> Result<(), tokio_postgres::Error> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS hookgate_schema_migrations (
             version    integer     PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let applied: i32 = tx
        .query_one(
            "SELECT COALESCE(max(version), 0) FROM hookgate_schema_migrations",
            &[],
        )
        .await?
        .get(0);
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > applied) {
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO hookgate_schema_migrations (version) VALUES ($1)",
            &[version],
        )
        .await?;
        tracing::info!(version, "postgres store: schema migrated");
    }
    Ok(())
}
