//! Secret sources (`env:NAME`, `file:/path`), rotation windows and redaction.
//!
//! A secret's value lives only in [`SecretValue`], whose `Debug` never shows it.
//! File sources are re-read by a background task when the file changes, so a
//! rotated Kubernetes Secret takes effect without a restart.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// The bytes of one secret. `Debug` and `Display` print a placeholder only.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Vec<u8>);

impl SecretValue {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The raw bytes. Call sites are the crypto helpers and nothing else.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// Where a secret comes from, as written in the config (`env:NAME` or `file:/path`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    Env(String),
    File(PathBuf),
}

impl SecretSource {
    /// Parses `env:NAME` or `file:/path`. Anything else is refused, and the
    /// refusal never repeats the text, which may be a pasted secret.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        if let Some(name) = text.strip_prefix("env:") {
            if name.is_empty() {
                return Err("`env:` needs a variable name");
            }
            Ok(Self::Env(name.to_owned()))
        } else if let Some(path) = text.strip_prefix("file:") {
            if path.is_empty() {
                return Err("`file:` needs a path");
            }
            Ok(Self::File(PathBuf::from(path)))
        } else {
            Err("literal secrets are refused: write `env:NAME` or `file:/path`")
        }
    }

    /// Whether the secret can be read now; the error says why not (the
    /// variable or file, never a value).
    pub fn presence(&self) -> Result<(), String> {
        self.read().map(|_| ())
    }

    /// Reads the current value. Trailing newlines of files are dropped (a
    /// Secret written with `echo` has one); nothing else is altered.
    fn read(&self) -> Result<SecretValue, String> {
        match self {
            Self::Env(name) => match std::env::var_os(name) {
                Some(v) if !v.is_empty() => Ok(SecretValue::new(v.into_encoded_bytes())),
                Some(_) => Err(format!("environment variable {name} is empty")),
                None => Err(format!("environment variable {name} is not set")),
            },
            Self::File(path) => match std::fs::read(path) {
                Ok(mut bytes) => {
                    while matches!(bytes.last(), Some(b'\n' | b'\r')) {
                        bytes.pop();
                    }
                    if bytes.is_empty() {
                        Err(format!("secret file {} is empty", path.display()))
                    } else {
                        Ok(SecretValue::new(bytes))
                    }
                }
                Err(e) => Err(format!("secret file {}: {}", path.display(), e.kind())),
            },
        }
    }
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Env(name) => write!(f, "env:{name}"),
            Self::File(path) => write!(f, "file:{}", path.display()),
        }
    }
}

/// One configured secret: its source and the instant after which it is no
/// longer accepted.
#[derive(Clone, Debug)]
pub struct SecretSpec {
    pub source: SecretSource,
    pub not_after: Option<SystemTime>,
}

/// A secret that may be used right now, with its position in the configured
/// list (reported by `hookgate_secret_matches_total`).
#[derive(Clone, Debug)]
pub struct ActiveSecret {
    pub index: usize,
    pub value: Arc<SecretValue>,
}

struct Slot {
    spec: SecretSpec,
    value: RwLock<Option<Arc<SecretValue>>>,
}

/// The secrets of one provider, in configured order.
pub struct SecretSet {
    slots: Vec<Slot>,
}

impl fmt::Debug for SecretSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.slots.iter().map(|s| s.spec.source.to_string()))
            .finish()
    }
}

impl SecretSet {
    /// Loads every source once. Sources that cannot be read yet are kept (a
    /// file may be mounted later) and reported in the returned problems.
    pub fn load(specs: Vec<SecretSpec>) -> (Self, Vec<String>) {
        let mut problems = Vec::new();
        let slots = specs
            .into_iter()
            .map(|spec| {
                let value = match spec.source.read() {
                    Ok(v) => Some(Arc::new(v)),
                    Err(e) => {
                        problems.push(e);
                        None
                    }
                };
                Slot {
                    spec,
                    value: RwLock::new(value),
                }
            })
            .collect();
        (Self { slots }, problems)
    }

    /// A set holding the given values directly (for `hookgate sign` and tests).
    pub fn from_values(values: Vec<SecretValue>) -> Self {
        let slots = values
            .into_iter()
            .map(|v| Slot {
                spec: SecretSpec {
                    source: SecretSource::Env(String::new()),
                    not_after: None,
                },
                value: RwLock::new(Some(Arc::new(v))),
            })
            .collect();
        Self { slots }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn specs(&self) -> impl Iterator<Item = &SecretSpec> {
        self.slots.iter().map(|s| &s.spec)
    }

    /// The secrets that may verify a delivery at `now`: loaded and not past
    /// their `not_after`.
    pub fn active(&self, now: SystemTime) -> Vec<ActiveSecret> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.spec.not_after.is_none_or(|t| now <= t))
            .filter_map(|(index, s)| {
                let value = s.value.read().unwrap_or_else(|p| p.into_inner()).clone()?;
                Some(ActiveSecret { index, value })
            })
            .collect()
    }

    /// Re-reads the file sources; returns how many changed. A file that
    /// disappears keeps its last value: a Kubernetes Secret update swaps a
    /// symlink, and the gap must not refuse deliveries.
    pub fn reload_files(&self) -> usize {
        self.reload(Missing::Keep)
    }

    /// `reload_files` for a credential that grants access (the admin
    /// token): a file that disappears or cannot be read revokes it.
    pub fn reload_files_failing_closed(&self) -> usize {
        self.reload(Missing::Forget)
    }

    fn reload(&self, missing: Missing) -> usize {
        let mut changed = 0;
        for slot in &self.slots {
            if !matches!(slot.spec.source, SecretSource::File(_)) {
                continue;
            }
            let fresh = slot.spec.source.read().ok().map(Arc::new);
            let mut current = slot.value.write().unwrap_or_else(|p| p.into_inner());
            if *current != fresh && (fresh.is_some() || missing == Missing::Forget) {
                *current = fresh;
                changed += 1;
            }
        }
        changed
    }
}

/// What a reload does with a file that cannot be read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    Keep,
    Forget,
}

/// How often file secrets are re-read.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_secrets_are_refused_without_echoing_them() {
        let err = SecretSource::parse("whsec_live_value").unwrap_err();
        assert!(!err.contains("whsec_live_value"));
        assert_eq!(
            SecretSource::parse("env:X"),
            Ok(SecretSource::Env("X".into()))
        );
    }

    #[test]
    fn debug_never_shows_the_value() {
        let v = SecretValue::new(b"topsecret".to_vec());
        assert!(!format!("{v:?}").contains("topsecret"));
    }

    #[test]
    fn not_after_retires_a_secret_and_files_reload() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, "one\n").unwrap();
        let past = SystemTime::now() - Duration::from_secs(10);
        let (set, problems) = SecretSet::load(vec![
            SecretSpec {
                source: SecretSource::File(path.clone()),
                not_after: None,
            },
            SecretSpec {
                source: SecretSource::File(path.clone()),
                not_after: Some(past),
            },
        ]);
        assert!(problems.is_empty());
        let active = set.active(SystemTime::now());
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].value.expose(), b"one");
        std::fs::write(&path, "two").unwrap();
        assert_eq!(set.reload_files(), 2);
        assert_eq!(set.active(SystemTime::now())[0].value.expose(), b"two");
    }
}
