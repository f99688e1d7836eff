//! The running gate's shared state: providers with their loaded secrets,
//! the route table, the store and the upstream client.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use crate::secret::{RELOAD_INTERVAL, SecretSet};
use crate::settings::{ProviderSettings, Settings};
use crate::store::{Store, StoreError};
use crate::upstream::Upstream;

/// A configured provider and its secrets.
pub struct Provider {
    pub settings: ProviderSettings,
    pub secrets: SecretSet,
}

pub struct Gate {
    pub settings: Settings,
    pub providers: Vec<Provider>,
    routes: HashMap<String, usize>,
    pub store: Store,
    pub upstream: Upstream,
}

impl Gate {
    /// Opens the store and loads secrets. A secret that cannot be read yet
    /// does not stop the gate (a mounted file may appear later): it is
    /// logged, and a provider with no usable secret refuses every delivery.
    pub async fn build(settings: Settings) -> Result<Arc<Self>, StoreError> {
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
                }
            })
            .collect();
        let routes = providers
            .iter()
            .enumerate()
            .map(|(i, p)| (p.settings.path.clone(), i))
            .collect();
        let gate = Arc::new(Self {
            upstream: Upstream::new(&settings.upstream),
            settings,
            providers,
            routes,
            store,
        });
        spawn_secret_reloader(Arc::downgrade(&gate));
        Ok(gate)
    }

    /// The provider whose `path` is exactly `path`.
    pub fn route(&self, path: &str) -> Option<usize> {
        self.routes.get(path).copied()
    }
}

/// Re-reads file secrets until the gate is dropped.
fn spawn_secret_reloader(gate: Weak<Gate>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        loop {
            tick.tick().await;
            let Some(gate) = gate.upgrade() else { return };
            for p in &gate.providers {
                if p.secrets.reload_files() > 0 {
                    tracing::info!(provider = %p.settings.name, "secret files changed; reloaded");
                }
            }
        }
    });
}
