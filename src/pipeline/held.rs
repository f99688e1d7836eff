//! The claims a running delivery holds, as a guard that cannot be
//! forgotten: the finish phase hands them to the mark or releases them, and
//! a delivery that ends any other way (a panic, a cancelled task) releases
//! them when the guard drops, so the sender's retry is not held off for a
//! whole lease.

use std::sync::Arc;

use super::finish::{self, Held};
use crate::gate::Gate;

/// Claims held by one delivery, tracked for shutdown while held.
pub struct HeldClaims {
    gate: Arc<Gate>,
    claims: Vec<Held>,
}

impl HeldClaims {
    pub fn new(gate: &Arc<Gate>, claims: Vec<Held>) -> Self {
        gate.track(&claims);
        Self {
            gate: Arc::clone(gate),
            claims,
        }
    }

    pub fn claims(&self) -> &[Held] {
        &self.claims
    }

    /// The claims were marked or released: nothing is left to do on drop.
    pub fn settled(mut self) {
        let tokens: Vec<_> = self.claims.drain(..).map(|(_, token)| token).collect();
        self.gate.untrack(&tokens);
    }
}

impl Drop for HeldClaims {
    fn drop(&mut self) {
        if self.claims.is_empty() {
            return;
        }
        let claims = std::mem::take(&mut self.claims);
        let tokens: Vec<_> = claims.iter().map(|(_, token)| token.clone()).collect();
        self.gate.untrack(&tokens);
        tracing::warn!(
            claims = claims.len(),
            "a delivery ended without finishing; releasing its claims"
        );
        // Outside a runtime (the process is ending) the leases expire alone.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let gate = Arc::clone(&self.gate);
            runtime.spawn(async move { finish::release(&gate, &claims).await });
        }
    }
}
