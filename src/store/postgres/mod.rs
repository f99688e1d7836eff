//! The postgres backend: the database strategy, shared by every replica.
//!
//! The gate is an `INSERT ... ON CONFLICT` into the small `hookgate_claims`
//! table; completed deliveries are recorded in `processed_events`,
//! partitioned per day and dropped a partition at a time past the retention
//! (`schema` explains the pair, `maintenance` the partitions).
//!
//! Opening connects nothing: the pool connects on first use, so the gate
//! starts (and answers 503) while the database is down. The schema is
//! migrated on the first connection that works, at open if the database is
//! up, else on the first operation.
//!
//! TLS (rustls) when the URL asks for it: `sslmode=require` (or libpq's
//! `verify-ca`/`verify-full`, which it means here) verifies the server's
//! certificate and name against the system roots plus `sslrootcert`, like
//! libpq's `verify-full`. A certificate that does not verify is refused,
//! never skipped.

mod maintenance;
mod operations;
mod outbox;
mod schema;

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use deadpool_postgres::{
    Client, Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime,
};
use tokio::sync::OnceCell;
use tokio::task::AbortHandle;
use tokio_postgres::config::SslMode;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::StoreError;
use crate::cores::{self, PerCore};
use crate::store::Result;

pub use self::maintenance::PartitionHealth;

/// Connections per store: enough for a burst of concurrent deliveries,
/// small beside PostgreSQL's default `max_connections` of 100 when several
/// replicas share one server. `OFF_CORES` of them are the pool of the main
/// runtime (the relay, maintenance, the admin port, releases at shutdown),
/// the rest shared out over the cores' pools, each of which may open at
/// least `MIN_PER_CORE`: 16 in all on up to 3 cores, 4 more per core
/// beyond.
const POOL_SIZE: usize = 16;
const OFF_CORES: usize = 4;
/// So that a core that takes most of the deliveries (one sender's HTTP/2
/// connection stays on one core) is not left one or two connections on a
/// machine with many cores.
const MIN_PER_CORE: usize = 4;
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(3600);
const MAINTENANCE_RETRY: Duration = Duration::from_secs(60);
/// One maintenance pass, DDL lock waits included, ends within this.
const MAINTENANCE_TIMEOUT: Duration = Duration::from_secs(120);

/// Dedupe state in PostgreSQL, shared by every replica pointing at it.
pub struct PostgresStore {
    inner: Arc<Inner>,
    maintainer: AbortHandle,
}

struct Inner {
    /// One pool for each core that serves deliveries and one (index 0) for
    /// every other runtime (`crate::cores::PerCore`). A connection's task is
    /// spawned on the runtime that makes it, so a core's round trips to
    /// PostgreSQL never leave its thread.
    pools: PerCore<Pool>,
    /// Set once the schema is migrated (and a first maintenance pass tried).
    ready: OnceCell<()>,
    /// How long completed records must be kept: the longest retention any
    /// provider asks for. Partitions are dropped only past it.
    retention: Duration,
    health: Mutex<PartitionHealth>,
    /// The URL's password (as written and percent-decoded), scrubbed from
    /// every error message.
    secrets: Vec<String>,
}

impl PostgresStore {
    /// Days after today that always have a partition.
    pub const DAYS_AHEAD: i32 = maintenance::DAYS_AHEAD;

    /// Prepares a store for `url` (`postgres://user:password@host:port/db`,
    /// or libpq's `key=value` form). Nothing is required of the server here:
    /// if it answers, the schema is migrated and partitions created now,
    /// else on the first operation, which reports it `Unavailable`
    /// meanwhile. `retention` must be the longest any provider uses;
    /// `op_timeout` bounds connecting and waiting for a pooled connection.
    pub async fn open(url: &str, op_timeout: Duration, retention: Duration) -> Result<Self> {
        let mut secrets: Vec<String> = password_in_text(url).into_iter().collect();
        let (url, root_cert) = tls_options(url);
        let mut config = tokio_postgres::Config::from_str(&url).map_err(|e| {
            StoreError::Unavailable(scrubbed(&format!("postgres: invalid URL: {e}"), &secrets))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(op_timeout);
        }
        if let Some(decoded) = config.get_password().filter(|p| !p.is_empty()) {
            secrets.push(String::from_utf8_lossy(decoded).into_owned());
        }
        let manager_config = ManagerConfig {
            // A dead connection shows as closed once its task notices; the
            // rare one that does not fails one operation, not more.
            recycling_method: RecyclingMethod::Fast,
        };
        // Without `require`, no TLS: `prefer` with a connector that verifies
        // would refuse the self-signed certificates `prefer` exists for.
        let tls = if config.get_ssl_mode() == SslMode::Require {
            let tls = crate::tls::client_config(root_cert.as_deref().map(Path::new))
                .map_err(|e| StoreError::Unavailable(format!("postgres: sslrootcert {e}")))?;
            Some(MakeRustlsConnect::new(tls))
        } else if root_cert.is_some() {
            return Err(StoreError::Unavailable(
                "postgres: sslrootcert is set but TLS is not required (add sslmode=verify-full)"
                    .into(),
            ));
        } else {
            None
        };
        let per_core = ((POOL_SIZE - OFF_CORES) / cores::available()).max(MIN_PER_CORE);
        let pools = PerCore::try_new(|core| {
            let (config, settings) = (config.clone(), manager_config.clone());
            let manager = match &tls {
                Some(tls) => Manager::from_config(config, tls.clone(), settings),
                None => Manager::from_config(config, NoTls, settings),
            };
            Pool::builder(manager)
                .max_size(if core == 0 { OFF_CORES } else { per_core })
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(op_timeout))
                .create_timeout(Some(op_timeout))
                .recycle_timeout(Some(op_timeout))
                .build()
        })
        .map_err(|e| StoreError::Unavailable(format!("postgres: cannot build the pool: {e}")))?;
        let inner = Arc::new(Inner {
            pools,
            ready: OnceCell::new(),
            retention,
            health: Mutex::new(PartitionHealth::default()),
            secrets,
        });
        match tokio::time::timeout(op_timeout, inner.ready()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "postgres store: not reachable at start; will retry");
            }
            Err(_) => tracing::warn!("postgres store: no answer at start; will retry"),
        }
        let maintainer = tokio::spawn(maintenance_loop(Arc::downgrade(&inner))).abort_handle();
        Ok(Self { inner, maintainer })
    }

    /// How the partitions stood at the last maintenance pass (for metrics).
    pub fn health(&self) -> PartitionHealth {
        self.inner.health()
    }

    /// Runs a maintenance pass now: partitions created ahead, those past
    /// retention dropped, stale claims purged, health refreshed. The
    /// background task does this every hour.
    pub async fn run_maintenance(&self) -> Result<()> {
        self.inner.maintain().await
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.maintainer.abort();
    }
}

impl Inner {
    /// A pooled connection to a migrated schema.
    async fn client(&self) -> Result<Client> {
        self.ready().await?;
        self.connection().await
    }

    /// A pooled connection and `sql` prepared on it (once per connection).
    async fn prepared(&self, sql: &str) -> Result<(Client, Statement)> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        Ok((client, statement))
    }

    /// Runs one statement; returns the rows it changed.
    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        let (client, statement) = self.prepared(sql).await?;
        let changed = client.execute(&statement, params).await;
        changed.map_err(|e| self.error(e))
    }

    /// Runs one statement that returns rows.
    async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>> {
        let (client, statement) = self.prepared(sql).await?;
        let rows = client.query(&statement, params).await;
        rows.map_err(|e| self.error(e))
    }

    /// A connection from the calling core's pool (the shared one off the
    /// cores), made on this runtime if none is idle.
    async fn connection(&self) -> Result<Client> {
        let got = self.pools.get().get().await;
        got.map_err(|e| self.pool_error(e))
    }

    /// Migrates the schema and runs a first maintenance pass, once. A failed
    /// pass is only logged: partitions missing at `complete` are created
    /// there, and the background task tries again.
    async fn ready(&self) -> Result<()> {
        self.ready
            .get_or_try_init(|| async {
                let mut client = self.connection().await?;
                let tx = client.transaction().await.map_err(|e| self.error(e))?;
                schema::migrate(&tx).await.map_err(|e| self.error(e))?;
                tx.commit().await.map_err(|e| self.error(e))?;
                match maintenance::run(&mut client, self.retention).await {
                    Ok(health) => self.set_health(health),
                    Err(e) => {
                        let error = self.error(e);
                        tracing::warn!(%error, "postgres store: first maintenance pass failed");
                    }
                }
                Ok::<_, StoreError>(())
            })
            .await?;
        Ok(())
    }

    async fn maintain(&self) -> Result<()> {
        let pass = async {
            let mut client = self.client().await?;
            maintenance::run(&mut client, self.retention)
                .await
                .map_err(|e| self.error(e))
        };
        let health = tokio::time::timeout(MAINTENANCE_TIMEOUT, pass)
            .await
            .map_err(|_| StoreError::Timeout(MAINTENANCE_TIMEOUT))??;
        self.set_health(health);
        Ok(())
    }

    fn health(&self) -> PartitionHealth {
        self.health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_health(&self, health: PartitionHealth) {
        *self.health.lock().unwrap_or_else(PoisonError::into_inner) = health;
    }

    fn error(&self, err: tokio_postgres::Error) -> StoreError {
        let code = err
            .code()
            .map(|c| format!(" [{}]", c.code()))
            .unwrap_or_default();
        StoreError::Unavailable(scrubbed(
            &format!("postgres: {}{code}", error_text(&err)),
            &self.secrets,
        ))
    }

    fn pool_error(&self, err: PoolError) -> StoreError {
        let message = match err {
            PoolError::Backend(e) => return self.error(e),
            PoolError::Timeout(_) => "postgres: no connection within the timeout".to_owned(),
            other => format!("postgres: {other}"),
        };
        StoreError::Unavailable(scrubbed(&message, &self.secrets))
    }
}

/// Runs maintenance every hour (every minute after a failure, or when the
/// pass at open did not happen) while the store lives; a weak reference, so
/// the task never keeps the pool open.
async fn maintenance_loop(inner: Weak<Inner>) {
    let mut next = match inner.upgrade() {
        Some(i) if i.health().last_maintenance.is_some() => MAINTENANCE_INTERVAL,
        Some(_) => MAINTENANCE_RETRY,
        None => return,
    };
    loop {
        tokio::time::sleep(next).await;
        let Some(inner) = inner.upgrade() else { return };
        next = match inner.maintain().await {
            Ok(()) => MAINTENANCE_INTERVAL,
            Err(error) => {
                tracing::warn!(%error, "postgres store: maintenance failed");
                MAINTENANCE_RETRY
            }
        };
    }
}

/// tokio-postgres's own message is terse ("db error", "error performing
/// TLS handshake"); the server's message, or the cause, is in the source.
fn error_text(err: &tokio_postgres::Error) -> String {
    if let Some(db) = err.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// Neither tokio-postgres nor the server quotes the password today;
/// scrubbing anyway keeps a future message from leaking it.
fn scrubbed(message: &str, secrets: &[String]) -> String {
    secrets.iter().fold(message.to_owned(), |m, secret| {
        m.replace(secret.as_str(), "***")
    })
}

/// Takes libpq's TLS options that tokio-postgres does not know out of the
/// connection string: `sslrootcert` (returned) and the `sslmode` values
/// `verify-ca` and `verify-full` (rewritten to `require`, which verifies as
/// much here).
fn tls_options(url: &str) -> (String, Option<String>) {
    let is_url = url.contains("://");
    let (head, options, separator) = match url.split_once('?') {
        Some((head, query)) if is_url => (format!("{head}?"), query, "&"),
        _ if is_url => return (url.to_owned(), None),
        _ => (String::new(), url, " "),
    };
    let mut root_cert = None;
    let mut kept = Vec::new();
    for option in options.split(separator).filter(|o| !o.is_empty()) {
        match option.split_once('=') {
            // A URL's values are percent-encoded; a key=value string's not.
            Some(("sslrootcert", path)) if is_url => {
                root_cert = form_urlencoded::parse(format!("p={path}").as_bytes())
                    .next()
                    .map(|(_, p)| p.into_owned());
            }
            Some(("sslrootcert", path)) => root_cert = Some(path.to_owned()),
            Some(("sslmode", "verify-ca" | "verify-full")) => kept.push("sslmode=require"),
            _ => kept.push(option),
        }
    }
    (format!("{head}{}", kept.join(separator)), root_cert)
}

/// The password written in a URL or `key=value` string, found without
/// parsing it (for messages about a string that does not parse).
fn password_in_text(url: &str) -> Option<String> {
    let from_url = url.split_once("://").and_then(|(_, rest)| {
        let authority = rest.split(['/', '?', '#']).next()?;
        let userinfo = authority.rsplit_once('@')?.0;
        userinfo.split_once(':').map(|(_, p)| p.to_owned())
    });
    let from_pairs = url
        .split(['&', '?', ' '])
        .find_map(|part| part.strip_prefix("password="))
        .map(str::to_owned);
    from_url.or(from_pairs).filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::{password_in_text, tls_options};

    #[test]
    fn tls_options_are_taken_out_of_urls_and_key_value_strings() {
        let (url, root) = tls_options(
            "postgres://u:p@db:5432/h?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=gate",
        );
        assert_eq!(
            url,
            "postgres://u:p@db:5432/h?sslmode=require&application_name=gate"
        );
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));

        let (kv, root) = tls_options("host=db sslmode=verify-ca sslrootcert=/etc/ca.pem user=u");
        assert_eq!(kv, "host=db sslmode=require user=u");
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));

        let plain = "postgres://u@db/h";
        assert_eq!(tls_options(plain), (plain.to_owned(), None));
    }

    #[test]
    fn passwords_are_found_without_parsing() {
        assert_eq!(
            password_in_text("postgres://u:s3cret@db:x/h").as_deref(),
            Some("s3cret")
        );
        assert_eq!(
            password_in_text("host=db password=s3cret").as_deref(),
            Some("s3cret")
        );
        assert_eq!(password_in_text("postgres://u@db/h"), None);
    }
}
