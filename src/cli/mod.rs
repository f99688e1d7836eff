//! The command line: `run` (the default), `check`, `sign`, `keys`,
//! `queue`.

mod queue;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use http::{HeaderMap, HeaderName, HeaderValue, Uri};

pub use self::queue::{QueueAction, queue};
use crate::config::{self, ConfigErrors};
use crate::key::KeySource;
use crate::provider::{Delivery, Scheme, SignedHeaders, Verified, VerifyError};
use crate::secret::{ActiveSecret, SecretSet, SecretValue};
use crate::settings::{ProviderSettings, Settings};
use crate::store::{Backend, Existing, ScopedKey, Store};

/// Exit status for a configuration that does not validate (sysexits'
/// EX_USAGE).
pub const EXIT_BAD_CONFIG: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "hookgate",
    version,
    about = "A webhook gate: verify, deduplicate, forward"
)]
pub struct Cli {
    /// The configuration file.
    #[arg(long, short, global = true, default_value = "config.toml")]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve (the default).
    Run,
    /// Validate the configuration and secrets, print the resolved providers.
    Check,
    /// Print the headers a real sender would attach to a body.
    Sign {
        #[arg(long)]
        provider: String,
        /// The body to sign (`-` for stdin); default: a small JSON event.
        #[arg(long)]
        body: Option<PathBuf>,
        /// The event id, where the scheme carries one in a header.
        #[arg(long)]
        id: Option<String>,
        /// The P-256 private key (PKCS#8 or SEC1, PEM or DER) to sign with,
        /// required by the sendgrid scheme: its configured secret is the
        /// public verification key, which cannot sign.
        #[arg(long, value_name = "FILE")]
        private_key: Option<PathBuf>,
    },
    /// Show the gate at work: no config file or services needed.
    Demo,
    /// Inspect or forget a key in the configured store.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Queue mode's jobs: list, show, replay, purge the dead letter.
    Queue {
        #[command(subcommand)]
        action: QueueAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Show a key's state.
    Get {
        #[arg(long)]
        provider: String,
        key: String,
    },
    /// Forget a key so that the provider's next redelivery is processed again.
    Forget {
        #[arg(long)]
        provider: String,
        key: String,
    },
}

impl Cli {
    /// The configuration, or the errors printed and the exit code to use.
    pub fn settings(&self) -> Result<Settings, ExitCode> {
        let explicit = self.config != Path::new("config.toml");
        config::figment(&self.config, explicit)
            .and_then(|f| config::load(&f))
            .map_err(|e| {
                print_errors(&e);
                ExitCode::from(EXIT_BAD_CONFIG)
            })
    }
}

fn print_errors(errors: &ConfigErrors) {
    eprintln!("configuration is invalid ({} problems):", errors.0.len());
    for issue in &errors.0 {
        eprintln!("  {}: {}", issue.key, issue.message);
    }
}

/// `hookgate check`: problems go to stderr and make the exit status 1.
pub fn check(settings: &Settings) -> ExitCode {
    let mut problems = 0;
    println!("store: {}", describe_store(settings));
    if let Some(otlp) = &settings.telemetry.otlp {
        println!(
            "metrics: pushed over OTLP/HTTP to {} every {}",
            otlp.endpoint,
            humantime::format_duration(otlp.interval)
        );
    }
    for p in &settings.providers {
        println!("provider {}:", p.name);
        println!("  scheme: {}", p.scheme);
        println!("  path: {}", p.path);
        println!(
            "  key: {}",
            p.key.as_ref().map_or("(none)".into(), |k| format!("{k:?}"))
        );
        println!("  tolerance: {}", humantime::format_duration(p.tolerance));
        println!("  retention: {}", humantime::format_duration(p.retention));
        let (set, missing) = SecretSet::load(p.secrets.clone());
        let active = set.active(SystemTime::now()).len();
        for (i, spec) in set.specs().enumerate() {
            let until = spec
                .not_after
                .map(|t| format!(" (until {})", humantime::format_rfc3339_seconds(t)))
                .unwrap_or_default();
            println!("  secret[{i}]: {}{until} <redacted>", spec.source);
        }
        for m in &missing {
            eprintln!("error: provider {}: {m}", p.name);
            problems += 1;
        }
        if active == 0 {
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
                humantime::format_duration(p.retention),
                p.scheme,
                humantime::format_duration(window)
            );
        }
        if p.key == Some(KeySource::BodySha256) {
            eprintln!(
                "warning: provider {}: key = \"body_sha256\": a retry whose body differs by one byte is processed again",
                p.name
            );
        }
    }
    if settings.providers.is_empty() {
        eprintln!("warning: no providers configured: every request is passed through unverified");
    }
    if matches!(
        settings.store.backend,
        crate::store::BackendSettings::Memory { .. }
    ) {
        eprintln!("warning: store.backend = \"memory\": a restart forgets every key");
    }
    if problems == 0 {
        println!("ok");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn describe_store(settings: &Settings) -> String {
    match &settings.store.backend {
        crate::store::BackendSettings::Memory { capacity } => {
            format!("memory (capacity {capacity})")
        }
        crate::store::BackendSettings::Sqlite { path } => format!("sqlite ({})", path.display()),
        crate::store::BackendSettings::Postgres { .. } => "postgres (URL redacted)".to_owned(),
        crate::store::BackendSettings::Redis { prefix, .. } => {
            format!("redis (prefix {prefix}; URL redacted)")
        }
    }
}

/// `hookgate sign`: headers on stdout, one `Name: value` per line; with no
/// `--body`, a blank line and the generated body follow.
///
/// The sendgrid scheme signs with `--private-key` (the configured secret is
/// the public key); every other scheme with the provider's first active
/// secret, and `--private-key` is ignored with a note.
pub fn sign(
    settings: &Settings,
    provider: &str,
    body: Option<&Path>,
    id: Option<&str>,
    private_key: Option<&Path>,
) -> ExitCode {
    let Some(p) = settings.providers.iter().find(|p| p.name == provider) else {
        eprintln!("no provider named {provider} in the configuration");
        return ExitCode::from(EXIT_BAD_CONFIG);
    };
    let sendgrid = matches!(p.scheme, Scheme::Sendgrid);
    match (sendgrid, private_key) {
        (true, None) => {
            eprintln!(
                "provider {provider} uses the sendgrid scheme: its configured secret is the public verification key, so signing needs --private-key FILE (a P-256 key in PKCS#8 or SEC1 form, PEM or DER)"
            );
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
        (false, Some(_)) => eprintln!(
            "note: --private-key is ignored: provider {provider} uses the {} scheme, which signs with its configured secret",
            p.scheme
        ),
        _ => {}
    }
    let id = id.map_or_else(
        || format!("evt_{:016x}", rand::random::<u64>()),
        str::to_owned,
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (bytes, generated) = match body {
        Some(path) => match read_body(path) {
            Ok(b) => (b, false),
            Err(code) => return code,
        },
        None => (generated_body(&p.scheme, &id, now), true),
    };
    let (set, problems) = SecretSet::load(p.secrets.clone());
    let active = set.active(SystemTime::now());
    let headers = match private_key.filter(|_| sendgrid) {
        Some(key_path) => {
            let Some(headers) = sign_sendgrid(key_path, &bytes, now) else {
                return ExitCode::FAILURE;
            };
            match verify(p, &active, &headers, &bytes) {
                Ok(_) => {}
                Err(VerifyError::NoUsableSecret) => {
                    for m in &problems {
                        eprintln!("warning: {m}");
                    }
                    eprintln!(
                        "warning: provider {provider} has no usable verification key (base64 DER P-256 public key): the gate would refuse these headers"
                    );
                }
                Err(_) => eprintln!(
                    "warning: the private key matches none of provider {provider}'s verification keys: the gate would refuse these headers"
                ),
            }
            headers
        }
        None => {
            let Some(secret) = active.first() else {
                for m in problems {
                    eprintln!("error: {m}");
                }
                eprintln!("provider {provider} has no usable secret to sign with");
                return ExitCode::FAILURE;
            };
            p.scheme.sign(secret.value.expose(), &bytes, &id, now)
        }
    };
    for (name, value) in headers {
        println!("{name}: {value}");
    }
    if generated {
        println!();
        println!("{}", String::from_utf8_lossy(&bytes));
    }
    ExitCode::SUCCESS
}

/// The body to sign, from a file or (`-`) stdin.
fn read_body(path: &Path) -> Result<Vec<u8>, ExitCode> {
    let (read, from) = if path == Path::new("-") {
        let mut buf = Vec::new();
        let read = std::io::stdin().read_to_end(&mut buf).map(|_| buf);
        (read, "stdin".to_owned())
    } else {
        (std::fs::read(path), path.display().to_string())
    };
    read.map_err(|e| {
        eprintln!("cannot read the body from {from}: {e}");
        ExitCode::FAILURE
    })
}

/// A small event in the shape the scheme's senders use: SendGrid posts an
/// array of events keyed by `sg_event_id`, the others a JSON object.
fn generated_body(scheme: &Scheme, id: &str, now: i64) -> Vec<u8> {
    let event = match scheme {
        Scheme::Sendgrid => serde_json::json!([{
            "email": "test@example.com",
            "event": "processed",
            "sg_event_id": id,
            "timestamp": now,
        }]),
        _ => serde_json::json!({ "id": id, "type": "hookgate.test" }),
    };
    event.to_string().into_bytes()
}

/// SendGrid's headers for `body`, signed with the private key in `key_path`.
/// The key's bytes stay in a [`SecretValue`] and never reach a message: the
/// errors name the file and what it is not.
fn sign_sendgrid(key_path: &Path, body: &[u8], now: i64) -> Option<SignedHeaders> {
    let key = match std::fs::read(key_path) {
        Ok(bytes) => SecretValue::new(bytes),
        Err(e) => {
            eprintln!("cannot read the private key {}: {e}", key_path.display());
            return None;
        }
    };
    crate::provider::sendgrid_sign(key.expose(), body, now)
        .map_err(|e| eprintln!("cannot sign with {}: {e}", key_path.display()))
        .ok()
}

/// Verifies these headers and body as the gate would on the provider's
/// path, with the secrets active now.
fn verify(
    p: &ProviderSettings,
    active: &[ActiveSecret],
    headers: &SignedHeaders,
    body: &[u8],
) -> Result<Verified, VerifyError> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            map.append(name, value);
        }
    }
    let uri: Uri = p.path.parse().unwrap_or_default();
    let delivery = Delivery {
        headers: &map,
        body,
        uri: &uri,
    };
    p.scheme.verify(&delivery, active)
}

/// The configured store, for a command; the error says why not.
async fn open_store(settings: &Settings) -> Result<Store, ExitCode> {
    Store::open(&settings.store).await.map_err(|e| {
        eprintln!("cannot open the store: {e}");
        ExitCode::FAILURE
    })
}

/// `hookgate keys get|forget`.
pub async fn keys(settings: &Settings, action: &KeysAction) -> ExitCode {
    let (KeysAction::Get { provider, key } | KeysAction::Forget { provider, key }) = action;
    if !settings.providers.iter().any(|p| &p.name == provider) {
        eprintln!("no provider named {provider} in the configuration");
        return ExitCode::from(EXIT_BAD_CONFIG);
    }
    let store = match open_store(settings).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let scoped = ScopedKey::new(provider, key.trim().to_lowercase());
    let result = match action {
        KeysAction::Get { .. } => store.get(&scoped).await.map(|record| match record {
            None => println!("{scoped}: unknown"),
            Some(r) => match r.state {
                Existing::InFlight { retry_after } => println!(
                    "{scoped}: in flight (lease ends in {})",
                    humantime::format_duration(retry_after)
                ),
                Existing::Completed(s) => println!(
                    "{scoped}: completed (status {}, {} bytes stored, fingerprint {})",
                    s.status,
                    s.body.len(),
                    r.fingerprint
                ),
            },
        }),
        KeysAction::Forget { .. } => store.forget(&scoped).await.map(|found| {
            if found {
                println!("{scoped}: forgotten; the next redelivery will be processed");
            } else {
                println!("{scoped}: unknown; nothing to forget");
            }
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("store error: {e}");
            ExitCode::FAILURE
        }
    }
}
