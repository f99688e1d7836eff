use std::time::Duration;

use super::*;
use crate::settings::OnMissingKey;

fn errors(toml: &str) -> Vec<String> {
    match load(&figment_from_str(toml)) {
        Ok(_) => panic!("expected errors"),
        Err(e) => {
            e.0.iter()
                .map(|i| format!("{}: {}", i.key, i.message))
                .collect()
        }
    }
}

const STRIPE: &str = r#"
[providers.stripe]
scheme = "stripe"
path = "/webhooks/stripe"
secrets = ["env:STRIPE_WEBHOOK_SECRET"]
"#;

#[test]
fn defaults_fill_what_the_file_leaves_out() {
    let s = load(&figment_from_str(STRIPE)).unwrap();
    assert_eq!(s.server.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(s.server.max_body_bytes, 1024 * 1024);
    assert_eq!(s.dedupe.retention, Duration::from_secs(4 * 86400));
    assert_eq!(s.dedupe.lease, Duration::from_secs(30));
    assert_eq!(s.upstream.max_connections, 64);
    let p = &s.providers[0];
    assert_eq!(p.tolerance, Duration::from_secs(300));
    assert_eq!(p.future_tolerance, p.tolerance);
    assert_eq!(p.on_missing_key, OnMissingKey::Reject);
    assert!(p.key.is_some());
}

#[test]
fn every_error_is_reported_at_once_with_its_key() {
    let errs = errors(
        r#"
[server]
read_timeout = "soon"
bogus = 1

[upstream]
timeout = "40s"

[store]
lease = "30s"

[providers.stripe]
scheme = "stripe"
path = "webhooks"
secrets = ["whsec_pasted_literal"]
tolerance = "5 parsecs"

[providers.acme]
scheme = "hmac"
path = "/acme"
secrets = ["env:ACME"]
"#,
    );
    let joined = errors_text(&errs);
    assert!(joined.contains("bogus"), "{joined}");
    assert!(joined.contains("store.lease"), "{joined}");
    assert!(joined.contains("providers.stripe.path"), "{joined}");
    assert!(joined.contains("providers.stripe.secrets[0]"), "{joined}");
    assert!(joined.contains("providers.stripe.tolerance"), "{joined}");
    assert!(
        joined.contains("providers.acme.signature_header"),
        "{joined}"
    );
    assert!(joined.contains("providers.acme.key"), "{joined}");
    assert!(!joined.contains("whsec_pasted_literal"), "{joined}");
}

#[test]
fn durations_and_addresses_are_validated_together() {
    let errs = errors(
        r#"
[server]
read_timeout = "soon"
listen = "nowhere"
[upstream]
timeout = "never"
max_connections = 0
"#,
    );
    let joined = errors_text(&errs);
    assert!(joined.contains("upstream.max_connections"), "{joined}");
    assert!(joined.contains("server.read_timeout"), "{joined}");
    assert!(joined.contains("server.listen"), "{joined}");
    assert!(joined.contains("upstream.timeout"), "{joined}");
}

#[test]
fn unknown_provider_keys_and_sections_are_refused() {
    let errs = errors(&format!("{STRIPE}colour = \"blue\"\n[extra]\na = 1\n"));
    let joined = errors_text(&errs);
    assert!(joined.contains("colour"), "{joined}");
    assert!(joined.contains("extra: unknown section"), "{joined}");
}

#[test]
fn redis_needs_a_url_and_hmac_keys_belong_to_hmac() {
    let errs = errors(&format!(
        "{STRIPE}signature_header = \"X-Sig\"\n[store]\nbackend = \"redis\"\n"
    ));
    let joined = errors_text(&errs);
    assert!(joined.contains("store.url"), "{joined}");
    assert!(
        joined.contains("providers.stripe.signature_header"),
        "{joined}"
    );
}

#[test]
fn postgres_needs_a_postgres_url_and_keeps_the_longest_retention() {
    let errs = errors(&format!("{STRIPE}[store]\nbackend = \"postgres\"\n"));
    let joined = errors_text(&errs);
    assert!(joined.contains("store.url: required"), "{joined}");
    let errs = errors(&format!(
        "{STRIPE}[store]\nbackend = \"postgres\"\nurl = \"redis://127.0.0.1\"\n"
    ));
    assert!(errors_text(&errs).contains("store.url"), "{errs:?}");

    let s = load(&figment_from_str(&format!(
        "{STRIPE}retention = \"7d\"\n[store]\nbackend = \"postgres\"\nurl = \"postgres://gate@db/hookgate\"\nretention = \"4d\"\n"
    )))
    .unwrap();
    match s.store.backend {
        crate::store::BackendSettings::Postgres { url, retention } => {
            assert_eq!(url, "postgres://gate@db/hookgate");
            assert_eq!(retention, Duration::from_secs(7 * 86400));
        }
        other => panic!("expected postgres, got {other:?}"),
    }
}

#[test]
fn otlp_export_is_off_by_default_and_takes_a_collector_url() {
    let s = load(&figment_from_str(STRIPE)).unwrap();
    assert!(s.telemetry.otlp.is_none());

    let with = |endpoint: &str| {
        let toml = format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n{STRIPE}");
        let s = load(&figment_from_str(&toml)).unwrap();
        let otlp = s.telemetry.otlp.unwrap();
        assert_eq!(otlp.interval, Duration::from_secs(60));
        otlp.endpoint.to_string()
    };
    assert_eq!(
        with("http://collector:4318"),
        "http://collector:4318/v1/metrics"
    );
    assert_eq!(
        with("https://otel.example/custom/path"),
        "https://otel.example/custom/path"
    );

    let errs = errors(&format!(
        "[telemetry]\notlp_endpoint = \"collector:4318\"\notlp_interval = \"often\"\n{STRIPE}"
    ));
    let text = errors_text(&errs);
    assert!(
        text.contains("telemetry.otlp_endpoint: `collector:4318` is not a URL"),
        "{text}"
    );
    assert!(text.contains("telemetry.otlp_interval: `often`"), "{text}");
    let errs = errors(&format!(
        "[telemetry]\notlp_endpoint = \"https://user:hunter2@collector:4318\"\n{STRIPE}"
    ));
    let text = errors_text(&errs);
    assert!(text.contains("must not carry credentials"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    let errs = errors(&format!("[telemetry]\nmystery = 1\n{STRIPE}"));
    assert!(errors_text(&errs).contains("telemetry.mystery"), "{errs:?}");
}

#[test]
fn traces_go_beside_the_metrics_and_sample_every_delivery_by_default() {
    let s = load(&figment_from_str(STRIPE)).unwrap();
    assert!(s.telemetry.traces.is_none(), "no endpoint, no traces");

    let traces = |telemetry: &str| {
        let toml = format!("[telemetry]\n{telemetry}\n{STRIPE}");
        let s = load(&figment_from_str(&toml)).unwrap();
        s.telemetry
            .traces
            .map(|t| (t.endpoint.to_string(), t.sample_ratio))
    };
    let at = |url: &str| (url.to_owned(), 1.0);
    assert_eq!(
        traces("otlp_endpoint = \"http://collector:4318\""),
        Some(at("http://collector:4318/v1/traces"))
    );
    assert_eq!(
        traces("otlp_endpoint = \"https://otel.example/gw/v1/metrics\""),
        Some(at("https://otel.example/gw/v1/traces"))
    );
    assert_eq!(
        traces("otlp_endpoint = \"https://otel.example/custom/path\""),
        None,
        "a path of its own says nothing of the traces' URL"
    );
    assert_eq!(
        traces(
            "otlp_endpoint = \"https://otel.example/custom/path\"\notlp_traces_endpoint = \"https://otel.example/t\""
        ),
        Some(at("https://otel.example/t"))
    );
    assert_eq!(
        traces("otlp_endpoint = \"http://collector:4318\"\ntrace_sample_ratio = 0.25"),
        Some(("http://collector:4318/v1/traces".to_owned(), 0.25))
    );
    assert_eq!(
        traces("otlp_endpoint = \"http://collector:4318\"\ntrace_sample_ratio = 0"),
        None,
        "0 turns traces off"
    );

    for bad in ["1.5", "-0.1", "nan"] {
        let errs = errors(&format!(
            "[telemetry]\notlp_endpoint = \"http://c:4318\"\ntrace_sample_ratio = {bad}\n{STRIPE}"
        ));
        let text = errors_text(&errs);
        assert!(
            text.contains("telemetry.trace_sample_ratio"),
            "{bad}: {text}"
        );
    }
    let errs = errors(&format!(
        "[telemetry]\notlp_traces_endpoint = \"collector\"\n{STRIPE}"
    ));
    assert!(
        errors_text(&errs).contains("telemetry.otlp_traces_endpoint: `collector` is not a URL"),
        "{errs:?}"
    );
}

#[test]
fn secret_tables_take_not_after() {
    let s = load(&figment_from_str(
        r#"
[providers.gh]
scheme = "github"
path = "/gh"
secrets = ["file:/run/a", { source = "env:B", not_after = "2026-12-31T00:00:00Z" }]
"#,
    ))
    .unwrap();
    assert_eq!(s.providers[0].secrets.len(), 2);
    assert!(s.providers[0].secrets[1].not_after.is_some());
    let errs = errors(
        r#"
[providers.gh]
scheme = "github"
path = "/gh"
secrets = [{ source = "env:B", not_after = "next week" }]
"#,
    );
    assert!(errors_text(&errs).contains("not_after"));
}

fn errors_text(errs: &[String]) -> String {
    errs.join("\n")
}

/// A replay window longer than a provider's retry window makes no sense,
/// and a huge one would wrap the window check's arithmetic (seconds as
/// `i64`): past 7 days, `tolerance` and `future_tolerance` are refused.
#[test]
fn a_replay_window_past_seven_days_is_refused() {
    let errs = errors(&format!(
        "{STRIPE}tolerance = \"7days 1s\"\nfuture_tolerance = \"300000000000y\"\n"
    ));
    let joined = errors_text(&errs);
    assert!(joined.contains("providers.stripe.tolerance: "), "{joined}");
    assert!(
        joined.contains("providers.stripe.future_tolerance: "),
        "{joined}"
    );
    assert!(joined.contains("retry window"), "says why: {joined}");

    let week = Duration::from_secs(7 * 86400);
    let s = load(&figment_from_str(&format!(
        "{STRIPE}tolerance = \"7d\"\nfuture_tolerance = \"1week\"\n"
    )))
    .unwrap();
    assert_eq!(s.providers[0].tolerance, week);
    assert_eq!(s.providers[0].future_tolerance, week);
}

/// A secret pasted where a list or another type was expected, or on a line
/// that does not parse, must not come back in the error (found by the
/// `config` fuzz target).
#[test]
fn a_pasted_secret_is_never_echoed_in_an_error() {
    let wrong_type =
        "[providers.x]\nscheme = \"stripe\"\npath = \"/x\"\nsecrets = \"whsec_pasted_literal\"\n";
    let joined = errors_text(&errors(wrong_type));
    assert!(joined.contains("providers.x.secrets"), "{joined}");
    assert!(
        joined.contains("found a string"),
        "says what it was: {joined}"
    );
    assert!(!joined.contains("whsec_pasted_literal"), "{joined}");

    let syntax = "[providers.x]\nsecrets = [\"whsec_on_a_bad_line\" \"env:X\"]\n";
    let joined = errors_text(&errors(syntax));
    assert!(joined.contains("line 2"), "says where: {joined}");
    assert!(!joined.contains("whsec_on_a_bad_line"), "{joined}");
}

/// Issue 18, item 5: what a newcomer's typos get back.
#[test]
fn an_unknown_key_is_named_once_with_the_nearest_known_one() {
    let errs = errors(&format!("[server]\nread_timout = \"5s\"\n{STRIPE}"));
    assert_eq!(
        errs,
        ["server.read_timout: unknown key; did you mean `read_timeout`?"]
    );
    let errs = errors(&format!("{STRIPE}colour = \"blue\"\n"));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("providers.stripe.colour: unknown key (known here: scheme, path"),
        "no near key: the known ones are listed: {errs:?}"
    );
    let errs = errors(&format!("[sever]\nlisten = \"0.0.0.0:1\"\n{STRIPE}"));
    assert_eq!(errs, ["sever: unknown section; did you mean `server`?"]);
}

#[test]
fn a_wrong_scheme_does_not_hide_the_providers_other_errors() {
    let errs = errors(
        "[providers.pay]\nscheme = \"strpe\"\npath = \"no-slash\"\nsecrets = [\"whsec_pasted\"]\ntolerance = 300\nmystery = 1\n",
    );
    let joined = errors_text(&errs);
    assert!(
        joined.contains(
            "providers.pay.scheme: unknown value; did you mean `stripe`? (one of `stripe`, `github`"
        ),
        "{joined}"
    );
    assert!(!joined.contains("``"), "no nested backticks: {joined}");
    assert!(
        !joined.contains("strpe"),
        "the value is not echoed: {joined}"
    );
    assert!(
        joined.contains("providers.pay.path: must be a URL path"),
        "{joined}"
    );
    assert!(
        joined.contains("providers.pay.secrets[0]: literal secrets"),
        "{joined}"
    );
    assert!(!joined.contains("whsec_pasted"), "{joined}");
    assert!(
        joined.contains("providers.pay.mystery: unknown key"),
        "{joined}"
    );
    assert!(
        joined.contains(
            "providers.pay.tolerance: a duration is a string with a unit: write \"300s\""
        ),
        "{joined}"
    );
    assert_eq!(
        errs.iter()
            .filter(|e| e.starts_with("providers.pay.scheme"))
            .count(),
        1,
        "the scheme is reported once, not again as required: {joined}"
    );

    let errs = errors("[providers.bare]\nsecrets = [\"env:X\"]\n");
    let joined = errors_text(&errs);
    assert!(
        joined.contains("providers.bare.scheme: required"),
        "{joined}"
    );
    assert!(joined.contains("providers.bare.path: required"), "{joined}");
}

#[test]
fn every_bad_key_of_a_section_is_reported_not_only_the_first() {
    let errs = errors(&format!(
        "[server]\nlisten = 8080\nmax_connections = \"many\"\nread_timeout = 10\nshutdown_grace = \"soon\"\n{STRIPE}"
    ));
    let joined = errors_text(&errs);
    for key in [
        "server.listen",
        "server.max_connections",
        "server.read_timeout: a duration is a string with a unit: write \"10s\"",
        "server.shutdown_grace",
    ] {
        assert!(joined.contains(key), "{key} missing from:\n{joined}");
    }
}

#[test]
fn sizes_take_units_and_plain_integers() {
    let s = load(&figment_from_str(&format!(
        "[server]\nmax_body_bytes = \"512KiB\"\nmax_header_bytes = \"1MiB\"\n[store]\nmax_response_bytes = 1000\n{STRIPE}"
    )))
    .unwrap();
    assert_eq!(s.server.max_body_bytes, 512 * 1024);
    assert_eq!(s.server.max_header_bytes, 1024 * 1024);
    assert_eq!(s.dedupe.max_response_bytes, 1000);
    let s = load(&figment_from_str(&format!(
        "[server]\nmax_body_bytes = \"1MB\"\n{STRIPE}"
    )))
    .unwrap();
    assert_eq!(s.server.max_body_bytes, 1_000_000);

    let errs = errors(&format!(
        "[server]\nmax_body_bytes = \"whsec_as_a_size\"\n{STRIPE}"
    ));
    let joined = errors_text(&errs);
    assert!(
        joined.contains(
            "server.max_body_bytes: is not a size: write bytes (1048576) or a number with a unit"
        ),
        "{joined}"
    );
    assert!(!joined.contains("whsec_as_a_size"), "{joined}");
    let errs = errors(&format!("[server]\nmax_body_bytes = -1\n{STRIPE}"));
    assert!(
        errors_text(&errs).contains("server.max_body_bytes"),
        "{errs:?}"
    );
}

/// The bodies in flight hold at least one body of the largest size; by
/// default 64 MiB, or one body when that is larger (a config that allowed a
/// 100 MiB body still starts).
#[test]
fn bodies_in_flight_hold_at_least_one_body() {
    let s = load(&figment_from_str(STRIPE)).unwrap();
    assert_eq!(s.server.max_body_bytes_in_flight, 64 * 1024 * 1024);
    let s = load(&figment_from_str(&format!(
        "[server]\nmax_body_bytes = \"100MiB\"\n{STRIPE}"
    )))
    .unwrap();
    assert_eq!(s.server.max_body_bytes_in_flight, 100 * 1024 * 1024);
    let errs = errors(&format!(
        "[server]\nmax_body_bytes_in_flight = \"lots\"\n{STRIPE}"
    ));
    let joined = errors_text(&errs);
    assert!(
        joined.contains("server.max_body_bytes_in_flight: is not a size"),
        "{joined}"
    );
    assert!(!joined.contains("must be at least"), "{joined}");
    let s = load(&figment_from_str(&format!(
        "[server]\nmax_body_bytes = \"2MiB\"\nmax_body_bytes_in_flight = \"2MiB\"\n{STRIPE}"
    )))
    .unwrap();
    assert_eq!(s.server.max_body_bytes_in_flight, 2 * 1024 * 1024);
    let errs = errors(&format!(
        "[server]\nmax_body_bytes = \"2MiB\"\nmax_body_bytes_in_flight = \"1MiB\"\n{STRIPE}"
    ));
    assert!(
        errors_text(&errs).contains(
            "server.max_body_bytes_in_flight: must be at least server.max_body_bytes (2097152 bytes)"
        ),
        "{errs:?}"
    );
}

/// A request's path never holds a query or a fragment (routing reads it
/// without its query), so a provider whose path did would never match, and
/// its deliveries would pass through unverified.
#[test]
fn a_path_with_a_query_fragment_or_blank_is_refused() {
    for (path, upstream_path) in [
        ("/hooks?token=abc", "/internal"),
        ("/hooks#x", "/internal"),
        ("/hooks/a b", "/internal"),
        ("/hooks", "/internal?x=1"),
        ("/hooks", "internal"),
    ] {
        let errs = errors(&format!(
            "[providers.pay]\nscheme = \"stripe\"\npath = \"{path}\"\nupstream_path = \"{upstream_path}\"\nsecrets = [\"env:PAY_SECRET\"]\n"
        ));
        let field = if path == "/hooks" {
            "upstream_path"
        } else {
            "path"
        };
        assert_eq!(
            errs,
            [format!(
                "providers.pay.{field}: must be a URL path: {}",
                if upstream_path == "internal" {
                    "the path does not start with `/`"
                } else {
                    "a request's path has no `?`, `#`, blank or control character"
                }
            )],
            "{path} {upstream_path}"
        );
    }
}
