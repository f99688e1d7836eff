//! The outbox's shards: which one an event falls in, the names of a
//! shard's keys (all under its hash tag), and how a take shares its limit.

use crate::store::ScopedKey;

/// How many shards the outbox has; part of the data's layout.
pub(super) const SHARDS: u32 = 16;

/// One of the outbox's shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(in crate::store::redis) struct Shard(pub(super) u32);

impl Shard {
    /// The shard of an event: FNV-1a (32 bits) of `provider:key`.
    pub(in crate::store::redis) fn of(key: &ScopedKey) -> Self {
        let bytes = key.provider.bytes().chain([b':']).chain(key.key.bytes());
        let hash = bytes.fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        Self(hash % SHARDS)
    }

    pub(super) fn of_job(id: i64) -> Option<Self> {
        (id >= 0).then(|| Self((id % i64::from(SHARDS)) as u32))
    }

    pub(super) fn all() -> impl Iterator<Item = Self> {
        (0..SHARDS).map(Self)
    }

    /// `{prefix}:{qNN}:`, the braces literal: the shard's hash tag.
    pub(in crate::store::redis) fn prefix(self, prefix: &str) -> String {
        format!("{prefix}:{{q{:02}}}:", self.0)
    }

    pub(super) fn key(self, prefix: &str, name: &str) -> String {
        format!("{}#{name}", self.prefix(prefix))
    }

    pub(super) fn job_prefix(self, prefix: &str) -> String {
        self.key(prefix, "job:")
    }
}

/// Shares `limit` among the shards with due jobs, one at a time in turn
/// from `start`, never more to a shard than it has due.
pub(super) fn share(due: &[u64], limit: usize, start: usize) -> Vec<u64> {
    let mut quotas = vec![0; due.len()];
    let mut left = limit;
    while left > 0 {
        let mut gave = false;
        for k in 0..due.len() {
            let s = (start + k) % due.len();
            if left > 0 && quotas[s] < due[s] {
                quotas[s] += 1;
                left -= 1;
                gave = true;
            }
        }
        if !gave {
            break;
        }
    }
    quotas
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shard_of_a_key_is_stable_and_spreads() {
        // Pinned: the shard is part of the data's layout in redis.
        assert_eq!(Shard::of(&ScopedKey::new("stripe", "evt_1")), Shard(11));
        let used: std::collections::HashSet<_> = (0..400)
            .map(|n| Shard::of(&ScopedKey::new("stripe", format!("evt_{n}"))))
            .collect();
        assert_eq!(used.len(), SHARDS as usize, "every shard gets events");
        assert_eq!(Shard(7).prefix("hg"), "hg:{q07}:");
        assert_eq!(Shard::of_job(16 * 5 + 7), Some(Shard(7)));
    }

    #[test]
    fn the_limit_is_shared_in_turn_among_shards_with_due_jobs() {
        assert_eq!(share(&[0, 5, 1, 0], 4, 0), [0, 3, 1, 0]);
        assert_eq!(share(&[2, 2, 2], 2, 1), [0, 1, 1]);
        assert_eq!(share(&[0, 0], 3, 0), [0, 0]);
        assert_eq!(share(&[9], 3, 5), [3]);
    }
}
