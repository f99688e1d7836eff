//! `hookgate check`, and the refusal to serve with no provider: the
//! configuration printed the way a user writes it, problems on stderr.

use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use super::EXIT_BAD_CONFIG;
use crate::config::text::{duration, size};
use crate::key::{KeyPart, KeySource};
use crate::secret::SecretSet;
use crate::settings::{Mode, OnMissingKey, ProviderSettings, Settings};
use crate::store::BackendSettings;

/// Why a gate with no provider does not start: one sentence, with the way
/// to add one and the explicit way out. `config` is the file that was read
/// (`None`: none was).
fn no_providers(config: Option<&Path>) -> String {
    let read = match config {
        Some(path) => format!("{} configures no provider", path.display()),
        None => "no providers are configured (no config.toml here, and no --config)".to_owned(),
    };
    format!(
        "{read}, so the gate would verify and deduplicate nothing: add a [providers.<name>] \
         section (see README, Quick start), or set server.allow_no_providers = true \
         (HOOKGATE_SERVER__ALLOW_NO_PROVIDERS=true) to run a plain pass-through proxy on purpose"
    )
}

/// `hookgate run` without providers: refused (exit 64) unless
/// `server.allow_no_providers` says it is meant.
pub fn refuse_without_providers(
    settings: &Settings,
    config: Option<&Path>,
) -> Result<(), ExitCode> {
    if settings.providers.is_empty() && !settings.server.allow_no_providers {
        eprintln!("hookgate: refusing to start: {}.", no_providers(config));
        return Err(ExitCode::from(EXIT_BAD_CONFIG));
    }
    Ok(())
}

/// `hookgate check`: exit 0 when the gate would start and verify, 1 when a
/// provider has no usable secret, 64 when `run` would refuse to start.
/// Problems go to stderr.
pub fn check(settings: &Settings, config: Option<&Path>) -> ExitCode {
    let mut problems = 0;
    println!("store: {}", describe_store(settings));
    if let Some(otlp) = &settings.telemetry.otlp {
        println!(
            "metrics: pushed over OTLP/HTTP to {} every {}",
            otlp.endpoint,
            duration(otlp.interval)
        );
    }
    match &settings.telemetry.traces {
        Some(traces) => println!(
            "traces: pushed over OTLP/HTTP to {}, {} of new traces kept (a sender's sampled trace always)",
            traces.endpoint,
            share(traces.sample_ratio)
        ),
        None if settings.telemetry.otlp.is_some() => println!(
            "traces: off (telemetry.trace_sample_ratio = 0, or otlp_endpoint has a path of its own: set otlp_traces_endpoint)"
        ),
        None => {}
    }
    for p in &settings.providers {
        problems += provider(p);
    }
    if matches!(settings.store.backend, BackendSettings::Memory { .. }) {
        eprintln!("warning: store.backend = \"memory\": a restart forgets every key");
    }
    if settings.providers.is_empty() {
        if !settings.server.allow_no_providers {
            eprintln!(
                "error: `hookgate run` would refuse to start: {}",
                no_providers(config)
            );
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
        eprintln!(
            "warning: no providers configured (server.allow_no_providers = true): every request is passed through unverified"
        );
    }
    if problems == 0 {
        println!("ok");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints one provider; returns the number of problems (on stderr).
fn provider(p: &ProviderSettings) -> usize {
    let mut problems = 0;
    println!("provider {}:", p.name);
    println!("  scheme: {}", p.scheme);
    println!("  path: {}", p.path);
    if p.mode == Mode::Queue {
        println!("  mode: queue");
    }
    println!(
        "  key: {}",
        p.key.as_ref().map_or("(none)".into(), key_source)
    );
    if p.on_missing_key == OnMissingKey::Forward {
        println!("  on_missing_key: forward");
    }
    println!("  tolerance: {}", duration(p.tolerance));
    if p.future_tolerance != p.tolerance {
        println!("  future_tolerance: {}", duration(p.future_tolerance));
    }
    println!("  retention: {}", duration(p.retention));
    let (set, _) = SecretSet::load(p.secrets.clone());
    for (i, spec) in set.specs().enumerate() {
        let until = spec
            .not_after
            .map(|t| format!(" (until {})", humantime::format_rfc3339_seconds(t)))
            .unwrap_or_default();
        match spec.source.presence() {
            Ok(()) => println!(
                "  secrets[{i}]: {}{until}: present (value not shown)",
                spec.source
            ),
            Err(why) => {
                println!("  secrets[{i}]: {}{until}: missing ({why})", spec.source);
                eprintln!(
                    "error: provider {}: secrets[{i}] {}: {why}",
                    p.name, spec.source
                );
                problems += 1;
            }
        }
    }
    if set.active(SystemTime::now()).is_empty() {
        eprintln!(
            "error: provider {} has no usable secret: it would refuse every delivery",
            p.name
        );
        problems += 1;
    }
    if let Some(window) = p.scheme.retry_window()
        && p.retention < window
    {
        eprintln!(
            "warning: provider {}: retention {} is shorter than {}'s retry window of {}",
            p.name,
            duration(p.retention),
            p.scheme,
            duration(window)
        );
    }
    if p.key == Some(KeySource::BodySha256) {
        eprintln!(
            "warning: provider {}: key = \"body_sha256\": a retry whose body differs by one byte is processed again",
            p.name
        );
    }
    problems
}

/// A key source as it is written in the config: `json:/id`,
/// `["form:MessageSid", "form:MessageStatus"]`, `json:/*/sg_event_id`.
fn key_source(key: &KeySource) -> String {
    match key {
        KeySource::BodySha256 => "body_sha256".into(),
        KeySource::Batch(pointer) => format!("json:/*{pointer}"),
        KeySource::Parts { parts, scope } => {
            let mut text = match parts.as_slice() {
                [one] => key_part(one),
                many => format!(
                    "[{}]",
                    many.iter()
                        .map(|p| format!("\"{}\"", key_part(p)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            if let Some(scope) = scope {
                text.push_str(&format!(" (scoped by header:{scope} when present)"));
            }
            text
        }
    }
}

fn key_part(part: &KeyPart) -> String {
    match part {
        KeyPart::Header(names) => names
            .iter()
            .map(|n| format!("header:{n}"))
            .collect::<Vec<_>>()
            .join(" or "),
        KeyPart::Json(pointer) => format!("json:{pointer}"),
        KeyPart::Form(field) => format!("form:{field}"),
    }
}

fn describe_store(settings: &Settings) -> String {
    let base = match &settings.store.backend {
        BackendSettings::Memory { capacity } => format!("memory (capacity {capacity})"),
        BackendSettings::Sqlite { path } => format!("sqlite ({})", path.display()),
        BackendSettings::Postgres { .. } => "postgres (URL not shown)".to_owned(),
        BackendSettings::Redis {
            prefix, cluster, ..
        } => {
            let kind = if *cluster { "redis cluster" } else { "redis" };
            format!("{kind} (prefix {prefix}; URL not shown)")
        }
    };
    format!(
        "{base}, retention {}, lease {}, answers stored up to {}",
        duration(settings.dedupe.retention),
        duration(settings.dedupe.lease),
        size(settings.dedupe.max_response_bytes as u64)
    )
}

/// A sampling ratio as a percentage: "100%", "10%", "0.5%".
fn share(ratio: f64) -> String {
    format!("{}%", (ratio * 1e5).round() / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(specs: &[&str]) -> String {
        let specs: Vec<String> = specs.iter().map(|s| (*s).to_owned()).collect();
        key_source(&KeySource::parse(&specs).unwrap())
    }

    #[test]
    fn keys_print_as_they_are_written() {
        assert_eq!(key(&["json:/id"]), "json:/id");
        assert_eq!(key(&["json:/*/sg_event_id"]), "json:/*/sg_event_id");
        assert_eq!(key(&["body_sha256"]), "body_sha256");
        assert_eq!(
            key(&["form:MessageSid", "form:MessageStatus"]),
            "[\"form:MessageSid\", \"form:MessageStatus\"]"
        );
        let github = KeySource::parse(&["header:X-GitHub-Delivery".into()])
            .unwrap()
            .scoped_by(http::HeaderName::from_static("x-github-hook-id"));
        assert_eq!(
            key_source(&github),
            "header:x-github-delivery (scoped by header:x-github-hook-id when present)"
        );
    }
}
