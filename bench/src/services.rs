//! The processes a run starts: the upstream, nginx, redis-server and one
//! gate (or node handler) per row, each on a free loopback port, each stopped (SIGTERM, then
//! SIGKILL) when dropped.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::requests::{PATH, SECRET};

const READY_WITHIN: Duration = Duration::from_secs(20);
/// How long [`Service::stop`] waits after SIGTERM before SIGKILL.
const STOP_WITHIN: Duration = Duration::from_secs(10);
/// A gate under callgrind runs 30 to 50 times slower, and valgrind
/// translates each function the first time it runs: with instrumentation
/// off it became ready in 3.7 s against 0.07 s (a quiet 2-core machine).
const VALGRIND_READY_WITHIN: Duration = Duration::from_secs(120);
const VALGRIND_STOP_WITHIN: Duration = Duration::from_secs(60);

/// A child process serving on `port`.
pub struct Service {
    pub name: String,
    pub port: u16,
    /// The gate's admin listener (`/metrics`).
    pub admin: Option<u16>,
    /// A gate under callgrind: the file it dumps to (each dump adds `.N`).
    callgrind: Option<PathBuf>,
    stop_within: Duration,
    child: Child,
}

impl Service {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's peak resident set (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The file-backed part of the resident set now (`RssFile`: mostly the
    /// executable's own code, mapped from the page cache), in KiB.
    pub fn file_rss_kib(&self) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssFile:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    fn spawn(name: &str, port: u16, command: &mut Command, log: &Path) -> io::Result<Self> {
        let out = fs::File::create(log)?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                io::Error::new(e.kind(), format!("cannot start {name} ({command:?}): {e}"))
            })?;
        Ok(Self {
            name: name.to_owned(),
            port,
            admin: None,
            callgrind: None,
            stop_within: STOP_WITHIN,
            child,
        })
    }

    /// Waits until `probe` succeeds; fails if the process exits or the
    /// wait runs out, naming the log to read.
    fn wait_ready(&mut self, log: &Path, probe: impl Fn(SocketAddr) -> bool) -> io::Result<()> {
        let within = match self.callgrind {
            Some(_) => VALGRIND_READY_WITHIN,
            None => READY_WITHIN,
        };
        let deadline = Instant::now() + within;
        loop {
            if probe(self.addr()) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "{} exited ({status}) {EXITED_BEFORE_READY}; see {}",
                    self.name,
                    log.display()
                )));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{} not ready within {within:?}; see {}",
                    self.name,
                    log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether this is a gate under callgrind.
    pub fn counts_instructions(&self) -> bool {
        self.callgrind.is_some()
    }

    /// Switches callgrind's instrumentation on: from here it counts.
    pub fn count_instructions(&self) -> io::Result<()> {
        self.callgrind_control(&["-i", "on"])
    }

    /// Dumps what callgrind counted since [`Self::count_instructions`],
    /// switches it off, and returns the instructions of that dump (its
    /// `totals:` line, every thread's) and the dump's path.
    pub fn instructions_counted(&self) -> io::Result<(u64, PathBuf)> {
        let out = self
            .callgrind
            .as_deref()
            .ok_or_else(|| io::Error::other(format!("{} is not under callgrind", self.name)))?;
        let before = newest_dump(out).map(|(n, _)| n);
        self.callgrind_control(&["-d"])?;
        self.callgrind_control(&["-i", "off"])?;
        // callgrind_control returns once the dump is written; its file is
        // the one numbered after any earlier dump.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((n, path)) = newest_dump(out)
                && Some(n) != before
                && let Some(total) = dump_total(&path)
            {
                return Ok((total, path));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "no callgrind dump with a totals line beside {}",
                    out.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn callgrind_control(&self, args: &[&str]) -> io::Result<()> {
        let pid = self.pid().to_string();
        let output = Command::new("callgrind_control")
            .args(args)
            .arg(&pid)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run callgrind_control: {e}")))?;
        let text = String::from_utf8_lossy(&output.stdout);
        if output.status.success() && text.contains("OK") {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "callgrind_control {} {pid} failed ({}): {}{}",
                args.join(" "),
                output.status,
                text.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    /// SIGTERM (the gate and nginx shut down gracefully), SIGKILL after 10 s
    /// (60 s for a gate under callgrind).
    pub fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let deadline = Instant::now() + self.stop_within;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The highest-numbered dump callgrind wrote for `out` (`out.1`, `out.2`, ...).
fn newest_dump(out: &Path) -> Option<(u32, PathBuf)> {
    let dir = out.parent()?;
    let stem = format!("{}.", out.file_name()?.to_str()?);
    fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let n = name.strip_prefix(&stem)?.parse().ok()?;
            Some((n, dir.join(name)))
        })
        .max_by_key(|(n, _)| *n)
}

/// A callgrind dump's total of its first event (instructions, `Ir`).
fn dump_total(path: &Path) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .or_else(|| text.lines().find_map(|l| l.strip_prefix("summary:")))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A port nothing listens on right now.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// This binary's `upstream` subcommand; with `hold`, it keeps every POST
/// waiting until [`release`].
pub fn upstream(dir: &Path, name: &str, threads: usize, hold: bool) -> io::Result<Service> {
    let port = free_port()?;
    let log = dir.join(format!("{name}.log"));
    let mut command = Command::new(std::env::current_exe()?);
    command.args([
        "upstream",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--threads",
        &threads.to_string(),
    ]);
    if hold {
        command.arg("--hold");
    }
    let mut service = Service::spawn(name, port, &mut command, &log)?;
    service.wait_ready(&log, |a| get(a, "/", "127.0.0.1") == Some(200))?;
    Ok(service)
}

/// What the upstream has received (its `/_bench/stats`).
#[derive(Clone, Copy, Debug, Default)]
pub struct AppStats {
    /// POSTs answered.
    pub count: u64,
    /// Of those, relay attempts after the first (`Hookgate-Attempt` > 1).
    pub retries: u64,
    /// From the release (or the upstream's start) to the last answered POST.
    pub last: Duration,
    /// POSTs received, held ones included.
    pub arrived: u64,
}

/// The upstream's counters.
pub fn app_stats(upstream: &Service) -> io::Result<AppStats> {
    let body = request(upstream.addr(), "GET", crate::upstream::STATS)?;
    let n: Vec<u64> = body
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    match n[..] {
        [count, retries, last_ns, arrived] => Ok(AppStats {
            count,
            retries,
            last: Duration::from_nanos(last_ns),
            arrived,
        }),
        _ => Err(io::Error::other(format!("bad upstream stats: {body:?}"))),
    }
}

/// Answers every POST a held upstream keeps waiting, and holds no more.
pub fn release(upstream: &Service) -> io::Result<()> {
    request(upstream.addr(), "POST", crate::upstream::RELEASE).map(drop)
}

/// Polls the upstream until it has answered `count` POSTs, or `within` runs
/// out (then the last counters, as an error).
pub fn await_deliveries(upstream: &Service, count: u64, within: Duration) -> io::Result<AppStats> {
    let deadline = Instant::now() + within;
    loop {
        let stats = app_stats(upstream)?;
        if stats.count >= count {
            return Ok(stats);
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!(
                "the app got {} of {count} deliveries within {within:?}",
                stats.count
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A blocking request without a body; the answer's body.
fn request(addr: SocketAddr, method: &str, path: &str) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned())
}

/// nginx as a plain reverse proxy to the upstream: `proxy_pass` with
/// keep-alive connections on both sides, no access log, one worker per
/// core (`worker_processes auto`), like the gate's one runtime thread per core.
pub fn nginx(bin: &Path, dir: &Path, upstream: u16) -> io::Result<Service> {
    let port = free_port()?;
    let prefix = dir.join("nginx");
    fs::create_dir_all(&prefix)?;
    let conf = prefix.join("nginx.conf");
    fs::write(&conf, nginx_conf(&prefix, port, upstream))?;
    let log = dir.join("nginx.log");
    let mut service = Service::spawn(
        "nginx",
        port,
        Command::new(bin)
            .arg("-p")
            .arg(&prefix)
            .arg("-c")
            .arg(&conf)
            .args(["-e", "stderr"]),
        &log,
    )?;
    service.wait_ready(&log, |a| get(a, "/", "127.0.0.1") == Some(200))?;
    Ok(service)
}

fn nginx_conf(prefix: &Path, port: u16, upstream: u16) -> String {
    let p = prefix.display();
    format!(
        "daemon off;
worker_processes auto;
pid {p}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {p}/body;
    proxy_temp_path {p}/proxy;
    fastcgi_temp_path {p}/fastcgi;
    uwsgi_temp_path {p}/uwsgi;
    scgi_temp_path {p}/scgi;
    keepalive_requests 100000000;
    upstream app {{
        server 127.0.0.1:{upstream};
        keepalive 512;
        keepalive_requests 100000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
"
    )
}

/// redis-server without persistence (no RDB snapshots, no AOF): the rows
/// measure the gate, not the disk.
pub fn redis(bin: &Path, dir: &Path) -> io::Result<Service> {
    let port = free_port()?;
    let data = dir.join("redis");
    fs::create_dir_all(&data)?;
    let log = dir.join("redis.log");
    let mut service = Service::spawn(
        "redis-server",
        port,
        Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&data),
        &log,
    )?;
    service.wait_ready(&log, redis_pong)?;
    Ok(service)
}

fn redis_pong(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 16];
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
}

/// bench/node/handler.js under `node`: what a user would write instead of
/// the gate, on the shared redis-server with a key prefix of its own.
pub fn node(
    bin: &Path,
    handler: &Path,
    dir: &Path,
    tag: &str,
    redis: &Service,
) -> io::Result<Service> {
    let port = free_port()?;
    let log = dir.join(format!("{tag}.log"));
    let mut command = Command::new(bin);
    command
        .arg(handler)
        .env("PORT", port.to_string())
        .env("REDIS_URL", format!("redis://127.0.0.1:{}/0", redis.port))
        .env("STRIPE_WEBHOOK_SECRET", SECRET)
        .env("KEY_PREFIX", format!("bench-{tag}"));
    let mut service = Service::spawn(&format!("node ({tag})"), port, &mut command, &log)?;
    service.wait_ready(&log, |a| get(a, "/healthz", "127.0.0.1") == Some(200))?;
    Ok(service)
}

/// Where a gate keeps its dedupe state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Redis,
    Sqlite,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Sqlite => "sqlite",
        }
    }
}

/// Where the gate's stdout (one JSON line per delivery) goes.
#[derive(Clone, Debug)]
pub enum GateLog {
    File,
    Null,
}

/// A gate's provider in queue mode.
#[derive(Clone, Copy, Debug)]
pub struct Queue {
    /// `queue.concurrency`: relay attempts in flight.
    pub concurrency: usize,
    /// For a drain row, whose app holds the relay's first attempts while
    /// the events are accepted: `upstream.timeout` (and the lease, which
    /// must exceed it) long enough never to cut those attempts off.
    pub patient: bool,
}

/// A gate with a fresh store (a new sqlite file, or a new key prefix in the
/// shared redis), the upstream behind it, and the secret in a file; its
/// provider in queue mode with `queue`. With `callgrind` (a file to dump
/// to), the gate runs in the same process under `valgrind --tool=callgrind`
/// with its instrumentation off until [`Service::count_instructions`].
#[allow(clippy::too_many_arguments)]
pub fn hookgate(
    bin: &Path,
    dir: &Path,
    tag: &str,
    store: Store,
    redis: Option<&Service>,
    upstream: u16,
    queue: Option<Queue>,
    log: &GateLog,
    env: &[(String, String)],
    callgrind: Option<&Path>,
) -> io::Result<Service> {
    // A port `free_ports` found free can be taken before the gate binds it
    // (the load generator's connections take ephemeral ports from the same
    // range): a gate that could not listen starts again on new ports.
    let start = || -> io::Result<Service> {
        // A page fault maps with it the neighbouring pages that are in the page
        // cache, so how much of the gate's binary is cached is one source of
        // variance in the file-backed part of its RSS. Machines like these drop
        // cached pages within minutes even when memory is free (an idle binary
        // lost a tenth of its pages in 60 s); during one A/B a tree's and a
        // candidate's binary ended 12.7 and 19.7 MiB cached. Each gate starts
        // with its binary wholly cached; pages still go while the row runs.
        io::copy(&mut fs::File::open(bin)?, &mut io::sink())?;
        let (port, admin) = free_ports()?;
        let secret = dir.join("stripe.secret");
        fs::write(&secret, SECRET)?;
        let store_section = match (store, redis) {
            (Store::Sqlite, _) => format!(
                "backend = \"sqlite\"\npath = \"{}\"\n",
                dir.join(format!("{tag}.db")).display()
            ),
            (Store::Redis, Some(redis)) => format!(
                "backend = \"redis\"\nurl = \"redis://127.0.0.1:{}/0\"\nprefix = \"bench-{tag}\"\n",
                redis.port
            ),
            (Store::Redis, None) => return Err(io::Error::other("a redis row needs redis-server")),
        };
        // Queue mode: the provider accepts (202) and the relay delivers. The
        // [queue] section is the default one, written out. A patient gate's
        // leases (the store's claims and the relay's jobs) must exceed its
        // upstream.timeout.
        let (timeout, queue_section, mode) = match queue {
            None => (String::new(), String::new(), ""),
            Some(q) => {
                let (timeout, lease) = match q.patient {
                    true => ("timeout = \"120s\"\n", "240s"),
                    false => ("", "60s"),
                };
                let section = format!(
                    "[queue]
accept_status = 202
max_attempts = 12
max_age = \"3d\"
retry_initial = \"1s\"
retry_max = \"1h\"
jitter = 0.2
lease = \"{lease}\"
concurrency = {}
dead_on = [400, 401, 403, 404, 410, 422]

",
                    q.concurrency
                );
                (timeout.to_owned(), section, "mode = \"queue\"\n")
            }
        };
        let store_lease = match queue {
            Some(Queue { patient: true, .. }) => "lease = \"240s\"\n",
            _ => "",
        };
        let config = format!(
            "[server]
listen = \"127.0.0.1:{port}\"
admin_listen = \"127.0.0.1:{admin}\"

[upstream]
url = \"http://127.0.0.1:{upstream}\"
{timeout}
[store]
{store_section}{store_lease}
{queue_section}[providers.stripe]
scheme = \"stripe\"
path = \"{PATH}\"
secrets = [\"file:{secret}\"]
# Requests are signed before the run starts; a long run must not go stale.
tolerance = \"1h\"
{mode}",
            secret = secret.display()
        );
        let conf = dir.join(format!("{tag}.toml"));
        fs::write(&conf, config)?;
        let log_path = match log {
            GateLog::File => dir.join(format!("{tag}.log")),
            GateLog::Null => PathBuf::from("/dev/null"),
        };
        let mut command = match callgrind {
            None => Command::new(bin),
            Some(out) => {
                // `--instr-atstart=no`, not `--collect-atstart=no`: with the
                // latter, `callgrind_control -i on` switches on nothing that
                // counts (its dumps total 0).
                let mut valgrind = Command::new("valgrind");
                valgrind
                    .args(["--tool=callgrind", "--instr-atstart=no"])
                    .arg(format!("--callgrind-out-file={}", out.display()))
                    .arg(format!("--log-file={}.valgrind.log", out.display()))
                    .arg(bin);
                valgrind
            }
        };
        command.arg("run").arg("--config").arg(&conf);
        // The file above is the whole configuration: no HOOKGATE_* override,
        // and the default log filter (info: one line per delivery).
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HOOKGATE_") || key == "RUST_LOG" {
                command.env_remove(key);
            }
        }
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let mut service =
            Service::spawn(&format!("hookgate ({tag})"), port, &mut command, &log_path)?;
        if let Some(out) = callgrind {
            service.callgrind = Some(out.to_owned());
            service.stop_within = VALGRIND_STOP_WITHIN;
        }
        let admin_addr = SocketAddr::from(([127, 0, 0, 1], admin));
        service.wait_ready(&log_path, |_| {
            get(admin_addr, "/readyz", "127.0.0.1") == Some(200)
        })?;
        service.admin = Some(admin);
        Ok(service)
    };
    // With its log kept, the gate says why it stopped; without it
    // (--gate-log-null, as the profile-guided build's training runs), a
    // gate that exited before it was ready is taken to have lost its port:
    // anything else fails again on each attempt, and then the same way.
    let taken = |e: &io::Error| match log {
        GateLog::File => fs::read_to_string(dir.join(format!("{tag}.log")))
            .is_ok_and(|text| text.contains("cannot listen on")),
        GateLog::Null => e.to_string().contains(EXITED_BEFORE_READY),
    };
    let mut attempt = 1;
    loop {
        match start() {
            Err(e) if attempt < GATE_START_ATTEMPTS && taken(&e) => {
                eprintln!("        {e}: a port was taken; starting it again on new ports");
                attempt += 1;
            }
            started => return started,
        }
    }
}

/// Starts of a gate tried when its port was taken (`hookgate`).
const GATE_START_ATTEMPTS: usize = 3;

/// How `Service::wait_ready` says that the process exited first.
const EXITED_BEFORE_READY: &str = "before it was ready";

/// Two ports nothing listens on right now, distinct: both are held while
/// the second is picked, so that the kernel cannot hand out the first one
/// again.
fn free_ports() -> io::Result<(u16, u16)> {
    let first = TcpListener::bind("127.0.0.1:0")?;
    let second = TcpListener::bind("127.0.0.1:0")?;
    Ok((first.local_addr()?.port(), second.local_addr()?.port()))
}

/// The gate's `/metrics` text, kept beside each row's log and returned: its
/// store and upstream histograms tell where a row's time went (`waits`).
pub fn save_metrics(gate: &Service, to: &Path) -> io::Result<String> {
    let admin = gate.admin.ok_or_else(|| io::Error::other("not a gate"))?;
    let mut s = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], admin)))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    fs::write(to, body)?;
    Ok(body.to_owned())
}

/// A blocking GET; the status, or `None` when nothing answered.
fn get(addr: SocketAddr, path: &str, host: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    let text = std::str::from_utf8(&head[..n]).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// `perf record` attached to a process until dropped (SIGINT ends it and
/// writes the file).
pub struct Profiler(Child);

impl Profiler {
    pub fn attach(pid: u32, out: &Path, extra: &str) -> io::Result<Self> {
        let mut command = Command::new("perf");
        command.arg("record").arg("-o").arg(out);
        command.args(extra.split_whitespace());
        command.args(["-p", &pid.to_string()]);
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // perf needs a moment to attach to every thread.
        std::thread::sleep(Duration::from_millis(300));
        Ok(Self(child))
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// CPU time (user + system, every thread) of a process, and of its worker
/// processes when it is nginx's master, in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let workers = match comm.trim() == "nginx" {
        true => children(pid),
        false => Vec::new(),
    };
    let ticks: u64 = std::iter::once(pid)
        .chain(workers)
        .filter_map(stat_ticks)
        .sum();
    ticks as f64 / clock_ticks()
}

/// utime + stime from `/proc/PID/stat`.
fn stat_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may hold spaces: state is
    // field 3 of proc(5), utime 14 and stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let ppid = s.rsplit_once(')')?.1.split_whitespace().nth(1)?;
                    ppid.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100.0)
    })
}
