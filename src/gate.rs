//! The running gate's shared state: providers with their loaded secrets,
//! the route table, the store and the upstream client.

use std::sync::{Arc, Weak};

use tokio::sync::Notify;

use crate::StartError;
use crate::admin::Readiness;
use crate::metrics::Metrics;
use crate::pipeline::{BodyBudget, Inflight, Marks};
use crate::ratelimit::{ProviderLimit, SourceLimit};
use crate::route::{Route, RouteSpec, Routes};
use crate::secret::{RELOAD_INTERVAL, SecretSet};
use crate::settings::{Mode, ProviderSettings, Settings};
use crate::store::Store;
use crate::store::outbox::Outbox;
use crate::telemetry::trace::Traces;
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
    pub store: Arc<Store>,
    pub upstream: Upstream,
    pub metrics: Arc<Metrics>,
    /// The delivery traces' exporter, when traces are on.
    pub traces: Option<Traces>,
    pub source_limit: Option<SourceLimit>,
    /// The request bodies held at once (`server.max_body_bytes_in_flight`).
    pub bodies: BodyBudget,
    /// The listener's certificate, when it serves TLS.
    pub tls: Option<Arc<ReloadingCert>>,
    /// Claims held by deliveries still running, released if shutdown's
    /// grace runs out before they finish.
    pub inflight: Arc<Inflight>,
    /// Completion marks, with the retries of failed ones.
    pub marks: Marks,
    /// Wakes the relay when queue mode accepted jobs.
    pub relay_wakeup: Notify,
    /// The admin listener's bearer token for its queue endpoints.
    pub admin_token: Option<SecretSet>,
    /// `/readyz`'s store pings, one at a time.
    pub readiness: Readiness,
}

impl Gate {
    /// Opens the store and loads secrets. A secret that cannot be read yet
    /// does not stop the gate (a mounted file may appear later): it is
    /// logged, and a provider with no usable secret refuses every delivery.
    pub async fn build(settings: Settings) -> Result<Arc<Self>, StartError> {
        let metrics = Arc::new(Metrics::new(&settings.telemetry)?);
        let traces = settings
            .telemetry
            .traces
            .as_ref()
            .map(Traces::start)
            .transpose()?;
        let cores = crate::cores::serving(settings.server.max_connections);
        let upstream = Upstream::new(&settings.upstream, cores, Arc::clone(&metrics))?;
        let tls = match &settings.server.tls {
            Some(files) => Some(ReloadingCert::load(files.clone())?),
            None => None,
        };
        let store = Arc::new(
            Store::open(&settings.store)
                .await?
                .timed_by(Arc::clone(&metrics)),
        );
        if settings.providers.iter().any(|p| p.mode == Mode::Queue) {
            // Queue mode answers 202 once the accept is on disk.
            store.require_durable_commits().await?;
        }
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
        let routes = Routes::new(
            settings.upstream.url.path(),
            providers.iter().map(|p| RouteSpec {
                path: &p.settings.path,
                upstream_path: p.settings.upstream_path.as_deref(),
                case_sensitive: p.settings.case_sensitive_path,
            }),
        );
        let admin_token = settings.server.admin_token.clone().map(|spec| {
            let (token, problems) = SecretSet::load(vec![spec]);
            for problem in problems {
                tracing::error!(%problem, "server.admin_token not loaded: the admin queue endpoints are refused");
            }
            token
        });
        let marks = Marks::new(
            Arc::clone(&store),
            Arc::clone(&metrics),
            settings.dedupe.lease,
            settings.dedupe.max_response_bytes,
        );
        let gate = Arc::new(Self {
            source_limit: settings.server.per_source_rate_limit.map(SourceLimit::new),
            bodies: BodyBudget::new(settings.server.max_body_bytes_in_flight),
            upstream,
            tls,
            settings,
            providers,
            routes,
            store,
            metrics,
            traces,
            inflight: Arc::default(),
            marks,
            relay_wakeup: Notify::new(),
            admin_token,
            readiness: Readiness::default(),
        });
        spawn_housekeeping(Arc::downgrade(&gate));
        Ok(gate)
    }

    /// Releases every claim still held, so the senders' retries get through
    /// at once instead of waiting out the lease. Returns how many.
    pub async fn release_inflight(&self) -> usize {
        self.inflight.release_all(&self.store).await
    }

    /// Where a request path goes: a provider's delivery whatever its
    /// spelling, refused when ambiguous, else not a delivery.
    pub fn route(&self, path: &str) -> Route {
        self.routes.route(path)
    }
}

/// Re-reads file secrets and prunes idle rate-limit buckets until the gate
/// is dropped.
fn spawn_housekeeping(weak: Weak<Gate>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        // A reload that took longer than the interval is not repeated at once.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            {
                let Some(gate) = weak.upgrade() else { return };
                if let Some(limit) = &gate.source_limit {
                    limit.prune();
                }
                if let Some(health) = gate.store.partition_health() {
                    gate.metrics.partition_health(&health);
                }
            }
            // Reloading stats and reads files: blocking calls, long on a slow
            // or stalled mount. They run on the blocking pool, one reload at a
            // time, so that no runtime worker (and no delivery) waits on them.
            let files = Weak::clone(&weak);
            let reload = tokio::task::spawn_blocking(move || {
                let Some(gate) = files.upgrade() else { return };
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
                // A rotated admin token revokes the old one without a
                // restart; a removed one revokes it too.
                if let Some(token) = &gate.admin_token
                    && token.reload_files_failing_closed() > 0
                {
                    if token.active(std::time::SystemTime::now()).is_empty() {
                        tracing::warn!(
                            "server.admin_token file cannot be read; the admin queue endpoints are refused until it can"
                        );
                    } else {
                        tracing::info!("server.admin_token file changed; reloaded");
                    }
                }
            });
            if let Err(e) = reload.await
                && e.is_panic()
            {
                tracing::error!("reloading secret and certificate files panicked");
            }
        }
    });
}
