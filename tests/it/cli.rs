//! The binary itself: exit codes, `check`, `sign`, and the delivery log of
//! a real `hookgate run` process, scanned for secrets.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hookgate::provider::Scheme;

use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::gate::{SECRET, half_sent, post, signed, stripe_event};
use crate::support::upstream::{Behavior, Upstream};
use crate::support::wait::until;

pub fn hookgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hookgate"))
}

#[test]
fn a_bad_config_exits_64_listing_every_problem_without_echoing_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[server]\nread_timeout = \"later\"\n[providers.stripe]\nscheme = \"stripe\"\npath = \"/s\"\nsecrets = [\"whsec_literal_pasted_value\"]\n[providers.acme]\nscheme = \"hmac\"\npath = \"/a\"\nsecrets = [\"env:A\"]\n",
    )
    .unwrap();
    let out = hookgate()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("server.read_timeout"), "{stderr}");
    assert!(stderr.contains("providers.stripe.secrets[0]"), "{stderr}");
    assert!(
        stderr.contains("providers.acme.signature_header"),
        "{stderr}"
    );
    assert!(!stderr.contains("whsec_literal_pasted_value"), "{stderr}");

    let missing = hookgate()
        .args(["run", "--config", "/nonexistent/hookgate.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(64));
}

#[test]
fn check_redacts_secrets_and_fails_on_missing_ones() {
    let config = GateFixture::stripe()
        .provider_extra("retention = \"1d\"")
        .upstream_url("http://127.0.0.1:9");
    let path = config.config_file();
    let check = || hookgate().arg("check").arg("--config").arg(&path).output();
    let out = check().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("provider stripe"), "{stdout}");
    assert!(stdout.contains("present (value not shown)"), "{stdout}");
    assert!(
        stderr.contains("shorter than stripe's retry window"),
        "{stderr}"
    );
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));
    // The config as a user writes it (issue 18, item 4): no Rust debug
    // output, durations in the style the config takes.
    assert!(stdout.contains("  key: json:/id\n"), "{stdout}");
    assert!(stdout.contains("  tolerance: 5m\n"), "{stdout}");
    assert!(stdout.contains("  retention: 1d\n"), "{stdout}");
    assert!(stderr.contains("retry window of 3d"), "{stderr}");
    assert!(
        !stdout.contains("Parts") && !stdout.contains("days"),
        "{stdout}"
    );

    let secret_file = config.secret_path("stripe", 0);
    std::fs::remove_file(&secret_file).unwrap();
    let out = check().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stderr.contains("no usable secret"), "{stderr}");
    let named = format!("secrets[0]: file:{}: missing", secret_file.display());
    assert!(
        stdout.contains(&named),
        "the missing secret is named: {stdout}"
    );
    assert!(
        stderr.contains(&format!("{}", secret_file.display())),
        "{stderr}"
    );
}

/// A `hookgate run` child whose stdout is collected line by line.
pub struct Child {
    process: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    admin_addr: std::net::SocketAddr,
}

impl Child {
    pub fn spawn(config_path: &std::path::Path) -> (Self, std::net::SocketAddr) {
        Self::spawn_with_env(config_path, &[])
    }

    /// Like `spawn`, with extra environment variables for the child only.
    pub fn spawn_with_env(
        config_path: &std::path::Path,
        env: &[(&str, &str)],
    ) -> (Self, std::net::SocketAddr) {
        let mut process = hookgate()
            .arg("run")
            .arg("--config")
            .arg(config_path)
            .env("RUST_LOG", "debug")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        for stream in [
            Box::new(process.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(process.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        let mut child = Self {
            process,
            lines,
            seen: Vec::new(),
            admin_addr: ([127, 0, 0, 1], 0).into(),
        };
        let addr = loop {
            let line = child.next_line();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["message"] == "hookgate listening" {
                child.admin_addr = v["admin_addr"].as_str().unwrap().parse().unwrap();
                break v["addr"].as_str().unwrap().parse().unwrap();
            }
        };
        (child, addr)
    }

    /// Where `/healthz`, `/readyz` and `/metrics` answer.
    pub fn admin_addr(&self) -> std::net::SocketAddr {
        self.admin_addr
    }

    /// The process id, for reading its memory use from `/proc`.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// SIGKILL: no grace, no cleanup, as when a node dies. Returns what the
    /// process printed.
    pub fn kill(mut self) -> Vec<String> {
        let _ = self.process.kill();
        let _ = self.process.wait();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(line);
        }
        std::mem::take(&mut self.seen)
    }

    fn next_line(&mut self) -> String {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no output from hookgate; so far: {:?}", self.seen));
        self.seen.push(line.clone());
        line
    }

    /// The next line for which `wanted` holds (the lines before it are
    /// kept for `stop` and `kill`); panics after 20 s without output.
    pub fn line_where(&mut self, wanted: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        loop {
            let line = self.next_line();
            if let Ok(v) = serde_json::from_str(&line)
                && wanted(&v)
            {
                return v;
            }
        }
    }

    /// SIGTERM, then everything it printed until it exited.
    pub fn stop(mut self) -> (Option<i32>, Vec<String>) {
        Command::new("kill")
            .arg("-TERM")
            .arg(self.process.id().to_string())
            .status()
            .unwrap();
        let status = self.process.wait().unwrap();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
            self.seen.push(line);
        }
        (status.code(), std::mem::take(&mut self.seen))
    }
}

/// The delivery lines among what a gate printed, parsed.
fn delivery_lines(lines: &[String]) -> Vec<serde_json::Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "delivery")
        .collect()
}

/// A test that panics midway must not leave its gate processes running.
impl Drop for Child {
    fn drop(&mut self) {
        if matches!(self.process.try_wait(), Ok(None)) {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

#[tokio::test]
async fn the_delivery_log_has_one_json_line_per_delivery_and_no_secret() {
    let up = Upstream::start().await;
    let config = GateFixture::stripe().upstream(&up);
    let (child, addr) = Child::spawn(&config.config_file());

    let body = stripe_event("evt_logged");
    let good = signed(&Scheme::Stripe, SECRET, &body, "", None);
    let mut traced = good.clone();
    traced.push((
        "traceparent".into(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
    ));
    assert_eq!(
        post(addr, "/webhooks/stripe", &traced, &body)
            .await
            .result(),
        "forwarded"
    );
    assert_eq!(
        post(addr, "/webhooks/stripe", &good, &body).await.result(),
        "duplicate"
    );
    let forged = signed(&Scheme::Stripe, "wrong", &body, "", None);
    assert_eq!(
        post(addr, "/webhooks/stripe", &forged, &body)
            .await
            .result(),
        "invalid_signature"
    );
    // A body that carries the secret itself must not be logged either.
    let leaky = format!("{{\"id\":\"evt_leak\",\"note\":\"{SECRET}\"}}").into_bytes();
    let h = signed(&Scheme::Stripe, SECRET, &leaky, "", None);
    assert_eq!(
        post(addr, "/webhooks/stripe", &h, &leaky).await.result(),
        "forwarded"
    );

    let (code, lines) = child.stop();
    assert_eq!(code, Some(0), "SIGTERM is a clean exit");
    let all = lines.join("\n");
    assert!(!all.contains(SECRET), "a secret reached the logs:\n{all}");
    let deliveries = delivery_lines(&lines);
    assert_eq!(deliveries.len(), 4, "{all}");
    // Each core writes its lines together, so two cores' lines can come
    // out of order (README, Logs): each line is found by what it says.
    let first = only(&deliveries, |d| {
        d["dedupe"] == "fresh" && d["key"] == "evt_logged"
    });
    assert_eq!(first["provider"], "stripe");
    assert_eq!(first["verification"], "ok");
    assert_eq!(first["outcome"], "forwarded");
    assert_eq!(first["upstream_status"], 200);
    assert!(first["duration_ms"].is_number());
    assert_eq!(
        first["traceparent"],
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    );
    let duplicate = only(&deliveries, |d| d["dedupe"] == "duplicate");
    assert_eq!(duplicate["key"], "evt_logged");
    assert!(duplicate.get("traceparent").is_none(), "{all}");
    let forged = only(&deliveries, |d| d["verification"] == "invalid");
    assert_eq!(forged["outcome"], "invalid_signature");
    let leaky = only(&deliveries, |d| d["key"] == "evt_leak");
    assert_eq!(leaky["outcome"], "forwarded");
}

/// The one delivery line that `which` picks out.
fn only(
    deliveries: &[serde_json::Value],
    which: impl Fn(&serde_json::Value) -> bool,
) -> &serde_json::Value {
    let mut picked = deliveries.iter().filter(|d| which(d));
    let line = picked
        .next()
        .unwrap_or_else(|| panic!("no delivery line matches: {deliveries:?}"));
    assert!(
        picked.next().is_none(),
        "two delivery lines match: {deliveries:?}"
    );
    line
}

/// Each core writes its lines together, but before it waits for more work:
/// a delivery's line is on stdout while the gate runs, not held until 64
/// KiB of them or the exit.
#[tokio::test]
async fn a_running_gate_writes_each_delivery_line_soon_after_the_answer() {
    let up = Upstream::start().await;
    let config = GateFixture::stripe().upstream(&up);
    let (mut child, addr) = Child::spawn(&config.config_file());
    for id in ["evt_soon_1", "evt_soon_2"] {
        let body = stripe_event(id);
        let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
        let answer = post(addr, "/webhooks/stripe", &headers, &body).await;
        assert_eq!(answer.result(), "forwarded");
        let line = child.line_where(|v| v["message"] == "delivery");
        assert_eq!(line["key"], id);
    }
    let (code, _) = child.stop();
    assert_eq!(code, Some(0));
}

/// Deliveries the shutdown's grace cuts off, one with its body still
/// coming and one with the app still working, each get their log line.
#[tokio::test]
async fn deliveries_cut_off_by_the_shutdown_grace_are_logged() {
    let up = Upstream::start().await;
    let config = GateFixture::stripe()
        .upstream_timeout("20s")
        .store(StoreConfig::sqlite().lease("30s"))
        .upstream(&up);
    let (child, addr) = Child::spawn(&config.config_file());

    let body = stripe_event("evt_half_sent");
    let headers = signed(&Scheme::Stripe, SECRET, &body, "", None);
    // Answered 100 Continue: the gate is reading this one's body.
    let reading =
        tokio::task::spawn_blocking(move || half_sent(addr, "/webhooks/stripe", &headers, &body))
            .await
            .unwrap();

    // The app holds the second past the grace (2 s) and the test's end.
    up.set(Behavior::Stall(Duration::from_secs(30)));
    let slow = stripe_event("evt_slow_app");
    let headers = signed(&Scheme::Stripe, SECRET, &slow, "", None);
    let pending = tokio::spawn(async move {
        // The gate goes away without answering: the client's error is
        // expected and not what is tested.
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            post(addr, "/webhooks/stripe", &headers, &slow),
        )
        .await;
    });
    until("the app to see the slow one", || up.count() > 0).await;

    let (code, lines) = tokio::task::spawn_blocking(move || child.stop())
        .await
        .unwrap();
    drop(reading);
    pending.abort();
    assert_eq!(code, Some(0));
    let all = lines.join("\n");
    let deliveries = delivery_lines(&lines);
    assert_eq!(deliveries.len(), 2, "{all}");
    for line in &deliveries {
        assert_eq!(line["provider"], "stripe");
        assert_eq!(line["outcome"], "internal_error", "{all}");
        assert_eq!(line["side"], "internal");
    }
    let slow = deliveries.iter().find(|l| l["key"] == "evt_slow_app");
    assert!(slow.is_some_and(|l| l["verification"] == "ok"), "{all}");
    assert!(
        deliveries.iter().any(|l| l["verification"] == "skipped"),
        "the half-sent one was never verified: {all}"
    );
}

#[tokio::test]
async fn sign_prints_headers_the_gate_accepts() {
    let up = Upstream::start().await;
    let config = GateFixture::provider("std", Scheme::Standard)
        .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .upstream(&up);
    let path = config.config_file();
    let body_path = config.dir().join("body.json");
    std::fs::write(&body_path, b"{\"type\":\"invoice.paid\"}").unwrap();
    let body_arg = body_path.to_str().unwrap();
    let args = [
        "sign",
        "--provider",
        "std",
        "--id",
        "msg_cli_1",
        "--body",
        body_arg,
    ];
    let headers: Vec<(String, String)> = run_ok(&path, &args)
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "webhook-id" && v == "msg_cli_1")
    );
    let gate = config.start().await;
    let a = gate
        .post("/webhooks/std", &headers, b"{\"type\":\"invoice.paid\"}")
        .await;
    assert_eq!(a.result(), "forwarded");
    assert_eq!(
        up.received()[0].headers["hookgate-event-key"],
        "std:msg_cli_1"
    );
    gate.shutdown().await;
}

#[test]
fn environment_variables_override_the_file() {
    let config = GateFixture::stripe().upstream_url("http://127.0.0.1:9");
    let path = config.config_file();
    let run = |vars: &[(&str, &str)]| {
        let out = hookgate()
            .arg("check")
            .arg("--config")
            .arg(&path)
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, text) = run(&[("HOOKGATE_PROVIDERS__STRIPE__TOLERANCE", "7m")]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("tolerance: 7m"), "{text}");
    let (code, text) = run(&[
        ("HOOKGATE_UPSTREAM__TIMEOUT", "a while"),
        ("HOOKGATE_STORE__BACKEND", "cassandra"),
    ]);
    assert_eq!(code, Some(64), "{text}");
    assert!(
        text.contains("upstream.timeout") && text.contains("store.backend"),
        "{text}"
    );
}

/// Issue 18, item 3: a gate with no provider verifies nothing, so it does
/// not start unless the operator says it is meant.
#[test]
fn a_gate_without_providers_refuses_to_start_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let bare = |args: &[&str]| {
        let out = hookgate()
            .args(args)
            .current_dir(dir.path())
            .env("HOOKGATE_SERVER__LISTEN", "127.0.0.1:0")
            .env("HOOKGATE_SERVER__ADMIN_LISTEN", "127.0.0.1:0")
            .env("HOOKGATE_STORE__BACKEND", "memory")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [&["run"][..], &[], &["check"]] {
        let (code, stderr) = bare(args);
        assert_eq!(code, Some(64), "{args:?}: {stderr}");
        assert!(
            stderr.contains("no providers are configured")
                && stderr.contains("[providers.<name>]")
                && stderr.contains("server.allow_no_providers = true"),
            "{args:?} says why and what to do: {stderr}"
        );
    }

    let config = dir.path().join("passthrough.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nallow_no_providers = true\n[store]\nbackend = \"memory\"\n",
    )
    .unwrap();
    let out = hookgate()
        .arg("check")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("passed through unverified"), "{stderr}");
    let (child, _addr) = Child::spawn(&config);
    let (code, _) = child.stop();
    assert_eq!(code, Some(0), "allowed explicitly, it serves");
}

/// Issue 18, item 5, through the binary: one problem is one problem, and
/// a key that came from the environment names its variable.
#[test]
fn config_errors_name_the_variable_that_set_a_key() {
    let config = GateFixture::stripe().upstream_url("http://127.0.0.1:9");
    let out = hookgate()
        .arg("check")
        .arg("--config")
        .arg(config.config_file())
        .env("HOOKGATE_STORE__BACKEN", "redis")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("configuration is invalid (1 problem):"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "store.backen: unknown key; did you mean `backend`? (set by HOOKGATE_STORE__BACKEN)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("backen.backen"), "named once: {stderr}");
}

fn run_keys(path: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    run(path, &[&["keys"], args].concat())
}

/// `hookgate <args> --config <config>`: (exit code, stdout, stderr).
pub fn run(config: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = hookgate()
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Like [`run`], for a command that must succeed: its stdout.
pub fn run_ok(config: &std::path::Path, args: &[&str]) -> String {
    let (code, stdout, stderr) = run(config, args);
    assert_eq!(code, Some(0), "hookgate {args:?}: {stdout}{stderr}");
    stdout
}

/// Issue 18, item 6.
#[tokio::test]
async fn keys_get_takes_a_scoped_key_and_exits_1_on_an_unknown_one() {
    let gate = GateFixture::stripe().start().await;
    let path = gate.fixture().config_file();
    assert_eq!(
        gate.deliver(&stripe_event("evt_Keys_1")).await.result(),
        "forwarded"
    );
    // The mark is made after the answer; a redelivery waits for it.
    assert_eq!(
        gate.deliver(&stripe_event("evt_Keys_1")).await.result(),
        "duplicate"
    );

    let (code, stdout, stderr) = run_keys(&path, &["get", "--provider", "stripe", "evt_keys_1"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("stripe:evt_keys_1: completed (status 200"),
        "{stdout}"
    );
    // When it is forgotten: a date, and the retention left (4 days, less
    // the second or two the test took).
    let expires = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("expires: "))
        .unwrap_or_else(|| panic!("no expiry in {stdout}"));
    assert!(
        expires.starts_with("20")
            && expires.contains("(in 3d 23h 59m")
            && expires.ends_with("retention 4d)"),
        "{stdout}"
    );

    // Pasted as the gate shows it (a log line, Hookgate-Event-Key).
    let (code, stdout, _) = run_keys(&path, &["get", "--provider", "stripe", "stripe:evt_keys_1"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.starts_with("stripe:evt_keys_1: completed"),
        "{stdout}"
    );
    assert!(!stdout.contains("stripe:stripe:"), "{stdout}");

    let (code, stdout, _) = run_keys(&path, &["get", "--provider", "stripe", "evt_never"]);
    assert_eq!(
        code,
        Some(1),
        "an unknown key is exit 1 for scripts: {stdout}"
    );
    assert!(stdout.contains("stripe:evt_never: unknown"), "{stdout}");
    let (code, _, _) = run_keys(&path, &["forget", "--provider", "stripe", "evt_never"]);
    assert_eq!(code, Some(1));

    let (code, _, stderr) = run_keys(&path, &["get", "--provider", "strip", "evt_keys_1"]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("no provider named strip; configured: stripe"),
        "{stderr}"
    );

    let (code, stdout, _) = run_keys(
        &path,
        &["forget", "--provider", "stripe", "STRIPE:evt_keys_1"],
    );
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("stripe:evt_keys_1: forgotten"), "{stdout}");
    gate.shutdown().await;
}

/// Issue 18, item 7: `hookgate demo | head -3` ends quietly and leaves no
/// temporary directory behind.
#[test]
fn demo_into_a_closed_pipe_exits_quietly_and_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = hookgate()
        .arg("demo")
        .env("TMPDIR", tmp.path())
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("hookgate demo"), "{first}");
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "no panic, no backtrace: {stderr}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "the demo's directory is removed: {left:?}");

    // A full run cleans up too.
    let out = hookgate()
        .arg("demo")
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn help_names_exit_codes_layering_and_what_arguments_mean() {
    let help = |args: &[&str]| {
        let out = hookgate().args(args).arg("--help").output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&[]);
    for needle in [
        "Exit status: 0",
        " 1 ",
        " 64 ",
        "HOOKGATE_<SECTION>__<KEY>",
        "later layers win",
    ] {
        assert!(top.contains(needle), "{needle} missing from:\n{top}");
    }
    let demo = help(&["demo"]);
    assert!(!demo.contains("--config"), "demo reads no config:\n{demo}");
    let get = help(&["keys", "get"]);
    assert!(
        get.contains("[providers.<NAME>]") && get.contains("stripe:evt_1"),
        "--provider and <KEY> are described:\n{get}"
    );
    assert!(get.contains("--config"), "{get}");

    let usage = hookgate().args(["keys", "get"]).output().unwrap();
    assert_eq!(usage.status.code(), Some(64), "a usage error is 64");
}

/// Issue 18, item 2: `hookgate echo` is the app a newcomer does not have.
#[tokio::test]
async fn echo_answers_and_prints_what_it_received() {
    let mut process = hookgate()
        .args(["echo", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel();
    let stdout = process.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = || lines.recv_timeout(Duration::from_secs(20)).unwrap();
    let banner = next();
    let addr: std::net::SocketAddr = banner
        .split("http://")
        .nth(1)
        .and_then(|rest| {
            rest.split(':')
                .take(2)
                .collect::<Vec<_>>()
                .join(":")
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no address in {banner}"));
    let answer = post(
        addr,
        "/webhooks/stripe?x=1",
        &[("hookgate-event-key".into(), "stripe:evt_echo".into())],
        b"{\"id\":\"evt_echo\"}",
    )
    .await;
    assert_eq!(answer.status, 200);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("evt_echo\"}")) {
        seen.push(next());
    }
    let seen = seen.join("\n");
    assert!(
        seen.contains("--- POST /webhooks/stripe?x=1 (17 bytes)"),
        "{seen}"
    );
    assert!(
        seen.contains("hookgate-event-key: stripe:evt_echo"),
        "{seen}"
    );
    let _ = process.kill();
    let _ = process.wait();
}

/// The one-shot commands whose reader went away (`hookgate check | head
/// -1`) end as Unix tools do, killed quietly by SIGPIPE, never with a
/// panic from `println!`.
#[test]
fn check_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let config = GateFixture::stripe().upstream_url("http://127.0.0.1:9");
    let path = config.config_file();
    // A pipe whose reading end is closed before the command starts.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = hookgate()
        .args(["check", "--config"])
        .arg(&path)
        .env("RUST_BACKTRACE", "1")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}
