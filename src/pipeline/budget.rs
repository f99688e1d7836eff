//! The memory that request bodies may take at once, over every connection:
//! `server.max_body_bytes_in_flight`.
//!
//! `server.max_body_bytes` bounds one body, and `server.max_connections`
//! (with 32 streams on an HTTP/2 connection) how many are read at once; by
//! their defaults that is gigabytes, which a flood of large bodies could
//! make the gate hold before a signature is checked. A body is counted as
//! its bytes come (a declared length is not reserved: a sender need not
//! send what it declares), and until the last reference to its bytes is
//! dropped (`read::unshare`). One that would take the total past the budget
//! is refused at once (503 `overloaded`) rather than queued, since a queue
//! would hold the same memory.
//!
//! tokio's semaphore does the counting, in KiB: a body's permits are taken
//! without waiting (`try_acquire_many_owned`) and given back when its
//! `Share` is dropped.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::GateError;

/// The budget shared by every core's deliveries.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    kib: Arc<Semaphore>,
}

/// A body's share of the budget, given back when dropped.
#[derive(Debug, Default)]
pub struct Share {
    permits: Option<OwnedSemaphorePermit>,
}

impl BodyBudget {
    pub fn new(bytes: u64) -> Self {
        let kib = usize::try_from(bytes.div_ceil(1024))
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self {
            kib: Arc::new(Semaphore::new(kib)),
        }
    }

    /// Grows `share` to cover a body of `bytes`, or refuses it (and leaves
    /// `share` as it was).
    pub fn hold(&self, share: &mut Share, bytes: u64) -> Result<(), GateError> {
        let want = bytes.div_ceil(1024);
        let has = share.permits.as_ref().map_or(0, |p| p.num_permits() as u64);
        if want <= has {
            return Ok(());
        }
        let more = u32::try_from(want - has).map_err(|_| GateError::Overloaded)?;
        let taken = Arc::clone(&self.kib)
            .try_acquire_many_owned(more)
            .map_err(|_| GateError::Overloaded)?;
        match &mut share.permits {
            Some(permits) => permits.merge(taken),
            None => share.permits = Some(taken),
        }
        Ok(())
    }

    /// KiB free, for tests.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.kib.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_hold_their_share_until_dropped_and_the_rest_is_refused() {
        let budget = BodyBudget::new(64 * 1024);
        let mut first = Share::default();
        budget.hold(&mut first, 40 * 1024).unwrap();
        assert_eq!(budget.free(), 24);
        // Growing counts only the difference; a smaller size takes nothing.
        budget.hold(&mut first, 41 * 1024 - 1).unwrap();
        budget.hold(&mut first, 10).unwrap();
        assert_eq!(budget.free(), 23);

        let mut second = Share::default();
        assert!(matches!(
            budget.hold(&mut second, 24 * 1024),
            Err(GateError::Overloaded)
        ));
        assert_eq!(budget.free(), 23, "a refused body takes nothing");
        budget.hold(&mut second, 1).unwrap();
        assert_eq!(budget.free(), 22, "a byte takes a KiB");

        drop(first);
        assert_eq!(budget.free(), 63);
        drop(second);
        assert_eq!(budget.free(), 64);
    }

    #[test]
    fn a_budget_past_the_semaphores_range_is_its_largest() {
        let budget = BodyBudget::new(u64::MAX);
        let mut share = Share::default();
        assert!(budget.hold(&mut share, u64::MAX).is_err());
        budget.hold(&mut share, 1 << 30).unwrap();
    }
}
