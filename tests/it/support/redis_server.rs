//! A real `redis-server` for tests: on a free port, in a temp dir, with no
//! persistence unless asked (`start_with_aof`), killed on drop. `kill` and
//! `restart` (same port) let fault tests take it away and bring it back
//! under a running store.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::support::port::free_port;

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Free ports tried before giving up: a port released by `free_port` can
/// be taken by another test's server before this one binds it.
const START_ATTEMPTS: usize = 5;

/// The server exited because its port was taken.
struct PortTaken;

/// A running (or deliberately killed) `redis-server` owned by one test.
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    /// Append-only persistence, fsynced on every write: a killed server
    /// comes back with every acknowledged write.
    aof: bool,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    /// Panics (never skips) when the binary is missing.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Like `start`, with append-only persistence (`appendfsync always`):
    /// `kill` then `restart` brings back every acknowledged write, as a
    /// production redis with AOF would after a crash.
    pub fn start_with_aof() -> Self {
        Self::start_with(true)
    }

    fn start_with(aof: bool) -> Self {
        let mut server = Self {
            port: 0,
            dir: tempfile::tempdir().expect("create a temp dir for redis-server"),
            child: None,
            aof,
        };
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            if server.spawn().is_ok() {
                return server;
            }
        }
        panic!("redis-server found {START_ATTEMPTS} free ports taken before it bound them");
    }

    /// `redis://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether a restart brings back what was written (`start_with_aof`).
    pub fn persists(&self) -> bool {
        self.aof
    }

    /// Kills the server and waits for it to exit; the port stays reserved
    /// for `restart`.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (killing it first if needed),
    /// empty unless started with `start_with_aof`.
    pub fn restart(&mut self) {
        self.kill();
        if self.spawn().is_err() {
            panic!("port {} was taken while redis-server was down", self.port);
        }
    }

    fn spawn(&mut self) -> Result<(), PortTaken> {
        let log = self.dir.path().join("redis.log");
        // A restart appends to the log: only what follows is this start's.
        let logged_before = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        let persistence: &[&str] = if self.aof {
            &["--appendonly", "yes", "--appendfsync", "always"]
        } else {
            &["--appendonly", "no"]
        };
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--save", "", "--bind", "127.0.0.1"])
            .args(persistence)
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == ErrorKind::NotFound => panic!(
                "redis-server is not installed; these tests need it: \
                 apt-get install -y redis-server"
            ),
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        self.child = Some(child);
        self.wait_until_ready(&log, logged_before)
    }

    /// Ready when this server says so in its log and answers PING: a PING
    /// alone could be answered by another test's server on the port.
    fn wait_until_ready(
        &mut self,
        log: &std::path::Path,
        logged_before: usize,
    ) -> Result<(), PortTaken> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let all = std::fs::read(log).unwrap_or_default();
            let said = String::from_utf8_lossy(all.get(logged_before..).unwrap_or_default());
            if said.contains("Ready to accept connections") && self.answers_ping() {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() && said.contains("Address already in use") {
                self.child = None;
                return Err(PortTaken);
            }
            if exited.is_some() || Instant::now() > deadline {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                self.kill();
                panic!(
                    "redis-server on port {} did not start ({exited:?}); log:\n{log}",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
