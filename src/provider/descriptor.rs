//! What one scheme is, stated once in its own file: its name, the headers
//! that carry its signature, where its events' ids are, how long its sender
//! retries and what to do with a delivery that has no id. The rest of the
//! gate (config, `check`, the pipeline) reads these instead of restating
//! them.

use std::time::Duration;

use crate::settings::OnMissingKey;

pub const HOUR: Duration = Duration::from_secs(3600);

/// A scheme's fixed facts.
#[derive(Debug)]
pub struct Descriptor {
    /// The `scheme` value in the config.
    pub name: &'static str,
    /// Headers carrying the signature (and the signed timestamp), lower
    /// case: removed when the gate forwards a body other than the signed
    /// one (a partial batch), since they no longer match it.
    pub signature_headers: &'static [&'static str],
    /// The idempotency key when the provider sets none.
    pub key: Option<DefaultKey>,
    /// How long the sender keeps retrying: `check` warns when a retention
    /// is shorter.
    pub retry_window: Option<Duration>,
    /// The default `on_missing_key`.
    pub on_missing_key: OnMissingKey,
}

/// A scheme's default key source (SPEC section 3).
#[derive(Debug)]
pub struct DefaultKey {
    /// A key source as the config writes it (`json:/id`, `header:...`).
    pub source: &'static str,
    /// Headers read, in order, when a header source is absent.
    pub aliases: &'static [&'static str],
    /// A header whose value, when present, prefixes the key.
    pub scope: Option<&'static str>,
}

impl DefaultKey {
    /// A source with no aliases and no scope.
    pub const fn plain(source: &'static str) -> Self {
        Self {
            source,
            aliases: &[],
            scope: None,
        }
    }
}
