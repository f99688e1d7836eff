//! The binary itself: exit codes, `check`, `sign`, and the delivery log of
//! a real `hookgate run` process, scanned for secrets.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hookgate::provider::Scheme;

use crate::support::fixture::GateFixture;
use crate::support::gate::{SECRET, post, signed, stripe_event};
use crate::support::upstream::Upstream;

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
    assert!(stdout.contains("<redacted>"), "{stdout}");
    assert!(
        stderr.contains("shorter than stripe's retry window"),
        "{stderr}"
    );
    assert!(!stdout.contains(SECRET) && !stderr.contains(SECRET));

    std::fs::remove_file(config.secret_path("stripe", 0)).unwrap();
    let out = check().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no usable secret"));
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
    let deliveries: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "delivery")
        .collect();
    assert_eq!(deliveries.len(), 4, "{all}");
    let first = &deliveries[0];
    assert_eq!(first["provider"], "stripe");
    assert_eq!(first["key"], "evt_logged");
    assert_eq!(first["verification"], "ok");
    assert_eq!(first["dedupe"], "fresh");
    assert_eq!(first["outcome"], "forwarded");
    assert_eq!(first["upstream_status"], 200);
    assert!(first["duration_ms"].is_number());
    assert_eq!(
        first["traceparent"],
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    );
    assert_eq!(deliveries[1]["dedupe"], "duplicate");
    assert_eq!(deliveries[2]["verification"], "invalid");
    assert_eq!(deliveries[2]["outcome"], "invalid_signature");
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
    let out = hookgate()
        .args(["sign", "--provider", "std", "--id", "msg_cli_1", "--config"])
        .arg(&path)
        .arg("--body")
        .arg(&body_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let headers: Vec<(String, String)> = String::from_utf8(out.stdout)
        .unwrap()
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
