//! The markdown a run prints: the machine, the throughput table, the
//! added-latency table and the targets.

use std::fmt::Write;
use std::fs;

use crate::load::Pacing;
use crate::requests::Mix;
use crate::services::Store;
use crate::suite::{self, DrainMeasured, Measured, Options, Role, Target};
use crate::waits::Histogram;

/// The targets. The gate's CPU per request (its own process: user + system,
/// every thread) at most this many times nginx's at the same connections,
/// for forgeries (on sqlite), duplicates and fresh events (on each store).
const FORGED_CPU_RATIO: f64 = 0.8;
const DUPLICATE_CPU_RATIO: f64 = 1.3;
const FRESH_CPU_RATIO: f64 = 2.5;
/// The p99 the gate adds at the open-loop rate (the direct row's p99 off).
const ADDED_P99_MS: f64 = 0.4;
/// The gate's peak resident set at the peak-RSS connections, each store.
const RSS_MIB: f64 = 20.0;
/// redis-server's CPU per fresh event of the gate on redis.
const REDIS_US_PER_FRESH: f64 = 15.0;

pub fn machine() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores ({model}), {mem_gib:.0} GiB, Linux {}, load average {}",
        kernel.trim(),
        load_average()
    )
}

pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn name(m: &Measured) -> String {
    format!(
        "{}{}",
        target_name(m.row.target),
        suite::round_suffix(&m.row)
    )
}

fn target_name(t: Target) -> &'static str {
    match t {
        Target::Direct => "direct to the upstream",
        Target::Nginx => "nginx `proxy_pass`",
        Target::Gate(Store::Redis) => "hookgate on redis",
        Target::Gate(Store::Sqlite) => "hookgate on sqlite",
        Target::Node => "node handler on redis",
    }
}

fn workload(m: &Measured) -> &'static str {
    let mix = m.row.mix;
    match m.row.target {
        Target::Direct | Target::Nginx => "signed events, nothing checked",
        _ if m.row.queue && mix.fresh == 100 => "queue mode: fresh events (202)",
        _ if m.row.queue => "queue mode: duplicates (202)",
        _ if mix.fresh == 100 => "fresh events",
        _ if mix.duplicate == 100 => "duplicates",
        _ if mix.forged == 100 => "forged signatures",
        _ => "mixed 70/25/5",
    }
}

/// The first row that `is` finds in `round` if there is one, else in
/// the first round: a baseline (nginx's, the direct row) that the round
/// did not repeat.
fn in_round(
    results: &[Measured],
    round: usize,
    is: impl Fn(&Measured) -> bool,
) -> Option<&Measured> {
    let find = |round: usize| results.iter().find(|m| m.row.round == round && is(m));
    find(round).or_else(|| find(0))
}

/// nginx's closed-loop row at `connections`, in `round` (`in_round`).
fn nginx_row(results: &[Measured], connections: usize, round: usize) -> Option<&Measured> {
    in_round(results, round, |m| {
        m.row.target == Target::Nginx
            && m.row.connections == connections
            && matches!(m.row.pacing, Pacing::Closed)
    })
}

fn nginx_rate(results: &[Measured], row: &suite::Row) -> Option<f64> {
    nginx_row(results, row.connections, row.round).map(|m| m.outcome.per_second())
}

fn rss(m: &Measured) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    match (m.rss_kib, m.file_rss_kib) {
        (Some(peak), Some(file)) => format!("{:.1} MiB ({:.1} file)", mib(peak), mib(file)),
        (Some(peak), None) => format!("{:.1} MiB", mib(peak)),
        _ => String::new(),
    }
}

/// The row's `steal` as a percentage of the machine's CPU time.
fn steal(m: &Measured) -> String {
    m.steal
        .map_or_else(String::new, |s| format!("{:.1}%", s * 100.0))
}

fn errors(m: &Measured) -> String {
    let mut s = m.outcome.errors.to_string();
    if m.outcome.exhausted {
        s.push_str(" (pool used up: shorter run)");
    }
    s
}

/// The closed-loop table: throughput and its ratio to nginx.
pub fn throughput(results: &[Measured]) -> String {
    let mut out = String::from(
        "| target | workload | connections | requests/s | vs nginx | p50 ms | p99 ms | p99.9 ms | errors | gate's or node's peak RSS (file-backed) |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for m in results
        .iter()
        .filter(|m| matches!(m.row.pacing, Pacing::Closed))
    {
        let rate = m.outcome.per_second();
        let ratio = nginx_rate(results, &m.row)
            .filter(|n| *n > 0.0)
            .map_or_else(|| "".into(), |n| format!("{:.2}x", rate / n));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {:.3} | {:.3} | {:.3} | {} | {} |",
            name(m),
            workload(m),
            m.row.connections,
            rate,
            ratio,
            m.outcome.ms(0.5),
            m.outcome.ms(0.99),
            m.outcome.ms(0.999),
            errors(m),
            rss(m),
        );
    }
    out
}

/// The direct row at the open-loop rate, in `round` (`in_round`).
fn direct_open(results: &[Measured], round: usize) -> Option<&Measured> {
    in_round(results, round, |m| {
        m.row.target == Target::Direct && matches!(m.row.pacing, Pacing::Open(_))
    })
}

/// The open-loop table: latency at a fixed rate, minus the direct row's.
pub fn latency(results: &[Measured]) -> String {
    let mut out = String::from(
        "| target | rate | achieved/s | p50 ms | p99 ms | p99.9 ms | added p50 ms | added p99 ms | errors | steal |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for m in results.iter() {
        let Pacing::Open(rate) = m.row.pacing else {
            continue;
        };
        let added = |q: f64| {
            direct_open(results, m.row.round)
                .filter(|d| m.row.target != Target::Direct && d.row.pacing_rate() == rate)
                .map_or_else(
                    || "".into(),
                    |d| format!("{:+.3}", m.outcome.ms(q) - d.outcome.ms(q)),
                )
        };
        let _ = writeln!(
            out,
            "| {} | {rate:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} |",
            name(m),
            m.outcome.per_second(),
            m.outcome.ms(0.5),
            m.outcome.ms(0.99),
            m.outcome.ms(0.999),
            added(0.5),
            added(0.99),
            errors(m),
            steal(m),
        );
    }
    out
}

/// Where each open-loop gate row's time went, by the gate's own histograms
/// (`waits`): the whole request, the claim, the mark and the app, each as
/// its mean and its share above 0.5 ms; and what is left, the gate's own
/// time per request (the request's sum less the claim's and the app's).
/// The mark is made after the sender's answer, outside the request's time
/// (a gate from before that change had it inside, so its own time reads
/// high here by its marks'). Empty when no such row has them.
pub fn waits(results: &[Measured]) -> String {
    const TAIL: f64 = 0.0005;
    let rows: Vec<_> = results
        .iter()
        .filter(|m| matches!(m.row.pacing, Pacing::Open(_)))
        .filter_map(|m| Some((m, m.waits.as_ref()?)))
        .filter(|(_, w)| w.request.count > 0.0)
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "Where the time went, by the gate's own histograms (warm-up included): \
         each wait's mean in ms, and the share of them above 0.5 ms.\n\n\
         | target | rate | request | > 0.5 ms | claim | > 0.5 ms | mark | > 0.5 ms | app | > 0.5 ms | the gate's own, ms |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    let mean = |h: &Histogram| h.mean_ms().map_or_else(String::new, |v| format!("{v:.3}"));
    let tail = |h: &Histogram| {
        h.share_above(TAIL)
            .map_or_else(String::new, |v| format!("{:.2}%", v * 100.0))
    };
    for (m, w) in rows {
        let waited = w.claim.sum + w.upstream.sum;
        let own = (w.request.sum - waited) / w.request.count * 1e3;
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {own:.3} |",
            name(m),
            m.row.pacing_rate(),
            mean(&w.request),
            tail(&w.request),
            mean(&w.claim),
            tail(&w.claim),
            mean(&w.complete),
            tail(&w.complete),
            mean(&w.upstream),
            tail(&w.upstream),
        );
    }
    out
}

impl crate::suite::Row {
    fn pacing_rate(&self) -> f64 {
        match self.pacing {
            Pacing::Open(r) => r,
            Pacing::Closed => 0.0,
        }
    }
}

/// A closed-loop row of the tree's own binary (not a candidate, not queue
/// mode), in the first round.
fn closed_row(
    results: &[Measured],
    target: Target,
    mix: Mix,
    connections: usize,
) -> Option<&Measured> {
    closed_row_in(results, target, mix, connections, 0)
}

/// `closed_row` in `round`.
fn closed_row_in(
    results: &[Measured],
    target: Target,
    mix: Mix,
    connections: usize,
    round: usize,
) -> Option<&Measured> {
    results.iter().find(|m| {
        m.row.round == round
            && m.row.target == target
            && m.row.mix == mix
            && m.row.connections == connections
            && !m.row.candidate
            && !m.row.queue
            && matches!(m.row.pacing, Pacing::Closed)
    })
}

/// A row's proxy CPU per request over nginx's at the same connections.
fn vs_nginx_cpu(results: &[Measured], m: &Measured) -> Option<f64> {
    let nginx = nginx_cpu(results, m.row.connections, m.row.round)?;
    Some(cpu_of(&m.cpu_per_request, Role::Proxy)? / nginx)
}

/// One line of the targets table: what was measured (the value the goal
/// is about, and how to print it), and the goal's test (none for a line
/// that only informs).
struct Line {
    what: String,
    goal: String,
    measured: Option<(f64, String)>,
    holds: Option<fn(f64) -> bool>,
}

/// A target's value in each round that measured it (the value and how to
/// print it), judged on their median: one run's nginx can differ by a
/// tenth from the next one's on a shared machine.
fn over_rounds(
    each: impl Iterator<Item = Option<(f64, String)>>,
    show: impl Fn(f64) -> String,
) -> Option<(f64, String)> {
    let each: Vec<(f64, String)> = each.flatten().collect();
    let n = each.len();
    if n < 2 {
        return each.into_iter().next();
    }
    let mut values: Vec<f64> = each.iter().map(|(v, _)| *v).collect();
    values.sort_by(f64::total_cmp);
    let median = match n % 2 {
        1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    };
    let texts: Vec<&str> = each.iter().map(|(_, t)| t.as_str()).collect();
    Some((
        median,
        format!(
            "{} (median of {n} rounds: {})",
            show(median),
            texts.join(", ")
        ),
    ))
}

/// Each target, what was measured, and whether it holds. A target whose
/// rows ran in several rounds (`--target-rounds`) is judged on its median.
pub fn targets(results: &[Measured], o: &Options) -> String {
    let c = o.connections;
    let gate = |store| Target::Gate(store);
    let rounds = results.iter().map(|m| m.row.round).max().unwrap_or(0) + 1;
    let rounds = || 0..rounds;
    // The gate's CPU per request over that round's nginx's, with both in
    // microseconds.
    let cpu_ratio = |target, mix| {
        let each = rounds().map(|round| {
            let m = closed_row_in(results, target, mix, c, round)?;
            let ratio = vs_nginx_cpu(results, m)?;
            let us = cpu_of(&m.cpu_per_request, Role::Proxy)? * 1e6;
            let nginx = nginx_cpu(results, c, round)? * 1e6;
            Some((ratio, format!("{ratio:.2}x ({us:.0} / {nginx:.0} µs)")))
        });
        over_rounds(each, |v| format!("{v:.2}x"))
    };
    let mut lines = vec![Line {
        what: format!("gate CPU per forged request on sqlite (c{c}), vs nginx's"),
        goal: format!("<= {FORGED_CPU_RATIO}x"),
        measured: cpu_ratio(gate(Store::Sqlite), Mix::FORGED),
        holds: Some(|v| v <= FORGED_CPU_RATIO),
    }];
    for store in [Store::Sqlite, Store::Redis] {
        lines.push(Line {
            what: format!(
                "gate CPU per duplicate on {} (c{c}), vs nginx's",
                store.name()
            ),
            goal: format!("<= {DUPLICATE_CPU_RATIO}x"),
            measured: cpu_ratio(gate(store), Mix::DUPLICATE),
            holds: Some(|v| v <= DUPLICATE_CPU_RATIO),
        });
    }
    for store in [Store::Sqlite, Store::Redis] {
        lines.push(Line {
            what: format!(
                "gate CPU per fresh event on {} (c{c}), vs nginx's",
                store.name()
            ),
            goal: format!("<= {FRESH_CPU_RATIO}x"),
            measured: cpu_ratio(gate(store), Mix::FRESH),
            holds: Some(|v| v <= FRESH_CPU_RATIO),
        });
    }
    for store in [Store::Sqlite, Store::Redis] {
        let added = |v: f64| format!("{v:+.2} ms");
        let each = rounds().map(|round| {
            let m = results.iter().find(|m| {
                m.row.round == round
                    && m.row.target == gate(store)
                    && !m.row.candidate
                    && !m.row.queue
                    && matches!(m.row.pacing, Pacing::Open(_))
            })?;
            let d = direct_open(results, round)?;
            let v = m.outcome.ms(0.99) - d.outcome.ms(0.99);
            Some((v, added(v)))
        });
        lines.push(Line {
            what: format!("added p99 on {} at {:.0} req/s", store.name(), o.rate),
            goal: format!("<= +{ADDED_P99_MS} ms"),
            measured: over_rounds(each, added),
            holds: Some(|v| v <= ADDED_P99_MS),
        });
    }
    for store in [Store::Sqlite, Store::Redis] {
        let mib = |v: f64| format!("{v:.1} MiB");
        let each = rounds().map(|round| {
            let m = closed_row_in(results, gate(store), Mix::FRESH, o.rss_connections, round)?;
            let v = m.rss_kib? as f64 / 1024.0;
            Some((v, mib(v)))
        });
        lines.push(Line {
            what: format!(
                "gate peak RSS on {} at {} connections",
                store.name(),
                o.rss_connections
            ),
            goal: format!("<= {RSS_MIB} MiB"),
            measured: over_rounds(each, mib),
            holds: Some(|v| v <= RSS_MIB),
        });
    }
    let us = |v: f64| format!("{v:.1} µs");
    let each = rounds().map(|round| {
        let m = closed_row_in(results, gate(Store::Redis), Mix::FRESH, c, round)?;
        let v = cpu_of(&m.cpu_per_request, Role::Redis)? * 1e6;
        Some((v, us(v)))
    });
    lines.push(Line {
        what: format!("redis-server CPU per fresh event of the gate on redis (c{c})"),
        goal: format!("<= {REDIS_US_PER_FRESH} µs"),
        measured: over_rounds(each, us),
        holds: Some(|v| v <= REDIS_US_PER_FRESH),
    });
    for (what, mix) in [("fresh event", Mix::FRESH), ("duplicate", Mix::DUPLICATE)] {
        let us = |target| {
            closed_row(results, target, mix, c)
                .and_then(|m| cpu_of(&m.cpu_per_request, Role::Proxy))
                .map(|s| s * 1e6)
        };
        let measured = us(gate(Store::Redis))
            .zip(us(Target::Node))
            .filter(|(_, node)| *node > 0.0)
            .map(|(g, node)| {
                (
                    g / node,
                    format!("{:.2}x ({g:.0} / {node:.0} µs)", g / node),
                )
            });
        lines.push(Line {
            what: format!("gate CPU per {what} on redis (c{c}), vs the node handler's"),
            goal: "information, not a target".to_owned(),
            measured,
            holds: None,
        });
    }
    let mut out = String::from("| target | goal | measured | holds |\n|---|---|--:|---|\n");
    for line in lines {
        let (measured, holds) = match (line.measured, line.holds) {
            (Some((v, text)), Some(test)) => (text, if test(v) { "yes" } else { "**no**" }),
            (Some((_, text)), None) => (text, ""),
            (None, _) => ("not measured".to_owned(), ""),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {measured} | {holds} |",
            line.what, line.goal
        );
    }
    out
}

/// Where the machine's CPU went in each closed-loop row: microseconds of
/// CPU per request for each process, the proxy's over nginx's at the same
/// connections, and how many cores the row kept busy.
pub fn cpu(results: &[Measured]) -> String {
    let mut out = String::from(
        "| target | workload | connections | load generator µs | upstream µs | proxy µs | vs nginx CPU | redis µs | total µs | busy cores | steal |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for m in results
        .iter()
        .filter(|m| matches!(m.row.pacing, Pacing::Closed))
    {
        let of = |role: Role| {
            m.cpu_per_request
                .iter()
                .find(|(r, _)| *r == role)
                .map_or_else(|| "".into(), |(_, s)| format!("{:.0}", s * 1e6))
        };
        let total: f64 = m.cpu_per_request.iter().map(|(_, s)| s).sum();
        let vs_nginx = vs_nginx_cpu(results, m).map_or_else(String::new, |r| format!("{r:.1}x"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.2} | {} |",
            name(m),
            workload(m),
            m.row.connections,
            of(Role::Generator),
            of(Role::Upstream),
            of(Role::Proxy),
            vs_nginx,
            of(Role::Redis),
            total * 1e6,
            m.busy_cores,
            steal(m),
        );
    }
    out
}

fn cpu_of(cpu: &[(Role, f64)], role: Role) -> Option<f64> {
    cpu.iter().find(|(r, _)| *r == role).map(|(_, s)| *s)
}

/// nginx's own CPU per request at `connections` (its workers', closed
/// loop), in `round` if nginx ran in it, else in the first.
fn nginx_cpu(results: &[Measured], connections: usize, round: usize) -> Option<f64> {
    nginx_row(results, connections, round)
        .and_then(|m| cpu_of(&m.cpu_per_request, Role::Proxy))
        .filter(|s| *s > 0.0)
}

/// With `--rounds` and a candidate: per closed-loop gate row, the
/// candidate's CPU per request (the gate's own, then redis-server's) over
/// the tree's binary's in each round, and the median of those ratios. A
/// round's two runs are minutes apart at most, so drift of the machine
/// moves both; the median keeps one stalled run from deciding.
pub fn rounds(results: &[Measured]) -> String {
    let mut out = String::from(
        "| row | rounds | gate µs, tree (median) | gate µs, candidate (median) | candidate / tree, each round | median | redis µs, candidate / tree (median) |\n\
         |---|--:|--:|--:|---|--:|--:|\n",
    );
    let mut pairs: Vec<String> = Vec::new();
    for m in results.iter().filter(|m| m.row.candidate) {
        let pair = suite::pair_label(&m.row);
        if matches!(m.row.pacing, Pacing::Closed) && !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    for pair in pairs {
        let of = |candidate: bool, round: usize, role: Role| {
            results
                .iter()
                .find(|m| {
                    m.row.candidate == candidate
                        && m.row.round == round
                        && suite::pair_label(&m.row) == pair
                })
                .and_then(|m| cpu_of(&m.cpu_per_request, role))
                .filter(|s| *s > 0.0)
        };
        let rounds = results.iter().map(|m| m.row.round + 1).max().unwrap_or(0);
        let (mut tree, mut cand, mut ratios, mut redis) = (vec![], vec![], vec![], vec![]);
        for round in 0..rounds {
            if let (Some(t), Some(c)) =
                (of(false, round, Role::Proxy), of(true, round, Role::Proxy))
            {
                tree.push(t * 1e6);
                cand.push(c * 1e6);
                ratios.push(c / t);
            }
            if let (Some(t), Some(c)) =
                (of(false, round, Role::Redis), of(true, round, Role::Redis))
            {
                redis.push(c / t);
            }
        }
        if ratios.is_empty() {
            continue;
        }
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let _ = writeln!(
            out,
            "| {pair} | {} | {:.0} | {:.0} | {} | **{:.3}** | {} |",
            ratios.len(),
            median(&mut tree),
            median(&mut cand),
            each.join(", "),
            median(&mut ratios),
            if redis.is_empty() {
                String::new()
            } else {
                format!("{:.3}", median(&mut redis))
            },
        );
    }
    out
}

/// The run's steal in one sentence (empty where `/proc/stat` was not
/// read): its median over the rows and its highest row. Steal is CPU time
/// the host gave to something else while this machine had work, so a run
/// with much of it measured a busy host; docs/BENCHMARKS.md says how its
/// rows are read.
pub fn steal_summary(results: &[Measured]) -> String {
    let Some((top, row)) = results
        .iter()
        .filter_map(|m| Some((m.steal?, m)))
        .max_by(|a, b| a.0.total_cmp(&b.0))
    else {
        return String::new();
    };
    let mut all: Vec<f64> = results.iter().filter_map(|m| m.steal).collect();
    format!(
        "Steal, the host's share of this machine's CPU time while a row ran: \
         median {:.1}% over the rows, highest {:.1}% ({}).\n",
        median(&mut all) * 100.0,
        top * 100.0,
        suite::label(&row.row),
    )
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The queue rows next to nginx: throughput, and the gate's CPU per
/// request over nginx's. A fresh accept is answered before its delivery,
/// so the gate's CPU is given twice: over the row (with what the relay
/// delivered meanwhile), and until the app had every accepted event.
pub fn queue(results: &[Measured]) -> String {
    let mut out = String::from(
        "| target | workload | connections | requests/s | vs nginx | gate µs/request | vs nginx's µs | delivered during the row | gate µs/event, accepted and delivered | vs nginx's µs |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for m in results.iter() {
        let Some(q) = &m.queue else {
            continue;
        };
        let rate = m.outcome.per_second();
        let ratio =
            |x: f64, of: Option<f64>| of.map_or_else(String::new, |n| format!("{:.1}x", x / n));
        let nginx = nginx_cpu(results, m.row.connections, m.row.round);
        let gate = cpu_of(&m.cpu_per_request, Role::Proxy).unwrap_or(0.0);
        let (delivered, with_delivery, with_ratio) = match (q.accepted, q.gate_cpu_with_delivery) {
            (0, _) => ("".to_owned(), "".to_owned(), "".to_owned()),
            (n, Some(s)) => (
                format!("{:.0}%", q.delivered_during as f64 * 100.0 / n as f64),
                format!("{:.0}", s * 1e6),
                ratio(s, nginx),
            ),
            (n, None) => (
                format!("{:.0}%", q.delivered_during as f64 * 100.0 / n as f64),
                "not drained".to_owned(),
                "".to_owned(),
            ),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {:.0} | {} | {} | {} | {} |",
            name(m),
            workload(m),
            m.row.connections,
            rate,
            nginx_rate(results, &m.row)
                .filter(|n| *n > 0.0)
                .map_or_else(String::new, |n| format!("{:.2}x", rate / n)),
            gate * 1e6,
            ratio(gate, nginx),
            delivered,
            with_delivery,
            with_ratio,
        );
    }
    out
}

/// The drain rows: how fast the relay delivers a backlog, and at what CPU.
pub fn drain(drained: &[DrainMeasured]) -> String {
    let mut out = String::from(
        "| target | queue.concurrency | events | accepts/s (relay held) | gate µs/accept (relay held) | drain s | drained events/s | gate (relay) µs/event | app µs/event | redis µs/event | busy cores | retries |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for m in drained {
        let d = &m.drain;
        let base = target_name(Target::Gate(d.store));
        let which = if d.candidate { " (candidate)" } else { "" };
        let us = |role| {
            cpu_of(&m.cpu_per_event, role).map_or_else(String::new, |s| format!("{:.0}", s * 1e6))
        };
        let secs = m.drain_time.as_secs_f64();
        let _ = writeln!(
            out,
            "| {base}{which} | {} | {} | {:.0} | {:.0} | {:.3} | {:.0} | {} | {} | {} | {:.2} | {} |",
            d.concurrency,
            d.events,
            m.accept_rate,
            m.accept_gate_cpu * 1e6,
            secs,
            d.events as f64 / secs.max(1e-9),
            us(Role::Proxy),
            us(Role::Upstream),
            us(Role::Redis),
            m.busy_cores,
            m.retries,
        );
    }
    out
}

/// With `--instructions`: each gate row's instructions (callgrind's count,
/// every thread) over its measured window, per answer in it. Candidate
/// rows also over the same row of the tree's binary.
pub fn instructions(results: &[Measured]) -> String {
    let mut out = String::from(
        "| target | workload | load | answered | instructions/request | vs hookgate |\n\
         |---|---|---|--:|--:|--:|\n",
    );
    let per_request = |m: &Measured| {
        m.instructions
            .filter(|_| m.outcome.completed > 0)
            .map(|i| i as f64 / m.outcome.completed as f64)
    };
    for m in results.iter() {
        let Some(mine) = per_request(m) else {
            continue;
        };
        let load = match m.row.pacing {
            Pacing::Closed => format!("{} connections", m.row.connections),
            Pacing::Open(rate) => format!("{rate:.0}/s, {} connections", m.row.connections),
        };
        let versus = results
            .iter()
            .filter(|_| m.row.candidate)
            .find(|b| {
                !b.row.candidate
                    && suite::label(&b.row) == suite::label(&m.row).replace(" (candidate)", "")
            })
            .and_then(per_request)
            .map_or_else(String::new, |base| {
                format!("{:+.1}%", (mine / base - 1.0) * 100.0)
            });
        let _ = writeln!(
            out,
            "| {} | {} | {load} | {} | {mine:.0} | {versus} |",
            name(m),
            workload(m),
            m.outcome.completed,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(values: &[f64]) -> Option<(f64, String)> {
        over_rounds(values.iter().map(|v| Some((*v, format!("{v:.1}")))), |v| {
            format!("{v:.2}")
        })
    }

    #[test]
    fn a_target_over_rounds_is_judged_on_its_median() {
        assert_eq!(judged(&[]), None);
        assert_eq!(judged(&[2.7]), Some((2.7, "2.7".into())));
        assert_eq!(
            judged(&[2.7, 2.4, 2.5]),
            Some((2.5, "2.50 (median of 3 rounds: 2.7, 2.4, 2.5)".into()))
        );
        assert_eq!(judged(&[1.0, 2.0]).map(|(v, _)| v), Some(1.5));
        // A round that measured nothing is left out, not counted as zero.
        let some = over_rounds(
            [Some((3.0, "3".into())), None, Some((1.0, "1".into()))].into_iter(),
            |v| format!("{v}"),
        );
        assert_eq!(some.map(|(v, _)| v), Some(2.0));
    }
}
