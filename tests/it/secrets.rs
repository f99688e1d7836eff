//! Secrets never leave the gate: every error path is driven through real
//! `hookgate` processes, and everything they say (stdout and stderr logs,
//! every answer's headers and body, `/metrics`, `/readyz`, `check`, `sign`,
//! `keys`) is scanned for the secret values.

use std::net::SocketAddr;
use std::process::Output;
use std::time::Duration;

use base64::Engine as _;
use hookgate::provider::Scheme;
use http::Method;

use crate::cli::{Child, hookgate};
use crate::support::fixture::{GateFixture, StoreConfig};
use crate::support::gate::{Answer, post, send, signed};
use crate::support::redis_server::RedisServer;
use crate::support::upstream::{Behavior, Upstream};

/// Distinctive values, so that any echo is found.
const STRIPE_SECRET: &str = "whsec_STRIPEsecretVALUE_must_never_leak_91d2";
const STD_KEY: &[u8] = b"STANDARD-key-bytes-never-leak-7e44";
const REDIS_PASSWORD: &str = "REDISpasswordNEVERleaks3b9f";
const LITERAL: &str = "whsec_LITERALpastedSECRET_c0ffee";

fn std_secret() -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(STD_KEY)
    )
}

/// Headers to send, as (name, value).
type Headers = Vec<(String, String)>;

/// Every form a secret could leak in: as configured, without the
/// `whsec_` prefix, and the raw bytes behind a base64 secret.
fn needles() -> Vec<String> {
    let std = std_secret();
    vec![
        STRIPE_SECRET.into(),
        STRIPE_SECRET.trim_start_matches("whsec_").into(),
        std.clone(),
        std.trim_start_matches("whsec_").into(),
        String::from_utf8(STD_KEY.to_vec()).unwrap(),
        REDIS_PASSWORD.into(),
        LITERAL.into(),
        LITERAL.trim_start_matches("whsec_").into(),
    ]
}

/// Everything a run said, to be scanned at the end.
#[derive(Default)]
struct Transcript {
    text: Vec<(String, String)>,
}

impl Transcript {
    fn answer(&mut self, what: &str, a: &Answer) {
        let mut text = format!("{}\n", a.status);
        for (k, v) in &a.headers {
            text.push_str(&format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())));
        }
        text.push_str(&String::from_utf8_lossy(&a.body));
        self.text.push((what.into(), text));
    }

    fn output(&mut self, what: &str, out: &Output) {
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        self.text.push((what.into(), text));
    }

    fn lines(&mut self, what: &str, lines: &[String]) {
        self.text.push((what.into(), lines.join("\n")));
    }

    async fn admin(&mut self, admin: SocketAddr) {
        for path in ["/metrics", "/readyz", "/healthz"] {
            let a = send(admin, Method::GET, path, &[], Vec::new()).await;
            self.answer(path, &a);
        }
    }

    /// Scans the process's admin answers, stops it, and keeps its log.
    async fn stop(&mut self, what: &str, child: Child) -> Vec<String> {
        self.admin(child.admin_addr()).await;
        let (_, lines) = tokio::task::spawn_blocking(move || child.stop())
            .await
            .unwrap();
        self.lines(what, &lines);
        lines
    }

    /// Posts a delivery, keeps what came back, and checks its result.
    async fn expect(
        &mut self,
        addr: SocketAddr,
        what: &str,
        path: &str,
        headers: Headers,
        body: &[u8],
        result: &str,
    ) {
        let a = post(addr, path, &headers, body).await;
        self.answer(what, &a);
        assert_eq!(a.result(), result, "{what}");
    }

    fn assert_clean(&self) {
        let mut leaks = Vec::new();
        for (what, text) in &self.text {
            for needle in needles() {
                if text.contains(&needle) {
                    leaks.push(format!("{what} contains {needle:?}:\n{text}"));
                }
            }
        }
        assert!(leaks.is_empty(), "{}", leaks.join("\n---\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_path_reveals_a_secret() {
    let mut seen = Transcript::default();
    let up = Upstream::start().await;
    let mut redis = RedisServer::start();

    // Gate A: redis, in front of the recording app. The stripe secret is a
    // file, the standard one an environment variable.
    let config_a = GateFixture::provider("stripe", Scheme::Stripe)
        .secret(STRIPE_SECRET)
        .add_provider("std", Scheme::Standard)
        .secret_source("env:HG_TEST_STD_SECRET")
        .upstream(&up)
        .upstream_timeout("1s")
        .store(StoreConfig::on(&redis).lease("3s").timeout("300ms"));
    let path_a = config_a.config_file();
    let std = std_secret();
    let env = [("HG_TEST_STD_SECRET", std.as_str())];
    let p = path_a.clone();
    let envs: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (gate_a, addr) = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Child::spawn_with_env(&p, &env)
    })
    .await
    .unwrap();
    let admin_a = gate_a.admin_addr();

    let stripe =
        |body: &[u8], secret: &str, at: Option<i64>| signed(&Scheme::Stripe, secret, body, "", at);
    let genuine = |body: &[u8]| stripe(body, STRIPE_SECRET, None);
    let s = "/webhooks/stripe";
    let ok = br#"{"id":"evt_secret_ok"}"#;
    seen.expect(addr, "ok", s, genuine(ok), ok, "forwarded")
        .await;
    seen.expect(addr, "dup", s, genuine(ok), ok, "duplicate")
        .await;
    let cases: Vec<(&str, Headers, Vec<u8>, &str)> = vec![
        (
            "forged",
            stripe(ok, "whsec_wrong", None),
            ok.to_vec(),
            "invalid_signature",
        ),
        ("unsigned", vec![], ok.to_vec(), "invalid_signature"),
        (
            "stale",
            stripe(ok, STRIPE_SECRET, Some(1_000_000_000)),
            ok.to_vec(),
            "stale_timestamp",
        ),
        (
            "missing key",
            stripe(b"{}", STRIPE_SECRET, None),
            b"{}".to_vec(),
            "missing_key",
        ),
        (
            "bad payload",
            stripe(b"{nope", STRIPE_SECRET, None),
            b"{nope".to_vec(),
            "bad_payload",
        ),
        (
            "mismatch",
            stripe(br#"{"id":"evt_secret_ok","x":1}"#, STRIPE_SECRET, None),
            br#"{"id":"evt_secret_ok","x":1}"#.to_vec(),
            "payload_mismatch",
        ),
    ];
    for (what, headers, body, code) in cases {
        seen.expect(addr, what, s, headers, &body, code).await;
    }
    // A body that carries the secrets is forwarded, but never logged.
    let leaky = format!(r#"{{"id":"evt_leaky","a":"{STRIPE_SECRET}","b":"{std}"}}"#);
    let h = stripe(leaky.as_bytes(), STRIPE_SECRET, None);
    seen.expect(addr, "leaky body", s, h, leaky.as_bytes(), "forwarded")
        .await;
    // The standard provider, forged and genuine.
    let sb = b"{\"type\":\"ping\"}";
    let forged = signed(&Scheme::Standard, "whsec_AAAAAAAA", sb, "msg_1", None);
    let std_path = "/webhooks/std";
    seen.expect(
        addr,
        "std forged",
        std_path,
        forged,
        sb,
        "invalid_signature",
    )
    .await;
    let good = signed(&Scheme::Standard, &std, sb, "msg_1", None);
    seen.expect(addr, "std ok", std_path, good, sb, "forwarded")
        .await;
    // The app failing, then too slow.
    up.set(Behavior::Status(500));
    let b = br#"{"id":"evt_secret_500"}"#;
    seen.expect(addr, "app 500", s, genuine(b), b, "upstream_error")
        .await;
    up.set(Behavior::Stall(Duration::from_millis(1500)));
    seen.expect(addr, "app slow", s, genuine(b), b, "upstream_timeout")
        .await;
    up.set(Behavior::Status(200));
    // Non-POST, unknown route (passthrough answers from the app).
    let a = send(addr, Method::GET, s, &[], Vec::new()).await;
    seen.answer("GET", &a);
    assert_eq!(a.result(), "method_not_allowed");
    // The store down.
    redis.kill();
    let b = br#"{"id":"evt_secret_store"}"#;
    seen.expect(addr, "store down", s, genuine(b), b, "store_unavailable")
        .await;
    seen.admin(admin_a).await;
    redis.restart();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = seen.stop("gate A log", gate_a).await;
    assert!(
        lines.iter().any(|l| l.contains("store_unavailable")),
        "the store outage was logged"
    );

    // Gate B: the app unreachable, and a redis URL with a password that
    // cannot be reached (given by environment variable).
    let config_b = GateFixture::provider("stripe", Scheme::Stripe)
        .secret(STRIPE_SECRET)
        .upstream_url("http://127.0.0.1:9");
    let path_b = config_b.config_file();
    let p = path_b.clone();
    let (gate_b, addr_b) = tokio::task::spawn_blocking(move || Child::spawn(&p))
        .await
        .unwrap();
    let b = br#"{"id":"evt_secret_502"}"#;
    let unreachable = "upstream_unreachable";
    seen.expect(addr_b, "app down", s, genuine(b), b, unreachable)
        .await;
    seen.stop("gate B log", gate_b).await;

    let dead = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:9/0");
    let p = path_b.clone();
    let url = dead.clone();
    let (gate_c, addr_c) = tokio::task::spawn_blocking(move || {
        Child::spawn_with_env(
            &p,
            &[
                ("HOOKGATE_STORE__BACKEND", "redis"),
                ("HOOKGATE_STORE__URL", &url),
            ],
        )
    })
    .await
    .unwrap();
    let what = "password store down";
    seen.expect(addr_c, what, s, genuine(b), b, "store_unavailable")
        .await;
    seen.stop("gate C log", gate_c).await;

    // The command line: check (fine, a missing secret, a literal one), sign
    // (fine and failing), keys.
    let run = |args: &[&str], env: &[(&str, &str)]| {
        hookgate()
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let a = path_a.to_str().unwrap();
    let out = run(&["check", "--config", a], &env);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    seen.output("check", &out);
    let out = run(&["check", "--config", a], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    seen.output("check, env secret missing", &out);
    let dir = config_a.dir();
    let literal = dir.join("literal.toml");
    std::fs::write(
        &literal,
        format!(
            "[providers.stripe]\nscheme = \"stripe\"\npath = \"/s\"\nsecrets = [\"{LITERAL}\"]\n\
             [store]\nbackend = \"redis\"\nurl = \"redis://:{REDIS_PASSWORD}@127.0.0.1:9\"\nlease = \"never\"\n"
        ),
    )
    .unwrap();
    let l = literal.to_str().unwrap();
    for cmd in ["check", "run"] {
        let out = run(&[cmd, "--config", l], &[]);
        assert_eq!(out.status.code(), Some(64), "{cmd}: {out:?}");
        seen.output("literal secret", &out);
    }
    let out = run(&["check", "--config", a], &[("HOOKGATE_STORE__URL", &dead)]);
    seen.output("check with a password url", &out);
    let body = dir.join("body.json");
    std::fs::write(&body, b"{\"id\":\"evt_signed\"}").unwrap();
    let body = body.to_str().unwrap();
    let out = run(
        &[
            "sign",
            "--provider",
            "stripe",
            "--config",
            a,
            "--body",
            body,
        ],
        &env,
    );
    assert!(out.status.success(), "{out:?}");
    seen.output("sign stripe", &out);
    let out = run(
        &["sign", "--provider", "std", "--config", a, "--body", body],
        &env,
    );
    assert!(out.status.success(), "{out:?}");
    seen.output("sign std", &out);
    for args in [
        vec!["sign", "--provider", "nope", "--config", a],
        vec![
            "sign",
            "--provider",
            "stripe",
            "--config",
            a,
            "--body",
            "/nonexistent",
        ],
        vec!["sign", "--provider", "std", "--config", a],
    ] {
        let out = run(&args, &[]);
        seen.output("sign error", &out);
    }
    for env in [&env[..], &[("HOOKGATE_STORE__URL", &dead)]] {
        let out = run(
            &[
                "keys",
                "get",
                "--provider",
                "stripe",
                "--config",
                a,
                "evt_secret_ok",
            ],
            env,
        );
        seen.output("keys get", &out);
    }

    let scanned: usize = seen.text.iter().map(|(_, t)| t.len()).sum();
    println!(
        "secrets: {} outputs, {scanned} bytes scanned for {} secret forms",
        seen.text.len(),
        needles().len()
    );
    seen.assert_clean();
}
