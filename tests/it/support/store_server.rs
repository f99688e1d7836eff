//! What the fault tests need of a store's server, whichever it is: start
//! it, take it away, bring it back on the same port. One test body, generic
//! over this trait, then runs against redis-server and PostgreSQL alike.

use crate::support::postgres_server::PostgresServer;
use crate::support::redis_server::RedisServer;

pub trait StoreServer: Send + 'static {
    /// `store.backend` for this server.
    const BACKEND: &'static str;
    /// The gate's `store.timeout` in fault tests. Postgres gets longer: a
    /// new connection is a TCP handshake plus a backend fork, on a loaded
    /// machine.
    const GATE_TIMEOUT: &'static str;

    /// Starts a fresh server; panics (never skips) when it is not installed.
    fn start() -> Self;
    fn url(&self) -> String;
    /// Takes the server away at once.
    fn kill(&mut self);
    /// Brings it back on the same port; returns once it answers.
    fn restart(&mut self);
    /// Whether `restart` brings back what was written before `kill`.
    fn persists(&self) -> bool;
}

/// The trait over a server's own methods of the same names.
macro_rules! store_server {
    ($server:ty, $backend:literal, $timeout:literal) => {
        impl StoreServer for $server {
            const BACKEND: &'static str = $backend;
            const GATE_TIMEOUT: &'static str = $timeout;

            fn start() -> Self {
                <$server>::start()
            }

            fn url(&self) -> String {
                <$server>::url(self)
            }

            fn kill(&mut self) {
                <$server>::kill(self)
            }

            fn restart(&mut self) {
                <$server>::restart(self)
            }

            fn persists(&self) -> bool {
                <$server>::persists(self)
            }
        }
    };
}

store_server!(RedisServer, "redis", "500ms");
store_server!(PostgresServer, "postgres", "1s");
