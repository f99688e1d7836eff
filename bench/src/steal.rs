//! The hypervisor's share of this machine's CPU time (`steal` in
//! `/proc/stat`): time its virtual CPUs had work and the host ran
//! something else. It makes every process of a row dearer and slower at
//! once, so each row reports it beside its CPU and latency; a row with
//! much of it is a row on a busy host, whatever else it says. It does not
//! see the rest of a host's contention (a busy sibling hyperthread, a
//! shared cache), which slows a row without any steal.

use std::fs;

/// The machine's CPU time counters (every CPU), in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuTicks {
    steal: u64,
    total: u64,
}

impl CpuTicks {
    /// `None` where `/proc/stat` is missing or has no `cpu` line.
    pub fn now() -> Option<Self> {
        parse(&fs::read_to_string("/proc/stat").ok()?)
    }

    /// Steal's share of the CPU time from `self` to `later`, 0 to 1;
    /// `None` when no tick passed.
    pub fn steal_until(self, later: Self) -> Option<f64> {
        let total = later.total.checked_sub(self.total)?;
        let steal = later.steal.checked_sub(self.steal)?;
        (total > 0).then(|| steal as f64 / total as f64)
    }
}

/// The `cpu` line of proc(5)'s `/proc/stat`: user, nice, system, idle,
/// iowait, irq, softirq, steal, then guest and guest_nice, which user and
/// nice already count, so the total is the first eight.
fn parse(stat: &str) -> Option<CpuTicks> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    Some(CpuTicks {
        steal: *fields.get(7)?,
        total: fields.iter().sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "cpu  231233 0 24936 111547 2975 0 7277 5833 0 0\n\
                          cpu0 116000 0 12000 56000 1500 0 3600 2900 0 0\n\
                          intr 1 2 3\n";
    const AFTER: &str = "cpu  231333 0 24946 111597 2975 0 7277 5873 7 0\n";

    #[test]
    fn reads_the_machine_line_and_leaves_guest_time_to_user() {
        assert_eq!(
            parse(BEFORE),
            Some(CpuTicks {
                steal: 5833,
                total: 231233 + 24936 + 111547 + 2975 + 7277 + 5833,
            })
        );
    }

    #[test]
    fn steal_is_a_share_of_the_ticks_between_two_readings() {
        let (before, after) = (parse(BEFORE).unwrap(), parse(AFTER).unwrap());
        // 100 user + 10 system + 50 idle + 40 steal: the 7 guest ticks are in user's.
        assert_eq!(before.steal_until(after), Some(0.2));
        assert_eq!(after.steal_until(after), None);
        assert_eq!(after.steal_until(before), None);
    }

    #[test]
    fn refuses_what_is_not_a_cpu_line() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse("cpu  1 2 3 x 5 6 7 8\n"), None);
        assert_eq!(parse("cpu  1 2 3 4 5 6 7\n"), None);
    }
}
