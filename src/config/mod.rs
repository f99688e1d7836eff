//! Configuration: built-in defaults, then the TOML file, then
//! `HOOKGATE_<SECTION>__<KEY>` variables; validated up front, reporting every
//! error at once with the key it concerns. `hookgate check` and startup share
//! this code.

mod build;
pub mod file;
pub mod text;

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
        let message = match text::nearest(key, &SECTIONS) {
            Some(near) => format!("unknown section; did you mean `{near}`?"),
            None => format!("unknown section (sections: {})", SECTIONS.join(", ")),
        };
        issues.push(key.clone(), message);
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

/// Deserializes the table at `path`, reporting each failure at the exact
/// key inside it (serde alone only names the section). serde stops at the
/// first error, so the failing key is reported, taken out, and the rest
/// read again: every bad key of a table is reported at once.
fn extract<T: DeserializeOwned>(figment: &Figment, path: &str, issues: &mut Issues) -> Option<T> {
    let mut value = match figment.find_value(path) {
        Ok(value) => value,
        Err(e) => {
            push_figment(issues, path, e);
            return None;
        }
    };
    loop {
        let error = match serde_path_to_error::deserialize(&value) {
            Ok(t) => return Some(t),
            Err(e) => e,
        };
        let inner = error.path().to_string();
        let at = match inner.as_str() {
            "." | "" => path.to_owned(),
            inner => format!("{path}.{inner}"),
        };
        push_figment(issues, &at, error.into_inner());
        // The key of this table that holds the error (`rate_limit` for
        // `rate_limit.per_second`, `secrets` for `secrets[1]`).
        let first = inner.split(['.', '[']).next().unwrap_or_default();
        let removed = match &mut value {
            Value::Dict(_, dict) if !first.is_empty() => dict.remove(first).is_some(),
            _ => false,
        };
        if !removed {
            return None;
        }
    }
}

/// Keys whose values are durations, for the hint on a bare number.
const DURATION_KEYS: [&str; 12] = [
    "read_timeout",
    "shutdown_grace",
    "timeout",
    "retention",
    "lease",
    "tolerance",
    "future_tolerance",
    "otlp_interval",
    "otlp_timeout",
    "max_age",
    "retry_initial",
    "retry_max",
];

/// Turns figment's errors into issues. Figment's messages name the key and
/// what was expected; values are not echoed, so a pasted secret stays out.
fn push_figment(issues: &mut Issues, prefix: &str, error: figment::Error) {
    // serde_path_to_error's path already ends with a field it complains
    // about; figment's kinds name it again.
    let at = |field: &str| match prefix {
        "" => field.to_owned(),
        p if p == field || p.ends_with(&format!(".{field}")) => p.to_owned(),
        p => format!("{p}.{field}"),
    };
    let leaf = prefix.rsplit('.').next().unwrap_or_default();
    for e in error {
        let message = match &e.kind {
            Kind::UnknownField(field, known) => {
                let message = match text::nearest(field, known) {
                    Some(near) => format!("unknown key; did you mean `{near}`?"),
                    None if known.is_empty() => "unknown key".to_owned(),
                    None => format!("unknown key (known here: {})", known.join(", ")),
                };
                issues.push(at(field), message);
                continue;
            }
            Kind::MissingField(field) => {
                issues.push(at(field), "required");
                continue;
            }
            // A bare number where a duration string belongs: the number
            // is not a secret, and the fix is to add the unit.
            Kind::InvalidType(Actual::Unsigned(n), _) if DURATION_KEYS.contains(&leaf) => {
                duration_hint(n)
            }
            Kind::InvalidType(Actual::Signed(n), _) if DURATION_KEYS.contains(&leaf) => {
                duration_hint(n)
            }
            // The value may be a pasted secret (`secrets = "whsec_..."`):
            // say what type it was, never what it said.
            Kind::InvalidType(found, expected) => {
                format!("expected {expected}, found {}", type_of(found))
            }
            Kind::InvalidValue(found, expected) => {
                format!("invalid {}, expected {expected}", type_of(found))
            }
            Kind::UnknownVariant(found, known) => {
                let one_of = known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ");
                match text::nearest(found, known) {
                    Some(near) => {
                        format!("unknown value; did you mean `{near}`? (one of {one_of})")
                    }
                    None => format!("unknown value; expected one of {one_of}"),
                }
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

fn duration_hint(n: impl fmt::Display) -> String {
    format!("a duration is a string with a unit: write \"{n}s\"")
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

/// Names the environment variable that set an issue's key, when one did:
/// `HOOKGATE_STORE__BACKEN` is easy to miss when reading the file.
fn origin(figment: &Figment, issue: &mut ConfigIssue) {
    let key = issue.key.split('[').next().unwrap_or_default();
    if key.is_empty() || key.starts_with('(') || key.starts_with('-') {
        return;
    }
    let from_env = figment
        .find_metadata(key)
        .is_some_and(|m| m.source.is_none() && m.name.contains("environment variable"));
    if from_env {
        let var = format!("HOOKGATE_{}", key.replace('.', "__").to_ascii_uppercase());
        issue.message = format!("{} (set by {var})", issue.message);
    }
}

/// Reads and validates: the one entry point for `run`, `check` and tests.
pub fn load(figment: &Figment) -> Result<Settings, ConfigErrors> {
    let mut read_issues = Issues::default();
    let file = read(figment, &mut read_issues);
    let built = match &file {
        Some(file) => build::build(file, Issues::default()),
        None => Err(ConfigErrors(Vec::new())),
    };
    let mut all = read_issues.0;
    match built {
        Ok(settings) if all.is_empty() => return Ok(settings),
        Ok(_) => {}
        // A key that did not read was taken out: what `build` then says
        // about it (`required`, `at least one`) would only repeat it.
        Err(ConfigErrors(more)) => {
            let reported: Vec<String> = all.iter().map(|i| i.key.clone()).collect();
            all.extend(
                more.into_iter()
                    .filter(|i| !reported.iter().any(|r| overlaps(r, &i.key))),
            );
        }
    }
    for issue in &mut all {
        origin(figment, issue);
    }
    Err(ConfigErrors(all))
}

/// Whether one key is the other or lies inside it.
fn overlaps(a: &str, b: &str) -> bool {
    let inside = |outer: &str, inner: &str| {
        inner == outer
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    };
    inside(a, b) || inside(b, a)
}

#[cfg(test)]
mod tests;
