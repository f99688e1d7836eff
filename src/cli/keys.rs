//! `hookgate keys get|forget`: an operator's look at one dedupe key.

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Subcommand;

use crate::config::text::duration;
use crate::settings::Settings;
use crate::store::{Backend, Existing, KeyRecord, ScopedKey, Store, StoreError};

#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Show a key's state: in flight (and when its lease ends) or completed
    /// (the stored answer, and how long it is remembered). Exit 1 when the
    /// store does not know the key.
    Get {
        /// The provider's name in the configuration ([providers.<NAME>]).
        #[arg(long, value_name = "NAME")]
        provider: String,
        /// The event's id as the provider sends it (`evt_1`, a delivery
        /// GUID), or as the gate scopes it (`stripe:evt_1`); compared
        /// trimmed and lower-cased.
        key: String,
    },
    /// Forget a key so that the provider's next redelivery is processed
    /// again. Exit 1 when there was nothing to forget.
    Forget {
        /// The provider's name in the configuration ([providers.<NAME>]).
        #[arg(long, value_name = "NAME")]
        provider: String,
        /// The event's id as the provider sends it, or scoped
        /// (`stripe:evt_1`); compared trimmed and lower-cased.
        key: String,
    },
}

/// Runs `hookgate keys`: exit 0 done, 1 an unknown key or a store error,
/// 64 an unknown provider.
pub async fn keys(settings: &Settings, action: &KeysAction) -> ExitCode {
    let (KeysAction::Get { provider, key } | KeysAction::Forget { provider, key }) = action;
    let p = match super::provider(settings, provider) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let store = match super::open_store(settings).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let candidates = candidates(provider, key);
    let result = match action {
        KeysAction::Get { .. } => get(&store, &candidates).await.map(|found| match found {
            Some((scoped, record)) => {
                show(&scoped, &record, p.retention);
                true
            }
            None => {
                println!(
                    "{}: unknown (never seen, or past its retention)",
                    candidates[0]
                );
                false
            }
        }),
        KeysAction::Forget { .. } => forget(&store, &candidates).await.map(|found| match found {
            Some(scoped) => {
                println!("{scoped}: forgotten; the next redelivery will be processed");
                true
            }
            None => {
                println!("{}: unknown; nothing to forget", candidates[0]);
                false
            }
        }),
    };
    super::store_exit(result)
}

/// The scoped keys `key` may mean, most likely first: normalized as the
/// gate does, and, when the operator pasted it already scoped
/// (`stripe:evt_1`, from a log line or `Hookgate-Event-Key`), without
/// the scope, so that it is not scoped twice.
fn candidates(provider: &str, key: &str) -> Vec<ScopedKey> {
    let key = key.trim().to_lowercase();
    let mut out = Vec::new();
    if let Some(bare) = key.strip_prefix(&format!("{provider}:"))
        && !bare.is_empty()
    {
        out.push(ScopedKey::new(provider, bare));
    }
    out.push(ScopedKey::new(provider, key));
    out
}

async fn get(
    store: &Store,
    candidates: &[ScopedKey],
) -> Result<Option<(ScopedKey, KeyRecord)>, StoreError> {
    for scoped in candidates {
        if let Some(record) = store.get(scoped).await? {
            return Ok(Some((scoped.clone(), record)));
        }
    }
    Ok(None)
}

async fn forget(store: &Store, candidates: &[ScopedKey]) -> Result<Option<ScopedKey>, StoreError> {
    for scoped in candidates {
        if store.forget(scoped).await? {
            return Ok(Some(scoped.clone()));
        }
    }
    Ok(None)
}

/// The record, with the times the store gives: a lease's end, or when a
/// completed key is forgotten (its retention left), as a date and a span.
fn show(scoped: &ScopedKey, record: &KeyRecord, retention: Duration) {
    match &record.state {
        Existing::InFlight { retry_after } => {
            println!("{scoped}: in flight");
            println!(
                "  lease ends: {} (in {})",
                humantime::format_rfc3339_seconds(SystemTime::now() + *retry_after),
                duration(Duration::from_secs(retry_after.as_secs()))
            );
            println!("  fingerprint: {}", record.fingerprint);
        }
        Existing::Completed(s) => {
            println!(
                "{scoped}: completed (status {}, {} bytes stored{})",
                s.status,
                s.body.len(),
                if s.truncated { ", truncated" } else { "" }
            );
            if let Some(content_type) = &s.content_type {
                println!("  content type: {content_type}");
            }
            println!("  fingerprint: {}", record.fingerprint);
            match record.expires_in {
                Some(left) => println!(
                    "  expires: {} (in {}; retention {})",
                    humantime::format_rfc3339_seconds(SystemTime::now() + left),
                    duration(Duration::from_secs(left.as_secs())),
                    duration(retention)
                ),
                None => println!(
                    "  expires: {} after it was processed (the provider's retention)",
                    duration(retention)
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scoped_key_is_not_scoped_twice() {
        let shown = |k: &str| {
            candidates("stripe", k)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(shown(" EVT_1 "), ["stripe:evt_1"]);
        assert_eq!(
            shown("stripe:evt_1"),
            ["stripe:evt_1", "stripe:stripe:evt_1"]
        );
        assert_eq!(shown("github:x"), ["stripe:github:x"]);
        assert_eq!(shown("stripe:"), ["stripe:stripe:"]);
    }
}
