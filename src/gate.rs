//! The running gate's shared state: providers with their loaded secrets,
//! the route table, the store and the upstream client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use tokio_util::task::TaskTracker;

use std::future::Future;
use std::time::Instant;

use crate::StartError;
use crate::metrics::Metrics;
use crate::ratelimit::{ProviderLimit, SourceLimit};
use crate::route::{Route, RouteSpec, Routes};
use crate::secret::{RELOAD_INTERVAL, SecretSet};
use crate::settings::{ProviderSettings, Settings};
use crate::store::{Backend, LeaseToken, ScopedKey, Store};
use crate::tls::ReloadingCert;
use crate::upstream::Upstream;

/// A configured provider and its secrets.
pub struct Provider {
    pub settings: ProviderSettings,
    pub secrets: SecretSet,
    pub limit: Option<ProviderLimit>,
}

pub struct Gate {
    pub settings: Settings,
    pub providers: Vec<Provider>,
    routes: Routes,
    pub store: Store,
    pub upstream: Upstream,
    pub metrics: Metrics,
    pub source_limit: Option<SourceLimit>,
    /// The listener's certificate, when it serves TLS.
    pub tls: Option<Arc<ReloadingCert>>,
    /// Claims held by deliveries still running, released if shutdown's
    /// grace runs out before they finish.
    inflight: Mutex<HashMap<LeaseToken, ScopedKey>>,
    /// Marks being retried after the delivery was answered: shutdown waits
    /// for them within its grace, since a mark given up is a delivery the
    /// next redelivery would process again.
    pub pending_marks: TaskTracker,
}

impl Gate {
    /// Opens the store and loads secrets. A secret that cannot be read yet
    /// does not stop the gate (a mounted file may appear later): it is
    /// logged, and a provider with no usable secret refuses every delivery.
    pub async fn build(settings: Settings) -> Result<Arc<Self>, StartError> {
        let upstream = Upstream::new(&settings.upstream)?;
        let tls = match &settings.server.tls {
            Some(files) => Some(ReloadingCert::load(files.clone())?),
            None => None,
        };
        let metrics = Metrics::new(&settings.telemetry)?;
        let store = Store::open(&settings.store).await?;
        if store.backend_name() == "memory" {
            tracing::warn!("store.backend = \"memory\": a restart forgets every key");
        }
        let providers: Vec<Provider> = settings
            .providers
            .iter()
            .map(|p| {
                let (secrets, problems) = SecretSet::load(p.secrets.clone());
                for problem in problems {
                    tracing::error!(provider = %p.name, %problem, "secret not loaded");
                }
                Provider {
                    settings: p.clone(),
                    secrets,
                    limit: p.rate_limit.map(ProviderLimit::new),
                }
            })
            .collect();
        let settings_source_limit = settings.server.per_source_rate_limit.map(SourceLimit::new);
        let routes = Routes::new(providers.iter().map(|p| RouteSpec {
            path: &p.settings.path,
            case_sensitive: p.settings.case_sensitive_path,
        }));
        let gate = Arc::new(Self {
            upstream,
            tls,
            settings,
            providers,
            routes,
            store,
            metrics,
            source_limit: settings_source_limit,
            inflight: Mutex::default(),
            pending_marks: TaskTracker::new(),
        });
        spawn_housekeeping(Arc::downgrade(&gate));
        Ok(gate)
    }

    /// Runs a store operation, recording its duration. The operation is
    /// made here, not passed in made: an `async fn` keeps a future it is
    /// given and the one it awaits as two copies, and a store future is the
    /// largest part of every delivery's state (docs/BENCHMARKS.md, Memory).
    pub async fn timed<F, Fut>(&self, operation: &'static str, op: F) -> Fut::Output
    where
        F: FnOnce() -> Fut,
        Fut: Future,
    {
        let started = Instant::now();
        let result = op().await;
        self.metrics
            .store(self.store.backend_name(), operation, started.elapsed());
        result
    }

    /// Notes the claims held by a running delivery.
    pub fn track(&self, held: &[(ScopedKey, LeaseToken)]) {
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        for (key, token) in held {
            inflight.insert(token.clone(), key.clone());
        }
    }

    /// Forgets the claims of a delivery that has finished.
    pub fn untrack(&self, tokens: &[LeaseToken]) {
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        for token in tokens {
            inflight.remove(token);
        }
    }

    /// Releases every claim still held, so the senders' retries get through
    /// at once instead of waiting out the lease. Returns how many.
    pub async fn release_inflight(&self) -> usize {
        let held: Vec<_> = self
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        let mut released = 0;
        for (token, key) in held {
            match self.store.release(&key, &token).await {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(key = %key, error = %e, "release at shutdown failed"),
            }
        }
        released
    }

    /// Where a request path goes: a provider's delivery whatever its
    /// spelling, refused when ambiguous, else not a delivery.
    pub fn route(&self, path: &str) -> Route {
        self.routes.route(path)
    }
}

/// Re-reads file secrets and prunes idle rate-limit buckets until the gate
/// is dropped.
fn spawn_housekeeping(gate: Weak<Gate>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        loop {
            tick.tick().await;
            let Some(gate) = gate.upgrade() else { return };
            if let Some(limit) = &gate.source_limit {
                limit.prune();
            }
            if let Some(health) = gate.store.partition_health() {
                gate.metrics.partition_health(&health);
            }
            if let Some(cert) = &gate.tls {
                match cert.reload_if_changed() {
                    Ok(true) => tracing::info!("TLS certificate files changed; reloaded"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "TLS certificate not reloaded; the old one keeps serving")
                    }
                }
            }
            for p in &gate.providers {
                if p.secrets.reload_files() > 0 {
                    tracing::info!(provider = %p.settings.name, "secret files changed; reloaded");
                }
            }
        }
    });
}
