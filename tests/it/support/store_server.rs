//! What the fault tests need of a store's server, whichever it is: start
//! it, take it away, bring it back on the same port. One test body, generic
//! over this trait, then runs against redis-server and PostgreSQL alike.

use crate::support::postgres_server::PostgresServer;
use crate::support::redis_cluster::RedisCluster;
use crate::support::redis_server::RedisServer;

pub trait StoreServer: Send + 'static {
    /// `store.backend` for this server.
    const BACKEND: &'static str;
    /// The gate's `store.timeout` in fault tests. Postgres gets longer: a
    /// new connection is a TCP handshake plus a backend fork, on a loaded
    /// machine.
    const GATE_TIMEOUT: &'static str;
    /// More lines of the gate's `[store]` section for this server.
    const STORE_EXTRA: &'static str = "";
    /// The claims' lease in the chaos run: longer than the server's outage,
    /// so a lease never runs out while its mark waits for the store.
    const LEASE_SECS: u64 = 5;

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

/// A Redis Cluster: "killing the server" kills one master (never the seed
/// node the gates were given), and "restarting" waits until its replica
/// took over, so a fault test sees a failover where it saw a restart.
impl StoreServer for RedisCluster {
    const BACKEND: &'static str = "redis";
    const GATE_TIMEOUT: &'static str = "500ms";
    const STORE_EXTRA: &'static str = "cluster = true";
    /// A failover takes the node timeout (2 s) and an election: up to 5 s
    /// on a loaded machine.
    const LEASE_SECS: u64 = 15;

    fn start() -> Self {
        RedisCluster::start()
    }

    fn url(&self) -> String {
        self.seed_url()
    }

    fn kill(&mut self) {
        self.kill_a_master();
    }

    fn restart(&mut self) {
        self.wait_until_ok();
    }

    /// A promoted replica has what its master had replicated to it, which
    /// `kill_a_master` lets be everything: it pauses the master's writes
    /// until the replica has caught up (replication is asynchronous, and
    /// the last instant's writes of a master killed unawares are lost).
    fn persists(&self) -> bool {
        true
    }
}
