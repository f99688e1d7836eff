//! A real Redis Cluster on loopback: six cluster-enabled `redis-server`
//! processes joined by `redis-cli --cluster create` into three masters with
//! one replica each, append-only, failing a master over two seconds after
//! it stops answering.
//!
//! Each node runs under a small shell that kills it when the shell's stdin
//! closes, which happens when the node is dropped or killed, and also when
//! the test process dies however it dies: the cluster shared by many tests
//! (`shared`), which lives in a static and is never dropped, leaves no
//! process behind.

use std::io::ErrorKind;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::port::free_port;

const NODES: usize = 6;
const READY_TIMEOUT: Duration = Duration::from_secs(30);

struct Node {
    port: u16,
    _dir: TempDir,
    shell: Option<(Child, ChildStdin)>,
}

impl Node {
    fn start() -> Self {
        let port = free_bus_port();
        let dir = tempfile::tempdir().expect("create a temp dir for a cluster node");
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg("redis-server \"$@\" & pid=$!; read _; kill -9 $pid; wait $pid")
            .arg("sh")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--cluster-node-timeout", "2000"])
            // A replica's first sync starts at once (the default waits 5 s
            // for more replicas): one not yet synced cannot take over.
            .args(["--repl-diskless-sync-delay", "0"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start sh");
        let stdin = shell.stdin.take().expect("the shell's stdin");
        let node = Self {
            port,
            _dir: dir,
            shell: Some((shell, stdin)),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        while cli(port, &["PING"]).as_deref() != Some("PONG") {
            assert!(
                Instant::now() < deadline,
                "cluster node on port {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        node
    }

    fn kill(&mut self) {
        if let Some((mut shell, stdin)) = self.shell.take() {
            drop(stdin);
            let _ = shell.wait();
        }
    }

    fn alive(&self) -> bool {
        self.shell.is_some()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Six nodes in one cluster, owned by a test (or by `shared`).
pub struct RedisCluster {
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits until every node
    /// says it is ok. Panics (never skips) when redis is not installed.
    pub fn start() -> Self {
        ensure_installed();
        let nodes: Vec<Node> = (0..NODES).map(|_| Node::start()).collect();
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        create.args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = create.output().expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_until_ok();
        cluster
    }

    /// One cluster for every test that only reads and writes its own keys
    /// (each uses its own prefix); started on first use.
    pub fn shared() -> &'static Self {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(Self::start)
    }

    /// A seed URL: any node; the client discovers the others.
    pub fn url(&self) -> String {
        let node = self.nodes.iter().find(|n| n.alive()).expect("a live node");
        format!("redis://127.0.0.1:{}", node.port)
    }

    /// The first node's URL, for the gates of a fault test: `kill_a_master`
    /// never kills it.
    pub fn seed_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.nodes[0].port)
    }

    /// SIGKILLs a master other than the seed node, once its replica has
    /// everything the master acknowledged; the replica takes over one node
    /// timeout (2 s) later. Returns the killed node's port.
    ///
    /// Replication is asynchronous: a master killed at a random instant
    /// takes its last unreplicated writes with it, and an event whose mark
    /// was among them is forwarded again (README, Redis Cluster). How many
    /// depends on how far the replica lagged, which on a loaded machine was
    /// once 74 events of a chaos run. That is Redis's boundary, stated
    /// there, not the gate's: the fault modelled here is the failover.
    pub fn kill_a_master(&mut self) -> u16 {
        let seed = self.nodes[0].port;
        let victim = self
            .masters()
            .into_iter()
            .find(|&p| p != seed)
            .expect("a master besides the seed");
        self.pause_until_replicated(victim);
        self.kill(victim);
        victim
    }

    /// Stops client writes on the master on `port` (`CLIENT PAUSE WRITE`)
    /// and waits until its replica has processed everything the master
    /// wrote. The master's periodic PING to its replicas still moves its
    /// offset, so the master's is read first: a PING after it can only
    /// delay the return, never let it come early.
    fn pause_until_replicated(&self, port: u16) {
        let master_port = format!("master_port:{port}");
        let replica = self
            .nodes
            .iter()
            .filter(|n| n.alive() && n.port != port)
            .find(|n| {
                cli(n.port, &["INFO", "replication"])
                    .is_some_and(|info| info.lines().any(|l| l.trim() == master_port))
            })
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no live replica of the master on {port}"));
        cli(port, &["CLIENT", "PAUSE", "30000", "WRITE"]).expect("pause the master's writes");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let master = cli(port, &["INFO", "replication"]).unwrap_or_default();
            let target = info_field(&master, "master_repl_offset");
            let reached = cli(replica, &["INFO", "replication"])
                .and_then(|r| info_field(&r, "slave_repl_offset"));
            if let (Some(target), Some(reached)) = (target, reached)
                && reached >= target
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica of {port} did not catch up: master at {target:?}, replica at {reached:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The ports of the live nodes that are masters now.
    pub fn masters(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.alive())
            .filter(|n| {
                cli(n.port, &["ROLE"]).is_some_and(|role| role.lines().next() == Some("master"))
            })
            .map(|n| n.port)
            .collect()
    }

    /// How many keys the node on `port` holds.
    pub fn keys_on(&self, port: u16) -> u64 {
        cli(port, &["DBSIZE"])
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Kills the node on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.kill();
        }
    }

    /// Waits until every live node reports `cluster_state:ok`, three
    /// masters cover the slots (after a failover: the promoted replica) and
    /// every live replica is in sync with its master.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ok = self.nodes.iter().filter(|n| n.alive()).all(|n| {
                let state = cli(n.port, &["CLUSTER", "INFO"]);
                let replication = cli(n.port, &["INFO", "replication"]).unwrap_or_default();
                state.is_some_and(|info| info.contains("cluster_state:ok"))
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            });
            if ok && self.masters().len() == 3 {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The number after `name:` in `INFO` output.
fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.parse().ok())
}

/// `redis-cli -p port args...`'s output, or None when the node does not
/// answer.
fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
}

fn ensure_installed() {
    for binary in ["redis-server", "redis-cli"] {
        if let Err(e) = Command::new(binary).arg("--version").output()
            && e.kind() == ErrorKind::NotFound
        {
            panic!(
                "{binary} is not installed; these tests need it: apt-get install -y redis-server"
            );
        }
    }
}

/// A free port whose cluster bus port (port + 10000) is free too.
fn free_bus_port() -> u16 {
    loop {
        let port = free_port();
        if port <= u16::MAX - 10_000
            && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
}
