//! A real PostgreSQL for tests: a cluster initialized in a temp dir (trust
//! auth, no fsync), served on a free port with its unix socket in the same
//! dir, stopped on drop. `kill` and `restart` (same port, same data) let
//! fault tests take it away and bring it back under a running store.
//! `start_tls` also serves TLS, with a self-signed certificate for
//! 127.0.0.1 that `tls_root` names.
//!
//! initdb and postgres refuse to run as root, and CI runs as root: then the
//! temp dir is handed to the `postgres` user (which Debian's package
//! creates; `nobody` otherwise) and the server tools run as that user.

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tempfile::TempDir;

use crate::support::port::free_port;

const INSTALL: &str = "apt-get install -y postgresql";
/// The database the store under test uses.
const DATABASE: &str = "hookgate";
/// A port can be taken between `free_port` and the server binding it.
const START_ATTEMPTS: usize = 3;

/// A running (or deliberately killed) PostgreSQL owned by one test.
pub struct PostgresServer {
    bin: PathBuf,
    dir: TempDir,
    port: u16,
    /// The unprivileged user the server runs as, when the tests run as root.
    run_as: Option<&'static str>,
    running: bool,
    tls: bool,
}

impl PostgresServer {
    /// Initializes a cluster, starts it on a free port, creates the test
    /// database. Panics (never skips) when PostgreSQL is not installed.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Like `start`, and the server also accepts TLS (plain connections
    /// still work, for looking at it).
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    /// The certificate the TLS server presents, to trust as a root.
    pub fn tls_root(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    fn start_with(tls: bool) -> Self {
        let bin = bin_dir();
        let dir = tempfile::tempdir().expect("create a temp dir for postgres");
        if tls {
            let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
            let generated = rcgen::generate_simple_self_signed(names).unwrap();
            std::fs::write(dir.path().join("server.crt"), generated.cert.pem()).unwrap();
            let key = dir.path().join("server.key");
            std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
            // The server refuses a key others can read.
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let run_as = running_as_root().then(unprivileged_user);
        if let Some(user) = run_as {
            let chown = Command::new("chown")
                .arg("-R")
                .arg(user)
                .arg(dir.path())
                .output();
            check("chown", chown);
        }
        let mut server = Self {
            bin,
            dir,
            port: 0,
            run_as,
            running: false,
            tls,
        };
        let initdb = server
            .tool("initdb")
            .arg("-D")
            .arg(server.data())
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .args(["--no-sync", "--no-instructions"])
            .output();
        check("initdb", initdb);

        for attempt in 1..=START_ATTEMPTS {
            server.port = free_port();
            match server.try_start() {
                Ok(()) => break,
                Err(log) if attempt == START_ATTEMPTS => {
                    panic!(
                        "postgres did not start on port {}; log:\n{log}",
                        server.port
                    )
                }
                Err(_) => continue,
            }
        }
        let createdb = Command::new(server.bin.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
            .args(["-U", "postgres", DATABASE])
            .output();
        check("createdb", createdb);
        server
    }

    /// `postgres://postgres@127.0.0.1:{port}/hookgate` (trust auth: no password).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// Always: a commit acknowledged before `kill` is there after `restart`
    /// (see `try_start`).
    pub fn persists(&self) -> bool {
        true
    }

    /// Stops the server at once (SIGQUIT: no checkpoint, like a crash) and
    /// waits until it is gone. Committed data survives for `restart`.
    pub fn kill(&mut self) {
        if !self.running {
            return;
        }
        self.running = false;
        let _ = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }

    /// Starts the server again on the same port, on the same data.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.try_start() {
            panic!(
                "postgres did not restart on port {}; log:\n{log}",
                self.port
            );
        }
    }

    /// Starts the server and waits (`pg_ctl -w`) until it accepts
    /// connections; on failure, returns the server's log.
    fn try_start(&mut self) -> Result<(), String> {
        let log = self.dir.path().join("postgres.log");
        // fsync=off loses nothing when only the server process dies (the
        // kernel still has the pages); synchronous_commit stays on, so a
        // commit acknowledged before `kill` is there after `restart`.
        let dir = self.dir.path().display();
        let mut options = format!(
            "-p {} -k '{dir}' -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off",
            self.port,
        );
        if self.tls {
            options += &format!(
                " -c ssl=on -c ssl_cert_file='{dir}/server.crt' -c ssl_key_file='{dir}/server.key'"
            );
        }
        let started = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "30", "-o", &options, "start"])
            .output();
        match started {
            Ok(out) if out.status.success() => {
                self.running = true;
                Ok(())
            }
            Ok(_) => {
                // pg_ctl may have left a postmaster behind that failed later.
                self.running = true;
                self.kill();
                Err(std::fs::read_to_string(&log).unwrap_or_default())
            }
            Err(e) => panic!("cannot run pg_ctl: {e}"),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A server-side tool, run as the unprivileged user when we are root.
    fn tool(&self, name: &str) -> Command {
        let program = self.bin.join(name);
        let mut command = match self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(program);
                c
            }
            None => Command::new(program),
        };
        // The user must be able to enter its working directory.
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        command
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The newest `/usr/lib/postgresql/{version}/bin` (Debian's layout), else
/// the directory on PATH that has `initdb`.
fn bin_dir() -> PathBuf {
    let has_tools = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .max();
    if let Some((_, bin)) = debian {
        return bin;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|dir| has_tools(dir))
        .unwrap_or_else(|| {
            panic!("PostgreSQL (initdb, pg_ctl) is not installed; these tests need it: {INSTALL}")
        })
}

/// The uid owning `/proc/self` is this process's.
fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn unprivileged_user() -> &'static str {
    let exists = |user: &str| {
        Command::new("id")
            .arg("-u")
            .arg(user)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if exists("postgres") {
        "postgres"
    } else {
        "nobody"
    }
}

/// Panics with the tool's output unless it succeeded.
fn check(what: &str, output: std::io::Result<Output>) {
    match output {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            panic!("{what}: not found; these tests need PostgreSQL: {INSTALL}")
        }
        Err(e) => panic!("cannot run {what}: {e}"),
    }
}
