//! The `[store]` section: the backend, and the dedupe parameters
//! (retention, lease) that providers may override.

use std::path::PathBuf;
use std::time::Duration;

use super::{Issues, duration, size};
use crate::config::file::{BackendKind, StoreFile};
use crate::settings::DedupeSettings;
use crate::store::{BackendSettings, StoreSettings};

/// The store, and the dedupe settings; `upstream_timeout` bounds the lease
/// from below.
pub(super) fn store(
    i: &mut Issues,
    st: &StoreFile,
    upstream_timeout: Duration,
) -> (StoreSettings, DedupeSettings) {
    let backend = match st.backend {
        BackendKind::Sqlite => BackendSettings::Sqlite {
            path: PathBuf::from(&st.path),
        },
        BackendKind::Memory => BackendSettings::Memory {
            capacity: st.memory_capacity.max(1),
        },
        BackendKind::Postgres => match st.url.as_deref() {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                BackendSettings::Postgres {
                    url: url.to_owned(),
                    // Raised to the longest provider retention below.
                    retention: Duration::ZERO,
                }
            }
            Some(_) => {
                i.push(
                    "store.url",
                    "a postgres URL starts with postgres:// or postgresql://",
                );
                BackendSettings::Memory { capacity: 1 }
            }
            None => {
                i.push("store.url", "required when store.backend = \"postgres\"");
                BackendSettings::Memory { capacity: 1 }
            }
        },
        BackendKind::Redis => match st.url.as_deref() {
            Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                BackendSettings::Redis {
                    url: url.to_owned(),
                    prefix: st.prefix.clone(),
                    // Filled from the providers (see `build`).
                    queue: Vec::new(),
                    cluster: st.cluster,
                }
            }
            Some(_) => {
                i.push("store.url", "a redis URL starts with redis:// or rediss://");
                BackendSettings::Memory { capacity: 1 }
            }
            None => {
                i.push("store.url", "required when store.backend = \"redis\"");
                BackendSettings::Memory { capacity: 1 }
            }
        },
    };
    let store = StoreSettings {
        backend,
        op_timeout: duration(i, "store.timeout", &st.timeout),
    };
    let dedupe = DedupeSettings {
        retention: duration(i, "store.retention", &st.retention),
        lease: duration(i, "store.lease", &st.lease),
        max_response_bytes: usize::try_from(size(
            i,
            "store.max_response_bytes",
            &st.max_response_bytes,
        ))
        .unwrap_or(usize::MAX),
    };
    if dedupe.lease <= upstream_timeout {
        i.push(
            "store.lease",
            format!(
                "must exceed upstream_timeout ({}), so that a live forward never loses its claim",
                humantime::format_duration(upstream_timeout)
            ),
        );
    }
    (store, dedupe)
}
