//! The memory that request bodies may take at once, over every connection:
//! `server.max_body_bytes_in_flight`.
//!
//! `server.max_body_bytes` bounds one body, and `server.max_connections`
//! (with 32 streams on an HTTP/2 connection) how many are read at once; by
//! their defaults that is gigabytes, which a flood of large bodies could
//! make the gate hold before a signature is checked. What a request holds
//! is counted as its bytes come, by the buffer they are copied into (the
//! head's values and path with them: `read`), and until the last reference
//! to that buffer is dropped (`read::unshare`). A declared length is not
//! reserved: a sender need not send what it declares. One that would take
//! the total past the budget is refused at once (503 `overloaded`) rather
//! than queued, since a queue would hold the same memory.
//!
//! A counter, not tokio's semaphore: nothing ever waits for room, and the
//! semaphore takes its waiters' lock on every release, one more lock that
//! every core would take for every delivery.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::GateError;

/// The budget shared by every core's deliveries.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    used: Arc<AtomicU64>,
    max: u64,
}

/// A request's share of the budget, given back when dropped.
#[derive(Debug, Default)]
pub struct Share {
    taken: Option<(Arc<AtomicU64>, u64)>,
}

impl BodyBudget {
    pub fn new(max: u64) -> Self {
        Self {
            used: Arc::new(AtomicU64::new(0)),
            max,
        }
    }

    /// Grows `share` to `bytes`, or refuses (and leaves `share` as it was).
    pub fn hold(&self, share: &mut Share, bytes: u64) -> Result<(), GateError> {
        let has = share.taken.as_ref().map_or(0, |(_, n)| *n);
        let Some(more) = bytes.checked_sub(has).filter(|&more| more > 0) else {
            return Ok(());
        };
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(more).filter(|&total| total <= self.max)
            })
            .map_err(|_| GateError::Overloaded)?;
        match &mut share.taken {
            Some((_, n)) => *n = bytes,
            None => share.taken = Some((Arc::clone(&self.used), bytes)),
        }
        Ok(())
    }

    /// Bytes free, for tests.
    #[cfg(test)]
    fn free(&self) -> u64 {
        self.max - self.used.load(Ordering::Acquire)
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some((used, n)) = self.taken.take() {
            used.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_hold_until_dropped_and_what_does_not_fit_is_refused() {
        let budget = BodyBudget::new(64 * 1024);
        let mut first = Share::default();
        budget.hold(&mut first, 40 * 1024).unwrap();
        assert_eq!(budget.free(), 24 * 1024);
        // Growing counts only the difference; a smaller size takes nothing.
        budget.hold(&mut first, 41 * 1024).unwrap();
        budget.hold(&mut first, 10).unwrap();
        assert_eq!(budget.free(), 23 * 1024);

        let mut second = Share::default();
        assert!(matches!(
            budget.hold(&mut second, 23 * 1024 + 1),
            Err(GateError::Overloaded)
        ));
        assert_eq!(budget.free(), 23 * 1024, "a refused share takes nothing");
        budget.hold(&mut second, 23 * 1024).unwrap();
        assert_eq!(budget.free(), 0, "the budget's last byte is usable");

        drop(first);
        assert_eq!(budget.free(), 41 * 1024);
        drop(second);
        assert_eq!(budget.free(), 64 * 1024);
    }

    #[test]
    fn sizes_past_the_counter_are_refused_not_wrapped() {
        let budget = BodyBudget::new(u64::MAX);
        let mut share = Share::default();
        budget.hold(&mut share, u64::MAX - 1).unwrap();
        let mut other = Share::default();
        assert!(budget.hold(&mut other, 2).is_err());
        budget.hold(&mut other, 1).unwrap();
    }
}
