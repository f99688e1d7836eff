//! Configuration: built-in defaults, then the TOML file, then
//! `HOOKGATE_<SECTION>__<KEY>` variables; validated up front, reporting every
//! error at once with the key it concerns. `hookgate check` and startup share
//! this code.

mod build;
pub mod file;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use figment::Figment;
use figment::error::{Actual, Kind};
use figment::providers::{Env, Format, Toml};
use figment::value::Value;
use serde::de::DeserializeOwned;

use self::file::{ProviderFile, QueueFile, ServerFile, StoreFile, TelemetryFile, UpstreamFile};
use crate::settings::Settings;

/// One problem with the configuration, tied to the key it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigIssue {
    pub key: String,
    pub message: String,
}

/// Every problem found, reported together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigIssue>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: {}", issue.key, issue.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Collects issues while building.
#[derive(Default)]
pub(crate) struct Issues(Vec<ConfigIssue>);

impl Issues {
    pub(crate) fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigIssue {
            key: key.into(),
            message: message.into(),
        });
    }
}

/// The configuration layers for a file on disk plus the environment.
/// A missing file is an error unless it is the default `config.toml`.
pub fn figment(path: &Path, explicit: bool) -> Result<Figment, ConfigErrors> {
    if explicit && !path.exists() {
        return Err(ConfigErrors(vec![ConfigIssue {
            key: "--config".into(),
            message: format!("file {} not found", path.display()),
        }]));
    }
    // Without a file, the environment alone may configure the gate.
    let mut figment = Figment::new();
    if explicit || path.exists() {
        figment = figment.merge(Toml::file_exact(path));
    }
    Ok(figment.merge(Env::prefixed("HOOKGATE_").split("__")))
}

/// The layers for a TOML string, for tests (no environment involved).
pub fn figment_from_str(toml: &str) -> Figment {
    Figment::new().merge(Toml::string(toml))
}

/// The parsed (still unvalidated) file: each section on its own, so one bad
/// section does not hide another's errors.
#[derive(Clone, Debug, Default)]
pub struct ConfigFile {
    pub server: ServerFile,
    pub upstream: UpstreamFile,
    pub store: StoreFile,
    pub telemetry: TelemetryFile,
    pub queue: QueueFile,
    pub providers: BTreeMap<String, ProviderFile>,
}

const SECTIONS: [&str; 6] = [
    "server",
    "upstream",
    "store",
    "telemetry",
    "queue",
    "providers",
];

/// Reads every section, collecting every error; a section that does not
/// read is replaced by its defaults so that validation can go on.
fn read(figment: &Figment, issues: &mut Issues) -> Option<ConfigFile> {
    let top: BTreeMap<String, Value> = match figment.extract() {
        Ok(top) => top,
        Err(e) => {
            push_figment(issues, "", e);
            return None;
        }
    };
    for key in top.keys().filter(|k| !SECTIONS.contains(&k.as_str())) {
        issues.push(key.clone(), "unknown section");
    }
    let mut file = ConfigFile {
        server: section(figment, &top, "server", issues),
        upstream: section(figment, &top, "upstream", issues),
        store: section(figment, &top, "store", issues),
        telemetry: section(figment, &top, "telemetry", issues),
        queue: section(figment, &top, "queue", issues),
        providers: BTreeMap::new(),
    };
    if let Some(providers) = top.get("providers") {
        match providers.as_dict() {
            Some(dict) => {
                for name in dict.keys() {
                    let path = format!("providers.{name}");
                    if let Some(p) = extract::<ProviderFile>(figment, &path, issues) {
                        file.providers.insert(name.clone(), p);
                    }
                }
            }
            None => issues.push("providers", "must be a table of providers"),
        }
    }
    Some(file)
}

fn section<T: DeserializeOwned + Default>(
    figment: &Figment,
    top: &BTreeMap<String, Value>,
    name: &str,
    issues: &mut Issues,
) -> T {
    if !top.contains_key(name) {
        return T::default();
    }
    extract(figment, name, issues).unwrap_or_default()
}

/// Deserializes the value at `path`, reporting a failure at the exact key
/// inside it (serde alone only names the section).
fn extract<T: DeserializeOwned>(figment: &Figment, path: &str, issues: &mut Issues) -> Option<T> {
    let value = match figment.find_value(path) {
        Ok(value) => value,
        Err(e) => {
            push_figment(issues, path, e);
            return None;
        }
    };
    serde_path_to_error::deserialize(&value)
        .map_err(|e| {
            let inner = e.path().to_string();
            let at = match inner.as_str() {
                "." | "" => path.to_owned(),
                inner => format!("{path}.{inner}"),
            };
            push_figment(issues, &at, e.into_inner());
        })
        .ok()
}

/// Turns figment's errors into issues. Figment's messages name the key and
/// what was expected; values are not echoed, so a pasted secret stays out.
fn push_figment(issues: &mut Issues, prefix: &str, error: figment::Error) {
    for e in error {
        let at = |leaf: &str| match prefix {
            "" => leaf.to_owned(),
            _ => format!("{prefix}.{leaf}"),
        };
        let message = match &e.kind {
            Kind::UnknownField(field, _) => {
                issues.push(at(field), "unknown key");
                continue;
            }
            Kind::MissingField(field) => {
                issues.push(at(field), "required");
                continue;
            }
            // The value may be a pasted secret (`secrets = "whsec_..."`):
            // say what type it was, never what it said.
            Kind::InvalidType(found, expected) => {
                format!("expected {expected}, found {}", type_of(found))
            }
            Kind::InvalidValue(found, expected) => {
                format!("invalid {}, expected {expected}", type_of(found))
            }
            // A TOML syntax error quotes the offending source line, which
            // may hold a secret: keep the position and the explanation.
            Kind::Message(text) => text
                .lines()
                .filter(|line| !line.contains('|'))
                .collect::<Vec<_>>()
                .join(" "),
            kind => kind.to_string(),
        };
        let at = if prefix.is_empty() {
            "(config file)"
        } else {
            prefix
        };
        issues.push(at, message);
    }
}

/// What kind of value figment found, without the value.
fn type_of(found: &Actual) -> &'static str {
    match found {
        Actual::Bool(_) => "a boolean",
        Actual::Unsigned(_) | Actual::Signed(_) => "an integer",
        Actual::Float(_) => "a float",
        Actual::Char(_) | Actual::Str(_) => "a string",
        Actual::Bytes(_) => "bytes",
        Actual::Seq => "a list",
        Actual::Map => "a table",
        _ => "another kind of value",
    }
}

/// Reads and validates: the one entry point for `run`, `check` and tests.
pub fn load(figment: &Figment) -> Result<Settings, ConfigErrors> {
    let mut issues = Issues::default();
    let file = read(figment, &mut issues).ok_or_else(|| ConfigErrors(issues.0.clone()))?;
    build::build(&file, issues)
}

#[cfg(test)]
mod tests;
