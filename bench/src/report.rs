//! The markdown a run prints: the machine, the throughput table, the
//! added-latency table and the targets.

use std::fmt::Write;
use std::fs;

use crate::load::Pacing;
use crate::services::Store;
use crate::suite::{DrainMeasured, Measured, Options, Role, Target};

/// The targets.
const FRESH_RATIO: f64 = 0.6;
const DUPLICATE_RATIO: f64 = 1.2;
const ADDED_P99_MS: f64 = 1.0;
const RSS_MIB: f64 = 30.0;

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
    let base = target_name(m.row.target);
    if m.row.candidate {
        format!("{base} (candidate)")
    } else {
        base.to_owned()
    }
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

fn nginx_rate(results: &[Measured], connections: usize) -> Option<f64> {
    results
        .iter()
        .find(|m| {
            m.row.target == Target::Nginx
                && m.row.connections == connections
                && matches!(m.row.pacing, Pacing::Closed)
        })
        .map(|m| m.outcome.per_second())
}

fn rss(m: &Measured) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    match (m.rss_kib, m.file_rss_kib) {
        (Some(peak), Some(file)) => format!("{:.1} MiB ({:.1} file)", mib(peak), mib(file)),
        (Some(peak), None) => format!("{:.1} MiB", mib(peak)),
        _ => String::new(),
    }
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
        let ratio = nginx_rate(results, m.row.connections)
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

fn direct_open(results: &[Measured]) -> Option<&Measured> {
    results
        .iter()
        .find(|m| m.row.target == Target::Direct && matches!(m.row.pacing, Pacing::Open(_)))
}

/// The open-loop table: latency at a fixed rate, minus the direct row's.
pub fn latency(results: &[Measured]) -> String {
    let mut out = String::from(
        "| target | rate | achieved/s | p50 ms | p99 ms | p99.9 ms | added p50 ms | added p99 ms | errors |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    let direct = direct_open(results);
    for m in results.iter() {
        let Pacing::Open(rate) = m.row.pacing else {
            continue;
        };
        let added = |q: f64| {
            direct
                .filter(|d| m.row.target != Target::Direct && d.row.pacing_rate() == rate)
                .map_or_else(
                    || "".into(),
                    |d| format!("{:+.3}", m.outcome.ms(q) - d.outcome.ms(q)),
                )
        };
        let _ = writeln!(
            out,
            "| {} | {rate:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {} | {} | {} |",
            name(m),
            m.outcome.per_second(),
            m.outcome.ms(0.5),
            m.outcome.ms(0.99),
            m.outcome.ms(0.999),
            added(0.5),
            added(0.99),
            errors(m),
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

/// Each target, what was measured, and whether it holds.
pub fn targets(results: &[Measured], o: &Options) -> String {
    let mut out = String::from("| target | goal | measured | holds |\n|---|---|--:|---|\n");
    let mut line =
        |what: String, goal: String, value: Option<f64>, unit: &str, ok: &dyn Fn(f64) -> bool| {
            let (measured, holds) = match value {
                Some(v) => (
                    format!("{v:.2}{unit}"),
                    if ok(v) { "yes" } else { "**no**" },
                ),
                None => ("not measured".into(), ""),
            };
            let _ = writeln!(out, "| {what} | {goal} | {measured} | {holds} |");
        };
    let ratio = |target: Target, fresh: u32, dup: u32| {
        results
            .iter()
            .find(|m| {
                m.row.target == target
                    && !m.row.candidate
                    && !m.row.queue
                    && m.row.mix.fresh == fresh
                    && m.row.mix.duplicate == dup
                    && m.row.connections == o.connections
                    && matches!(m.row.pacing, Pacing::Closed)
            })
            .and_then(|m| {
                let n = nginx_rate(results, o.connections)?;
                (n > 0.0).then(|| m.outcome.per_second() / n)
            })
    };
    for store in [Store::Redis, Store::Sqlite] {
        line(
            format!("fresh events on {}, vs nginx", store.name()),
            format!(">= {FRESH_RATIO}x"),
            ratio(Target::Gate(store), 100, 0),
            "x",
            &|v| v >= FRESH_RATIO,
        );
    }
    for store in [Store::Redis, Store::Sqlite] {
        line(
            format!("duplicates on {}, vs nginx", store.name()),
            format!(">= {DUPLICATE_RATIO}x"),
            ratio(Target::Gate(store), 0, 100),
            "x",
            &|v| v >= DUPLICATE_RATIO,
        );
    }
    let direct = direct_open(results);
    for store in [Store::Redis, Store::Sqlite] {
        let added = results
            .iter()
            .find(|m| {
                m.row.target == Target::Gate(store)
                    && !m.row.candidate
                    && !m.row.queue
                    && matches!(m.row.pacing, Pacing::Open(_))
            })
            .zip(direct)
            .map(|(m, d)| m.outcome.ms(0.99) - d.outcome.ms(0.99));
        line(
            format!("added p99 on {} at {:.0} req/s", store.name(), o.rate),
            format!("<= {ADDED_P99_MS} ms"),
            added,
            " ms",
            &|v| v <= ADDED_P99_MS,
        );
    }
    let peak = results
        .iter()
        .filter(|m| {
            matches!(m.row.target, Target::Gate(_))
                && !m.row.candidate
                && !m.row.queue
                && m.row.connections == o.rss_connections
                && matches!(m.row.pacing, Pacing::Closed)
        })
        .filter_map(|m| m.rss_kib)
        .max()
        .map(|k| k as f64 / 1024.0);
    line(
        format!("hookgate peak RSS at {} connections", o.rss_connections),
        format!("<= {RSS_MIB} MiB"),
        peak,
        " MiB",
        &|v| v <= RSS_MIB,
    );
    out
}

/// Where the machine's CPU went in each closed-loop row: microseconds of
/// CPU per request for each process, and how many cores the row kept busy.
pub fn cpu(results: &[Measured]) -> String {
    let mut out = String::from(
        "| target | workload | connections | load generator µs | upstream µs | proxy µs | redis µs | total µs | busy cores |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|\n",
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
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.2} |",
            name(m),
            workload(m),
            m.row.connections,
            of(Role::Generator),
            of(Role::Upstream),
            of(Role::Proxy),
            of(Role::Redis),
            total * 1e6,
            m.busy_cores,
        );
    }
    out
}

fn cpu_of(cpu: &[(Role, f64)], role: Role) -> Option<f64> {
    cpu.iter().find(|(r, _)| *r == role).map(|(_, s)| *s)
}

/// nginx's own CPU per request at `connections` (its workers', closed loop).
fn nginx_cpu(results: &[Measured], connections: usize) -> Option<f64> {
    results
        .iter()
        .find(|m| {
            m.row.target == Target::Nginx
                && m.row.connections == connections
                && matches!(m.row.pacing, Pacing::Closed)
        })
        .and_then(|m| cpu_of(&m.cpu_per_request, Role::Proxy))
        .filter(|s| *s > 0.0)
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
        let nginx = nginx_cpu(results, m.row.connections);
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
            nginx_rate(results, m.row.connections)
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
