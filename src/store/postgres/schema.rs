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
const MIGRATIONS: &[(i32, &str)] = &[(1, V1), (2, V2), (3, V3)];

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
