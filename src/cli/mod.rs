//! The command line: `run` (the default), `check`, `sign`, `demo`, `echo`,
//! `keys`, `queue`.

pub mod blocking;
mod check;
mod keys;
mod queue;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use http::{HeaderMap, HeaderName, HeaderValue, Uri};

pub use self::check::{check, refuse_without_providers};
// The commands' futures stay in the library: `main` runs them through
// `blocking`, which would not stay true were they public.
pub use self::keys::KeysAction;
use self::keys::keys;
pub use self::queue::QueueAction;
use self::queue::queue;
use crate::config::{self, ConfigErrors};
use crate::provider::{Delivery, Scheme, SignedHeaders, Verified, VerifyError};
use crate::secret::{ActiveSecret, SecretSet, SecretValue};
use crate::settings::{ProviderSettings, Settings};
use crate::store::Store;

/// Exit status for a configuration that does not validate, or a command
/// line that does not parse (sysexits' EX_USAGE).
pub const EXIT_BAD_CONFIG: u8 = 64;

/// The default configuration file, read when it exists.
const DEFAULT_CONFIG: &str = "config.toml";

const AFTER_HELP: &str = "\
Configuration, later layers win: built-in defaults; the TOML file (--config FILE, \
default ./config.toml when it exists); then environment variables \
HOOKGATE_<SECTION>__<KEY>, with a double underscore between levels \
(HOOKGATE_STORE__URL, HOOKGATE_PROVIDERS__STRIPE__TOLERANCE=7m). \
`hookgate check` shows the result.

Exit status: 0 done; 1 a failure at work (a missing secret in check, an \
unknown key, the store unreachable); 64 a usage or configuration error, with \
every problem listed.";

#[derive(Debug, Parser)]
#[command(
    name = "hookgate",
    version,
    about = "A webhook gate: verify, deduplicate, forward",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// The configuration file, for `hookgate` without a command (= run).
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `--config FILE`, on the commands that read the configuration.
#[derive(Debug, Args)]
pub struct ConfigArg {
    /// The configuration file [default: ./config.toml when it exists];
    /// HOOKGATE_<SECTION>__<KEY> environment variables apply on top.
    #[arg(long, short, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve (the default).
    Run(ConfigArg),
    /// Validate the configuration and secrets, print the resolved providers.
    Check(ConfigArg),
    /// Print the headers a real sender would attach to a body.
    Sign {
        /// The provider to sign for: its name in the configuration
        /// ([providers.<NAME>]), whose scheme and secret are used.
        #[arg(long, value_name = "NAME")]
        provider: String,
        /// The body to sign (`-` for stdin); default: a small JSON event.
        #[arg(long, value_name = "FILE")]
        body: Option<PathBuf>,
        /// The event id, where the scheme carries one in a header.
        #[arg(long)]
        id: Option<String>,
        /// The P-256 private key (PKCS#8 or SEC1, PEM or DER) to sign with,
        /// required by the sendgrid scheme: its configured secret is the
        /// public verification key, which cannot sign.
        #[arg(long, value_name = "FILE")]
        private_key: Option<PathBuf>,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Show the gate at work: no config file or services needed.
    Demo,
    /// A tiny app for trying the gate: answers every request and prints
    /// what it received (method, path, headers, body).
    Echo {
        /// Where to listen: the gate's default upstream.url.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
        listen: std::net::SocketAddr,
        /// The status to answer with (try 500: the gate releases the key,
        /// and the sender's retry gets through).
        #[arg(long, default_value_t = 200)]
        status: u16,
    },
    /// Inspect or forget a key in the configured store.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Queue mode's jobs: list, show, replay, purge the dead letter.
    Queue {
        #[command(subcommand)]
        action: QueueAction,
        #[command(flatten)]
        config: ConfigArg,
    },
}

impl Cli {
    /// The configuration file named on the command line, if any.
    pub fn config_arg(&self) -> Option<&Path> {
        let own = match &self.command {
            Some(
                Command::Run(c)
                | Command::Check(c)
                | Command::Sign { config: c, .. }
                | Command::Keys { config: c, .. }
                | Command::Queue { config: c, .. },
            ) => c.config.as_deref(),
            Some(Command::Demo | Command::Echo { .. }) | None => None,
        };
        own.or(self.config.as_deref())
    }

    /// The configuration file to read, and whether it exists.
    pub fn config_file(&self) -> (&Path, bool) {
        let path = self.config_arg().unwrap_or(Path::new(DEFAULT_CONFIG));
        (path, path.exists())
    }

    /// The configuration, or the errors printed and the exit code to use.
    pub fn settings(&self) -> Result<Settings, ExitCode> {
        let explicit = self.config_arg().is_some();
        config::figment(self.config_file().0, explicit)
            .and_then(|f| config::load(&f))
            .map_err(|e| {
                print_errors(&e);
                ExitCode::from(EXIT_BAD_CONFIG)
            })
    }
}

fn print_errors(errors: &ConfigErrors) {
    match errors.0.len() {
        1 => eprintln!("configuration is invalid (1 problem):"),
        n => eprintln!("configuration is invalid ({n} problems):"),
    }
    for issue in &errors.0 {
        eprintln!("  {}: {}", issue.key, issue.message);
    }
}

/// The provider named on the command line; else the configured names are
/// listed, and the exit code is 64.
fn provider<'a>(settings: &'a Settings, name: &str) -> Result<&'a ProviderSettings, ExitCode> {
    if let Some(p) = settings.providers.iter().find(|p| p.name == name) {
        return Ok(p);
    }
    let names: Vec<&str> = settings.providers.iter().map(|p| p.name.as_str()).collect();
    match names.as_slice() {
        [] => eprintln!("no provider named {name}: no providers are configured"),
        _ => eprintln!("no provider named {name}; configured: {}", names.join(", ")),
    }
    Err(ExitCode::from(EXIT_BAD_CONFIG))
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
    let p = match self::provider(settings, provider) {
        Ok(p) => p,
        Err(code) => return code,
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

/// A store command's exit: 0 when it found what it was asked about, 1 when
/// not (or the store failed, said on stderr).
fn store_exit(result: crate::store::Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("store error: {e}");
            ExitCode::FAILURE
        }
    }
}
