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
use crate::support::gate::{Answer, GateConfig, post, provider, secret_file, send, signed};
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

async fn deliver(
    seen: &mut Transcript,
    addr: SocketAddr,
    what: &str,
    headers: Vec<(String, String)>,
    body: &[u8],
    path: &str,
) -> Answer {
    let a = post(addr, path, &headers, body).await;
    seen.answer(what, &a);
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_path_reveals_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Transcript::default();
    let up = Upstream::start().await;
    let mut redis = RedisServer::start();

    // Gate A: redis, in front of the recording app. The stripe secret is a
    // file, the standard one an environment variable.
    let mut config = GateConfig::new(&up.url(), dir.path());
    config.upstream = format!("url = \"{}\"\ntimeout = \"1s\"\n", up.url());
    config.store = format!(
        "backend = \"redis\"\nurl = \"{}\"\nlease = \"3s\"\ntimeout = \"300ms\"\n",
        redis.url()
    );
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "stripe", STRIPE_SECRET)],
        "",
    ) + &provider("std", "standard", &["env:HG_TEST_STD_SECRET".into()], "");
    let path_a = dir.path().join("a.toml");
    std::fs::write(&path_a, config.toml()).unwrap();
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
    let s = "/webhooks/stripe";
    let ok = br#"{"id":"evt_secret_ok"}"#;
    assert_eq!(
        deliver(
            &mut seen,
            addr,
            "ok",
            stripe(ok, STRIPE_SECRET, None),
            ok,
            s
        )
        .await
        .result(),
        "forwarded"
    );
    assert_eq!(
        deliver(
            &mut seen,
            addr,
            "dup",
            stripe(ok, STRIPE_SECRET, None),
            ok,
            s
        )
        .await
        .result(),
        "duplicate"
    );
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
        assert_eq!(
            deliver(&mut seen, addr, what, headers, &body, s)
                .await
                .result(),
            code,
            "{what}"
        );
    }
    // A body that carries the secrets is forwarded, but never logged.
    let leaky = format!(r#"{{"id":"evt_leaky","a":"{STRIPE_SECRET}","b":"{std}"}}"#);
    let h = stripe(leaky.as_bytes(), STRIPE_SECRET, None);
    assert_eq!(
        deliver(&mut seen, addr, "leaky body", h, leaky.as_bytes(), s)
            .await
            .result(),
        "forwarded"
    );
    // The standard provider, forged and genuine.
    let sb = b"{\"type\":\"ping\"}";
    let forged = signed(&Scheme::Standard, "whsec_AAAAAAAA", sb, "msg_1", None);
    assert_eq!(
        deliver(&mut seen, addr, "std forged", forged, sb, "/webhooks/std")
            .await
            .result(),
        "invalid_signature"
    );
    let good = signed(&Scheme::Standard, &std, sb, "msg_1", None);
    assert_eq!(
        deliver(&mut seen, addr, "std ok", good, sb, "/webhooks/std")
            .await
            .result(),
        "forwarded"
    );
    // The app failing, then too slow.
    up.set(Behavior::Status(500));
    let b = br#"{"id":"evt_secret_500"}"#;
    assert_eq!(
        deliver(
            &mut seen,
            addr,
            "app 500",
            stripe(b, STRIPE_SECRET, None),
            b,
            s
        )
        .await
        .result(),
        "upstream_error"
    );
    up.set(Behavior::Stall(Duration::from_millis(1500)));
    assert_eq!(
        deliver(
            &mut seen,
            addr,
            "app slow",
            stripe(b, STRIPE_SECRET, None),
            b,
            s
        )
        .await
        .result(),
        "upstream_timeout"
    );
    up.set(Behavior::Status(200));
    // Non-POST, unknown route (passthrough answers from the app).
    let a = send(addr, Method::GET, s, &[], Vec::new()).await;
    seen.answer("GET", &a);
    assert_eq!(a.result(), "method_not_allowed");
    // The store down.
    redis.kill();
    let b = br#"{"id":"evt_secret_store"}"#;
    assert_eq!(
        deliver(
            &mut seen,
            addr,
            "store down",
            stripe(b, STRIPE_SECRET, None),
            b,
            s
        )
        .await
        .result(),
        "store_unavailable"
    );
    seen.admin(admin_a).await;
    redis.restart();
    tokio::time::sleep(Duration::from_millis(300)).await;
    seen.admin(admin_a).await;
    let (_, lines) = tokio::task::spawn_blocking(move || gate_a.stop())
        .await
        .unwrap();
    seen.lines("gate A log", &lines);
    assert!(
        lines.iter().any(|l| l.contains("store_unavailable")),
        "the store outage was logged"
    );

    // Gate B: the app unreachable, and a redis URL with a password that
    // cannot be reached (given by environment variable).
    let mut config = GateConfig::new("http://127.0.0.1:9", dir.path());
    config.providers = provider(
        "stripe",
        "stripe",
        &[secret_file(dir.path(), "stripe", STRIPE_SECRET)],
        "",
    );
    let path_b = dir.path().join("b.toml");
    std::fs::write(&path_b, config.toml()).unwrap();
    let p = path_b.clone();
    let (gate_b, addr_b) = tokio::task::spawn_blocking(move || Child::spawn(&p))
        .await
        .unwrap();
    let b = br#"{"id":"evt_secret_502"}"#;
    let a = post(addr_b, s, &stripe(b, STRIPE_SECRET, None), b).await;
    seen.answer("app down", &a);
    assert_eq!(a.result(), "upstream_unreachable");
    seen.admin(gate_b.admin_addr()).await;
    let (_, lines) = tokio::task::spawn_blocking(move || gate_b.stop())
        .await
        .unwrap();
    seen.lines("gate B log", &lines);

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
    let a = post(addr_c, s, &stripe(b, STRIPE_SECRET, None), b).await;
    seen.answer("password store down", &a);
    assert_eq!(a.result(), "store_unavailable");
    seen.admin(gate_c.admin_addr()).await;
    let (_, lines) = tokio::task::spawn_blocking(move || gate_c.stop())
        .await
        .unwrap();
    seen.lines("gate C log", &lines);

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
    let literal = dir.path().join("literal.toml");
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
    let body = dir.path().join("body.json");
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
