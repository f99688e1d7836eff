//! The side-by-side run: every row against the same upstream on the same
//! machine, one after another, and the tables that compare them.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::load::{self, Outcome, Pacing, Plan};
use crate::requests::{Builder, Mix, Pool};
use crate::services::{self, GateLog, Service, Store};

/// What a run measures and with what.
#[derive(Clone, Debug)]
pub struct Options {
    pub hookgate: PathBuf,
    /// A second gate binary (a proposed change): every gate row runs
    /// twice, once per binary, side by side in the same run.
    pub candidate: Option<PathBuf>,
    pub nginx: PathBuf,
    pub redis: PathBuf,
    pub duration: Duration,
    pub warmup: Duration,
    /// Closed-loop connections of the throughput rows.
    pub connections: usize,
    /// Closed-loop connections of the peak-RSS rows.
    pub rss_connections: usize,
    /// The open-loop rate of the added-latency rows, and their connections.
    pub rate: f64,
    pub rate_connections: usize,
    pub threads: usize,
    pub upstream_threads: usize,
    /// Events sent once before a duplicate or mixed row, then replayed.
    pub dup_set: usize,
    /// Fresh events signed per second of a row: the most a row can use.
    pub max_rate: f64,
    /// Run only the rows whose name contains one of these.
    pub only: Vec<String>,
    pub gate_log: GateLog,
    pub gate_env: Vec<(String, String)>,
    /// Record a `perf` profile of each gate row into this directory.
    pub perf: Option<PathBuf>,
    pub perf_args: String,
}

/// What sits between the load generator and the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Direct,
    Nginx,
    Gate(Store),
}

#[derive(Clone, Debug)]
pub struct Row {
    pub name: String,
    pub target: Target,
    pub mix: Mix,
    pub connections: usize,
    pub pacing: Pacing,
    /// Runs `--candidate` rather than `--hookgate`.
    pub candidate: bool,
}

pub struct Measured {
    pub row: Row,
    pub outcome: Outcome,
    /// CPU seconds per answer of each process over the whole row (warm-up
    /// included): the load generator, the upstream, the proxy, redis.
    pub cpu_per_request: Vec<(Role, f64)>,
    /// CPU seconds used by all of them per second of the row: how many of
    /// the machine's cores the row kept busy.
    pub busy_cores: f64,
    /// The gate's peak resident set over the row (priming included), KiB.
    pub rss_kib: Option<u64>,
    /// Of the gate's resident set at the end, the file-backed part, KiB.
    pub file_rss_kib: Option<u64>,
}

/// Whose CPU time a row accounts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Generator,
    Upstream,
    Proxy,
    Redis,
}

/// The rows of a full run, in order.
pub fn rows(o: &Options) -> Vec<Row> {
    let closed = |name: &str, target, mix, connections| Row {
        name: name.to_owned(),
        target,
        mix,
        connections,
        pacing: Pacing::Closed,
        candidate: false,
    };
    let open = |name: &str, target| Row {
        name: name.to_owned(),
        target,
        mix: Mix::FRESH,
        connections: o.rate_connections,
        pacing: Pacing::Open(o.rate),
        candidate: false,
    };
    let (c, big) = (o.connections, o.rss_connections);
    let (redis, sqlite) = (Target::Gate(Store::Redis), Target::Gate(Store::Sqlite));
    let mut all = vec![
        closed("direct", Target::Direct, Mix::FRESH, c),
        closed("nginx", Target::Nginx, Mix::FRESH, c),
        closed("redis fresh", redis, Mix::FRESH, c),
        closed("sqlite fresh", sqlite, Mix::FRESH, c),
        closed("redis duplicate", redis, Mix::DUPLICATE, c),
        closed("sqlite duplicate", sqlite, Mix::DUPLICATE, c),
        closed("sqlite forged", sqlite, Mix::FORGED, c),
        closed("redis mixed", redis, Mix::MIXED, c),
        closed("sqlite mixed", sqlite, Mix::MIXED, c),
    ];
    if big != c {
        all.extend([
            closed("nginx", Target::Nginx, Mix::FRESH, big),
            closed("redis fresh", redis, Mix::FRESH, big),
            closed("sqlite fresh", sqlite, Mix::FRESH, big),
        ]);
    }
    all.extend([
        open("direct", Target::Direct),
        open("nginx", Target::Nginx),
        open("redis fresh", redis),
        open("sqlite fresh", sqlite),
    ]);
    if o.candidate.is_some() {
        all = all
            .into_iter()
            .flat_map(|row| {
                let twin = matches!(row.target, Target::Gate(_)).then(|| Row {
                    candidate: true,
                    ..row.clone()
                });
                std::iter::once(row).chain(twin)
            })
            .collect();
    }
    if o.only.is_empty() {
        return all;
    }
    all.into_iter()
        .filter(|r| o.only.iter().any(|w| label(r).contains(w.as_str())))
        .collect()
}

/// A row's unique label: its name, connections and pacing.
pub fn label(row: &Row) -> String {
    let which = if row.candidate { " (candidate)" } else { "" };
    match row.pacing {
        Pacing::Closed => format!("{} c{}{which}", row.name, row.connections),
        Pacing::Open(rate) => format!("{} @{rate}/s{which}", row.name),
    }
}

/// Runs `rows` and returns what each measured. Services start once (the
/// upstream, nginx, redis); each gate row gets a gate of its own.
pub fn run(o: &Options, rows: &[Row], dir: &Path) -> io::Result<Vec<Measured>> {
    let needs = |f: fn(&Target) -> bool| rows.iter().any(|r| f(&r.target));
    let upstream = services::upstream(dir, o.upstream_threads)?;
    let nginx = match needs(|t| *t == Target::Nginx) {
        true => Some(services::nginx(&o.nginx, dir, upstream.port)?),
        false => None,
    };
    let redis = match needs(|t| *t == Target::Gate(Store::Redis)) {
        true => Some(services::redis(&o.redis, dir)?),
        false => None,
    };
    let mut results = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        eprintln!("[{}/{}] {}", i + 1, rows.len(), label(row));
        let measured = match row.target {
            Target::Direct => measure(
                o,
                dir,
                row,
                &upstream,
                i,
                None,
                &watched(&upstream, None, None),
            )?,
            Target::Nginx => {
                let nginx = nginx.as_ref().expect("started");
                measure(
                    o,
                    dir,
                    row,
                    nginx,
                    i,
                    None,
                    &watched(&upstream, Some(nginx), None),
                )?
            }
            Target::Gate(store) => {
                let tag = format!("row{i}-{}", store.name());
                let bin = match (&o.candidate, row.candidate) {
                    (Some(candidate), true) => candidate,
                    _ => &o.hookgate,
                };
                let gate = services::hookgate(
                    bin,
                    dir,
                    &tag,
                    store,
                    redis.as_ref(),
                    upstream.port,
                    &o.gate_log,
                    &o.gate_env,
                )?;
                let redis = redis.as_ref().filter(|_| store == Store::Redis);
                let procs = watched(&upstream, Some(&gate), redis);
                measure(o, dir, row, &gate, i, Some(&tag), &procs)?
            }
        };
        eprintln!(
            "        {:.0} req/s, p99 {:.3} ms, {} errors{}",
            measured.outcome.per_second(),
            measured.outcome.ms(0.99),
            measured.outcome.errors,
            measured
                .outcome
                .first_error
                .as_deref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default()
        );
        results.push(measured);
    }
    Ok(results)
}

/// The processes whose CPU time a row accounts for.
fn watched(
    upstream: &Service,
    proxy: Option<&Service>,
    redis: Option<&Service>,
) -> Vec<(Role, u32)> {
    let mut procs = vec![
        (Role::Generator, std::process::id()),
        (Role::Upstream, upstream.pid()),
    ];
    procs.extend(proxy.map(|p| (Role::Proxy, p.pid())));
    procs.extend(redis.map(|r| (Role::Redis, r.pid())));
    procs
}

/// Primes (for duplicates), then measures one row against `server`.
#[allow(clippy::too_many_arguments)]
fn measure(
    o: &Options,
    dir: &Path,
    row: &Row,
    server: &Service,
    index: usize,
    gate_tag: Option<&str>,
    procs: &[(Role, u32)],
) -> io::Result<Measured> {
    let through_gate = gate_tag.is_some();
    let builder = Builder::new(server.port, through_gate, &format!("r{index}"));
    let primed = if row.mix.duplicate > 0 {
        let primed = Arc::new(builder.primed(o.dup_set));
        let plan = Plan {
            addr: server.addr(),
            connections: 32,
            pacing: Pacing::Closed,
            warmup: Duration::ZERO,
            duration: Duration::from_secs(3600),
            threads: o.threads,
            timeout: Duration::from_secs(30),
        };
        let primed_run = load::run(&plan, Arc::clone(&primed));
        if primed_run.errors > 0 || primed_run.completed as usize != primed.len() {
            return Err(io::Error::other(format!(
                "priming {} failed: {} of {} sent, {} errors (first: {:?})",
                label(row),
                primed_run.completed,
                primed.len(),
                primed_run.errors,
                primed_run.first_error
            )));
        }
        Some(primed)
    } else {
        None
    };
    let pool = Arc::new(pool_for(o, row, &builder, primed.as_deref()));
    let plan = Plan {
        addr: server.addr(),
        connections: row.connections,
        pacing: row.pacing,
        warmup: o.warmup,
        duration: o.duration,
        threads: o.threads,
        timeout: Duration::from_secs(30),
    };
    let profiler = match (&o.perf, gate_tag) {
        (Some(dir), Some(tag)) => Some(services::Profiler::attach(
            server.pid(),
            &dir.join(format!("{tag}.data")),
            &o.perf_args,
        )?),
        _ => None,
    };
    let cpu_before: Vec<f64> = procs
        .iter()
        .map(|(_, pid)| services::cpu_seconds(*pid))
        .collect();
    let started = std::time::Instant::now();
    let outcome = load::run(&plan, pool);
    let wall = started.elapsed().as_secs_f64();
    let cpu: Vec<(Role, f64)> = procs
        .iter()
        .zip(cpu_before)
        .map(|((role, pid), before)| (*role, services::cpu_seconds(*pid) - before))
        .collect();
    drop(profiler);
    let answers = outcome.answered_total.max(1) as f64;
    let busy_cores = cpu.iter().map(|(_, s)| s).sum::<f64>() / wall;
    let cpu_per_request = cpu.into_iter().map(|(r, s)| (r, s / answers)).collect();
    if let Some(tag) = gate_tag {
        let to = dir.join(format!("{tag}.metrics"));
        if let Err(e) = services::save_metrics(server, &to) {
            eprintln!("        (no metrics from the gate: {e})");
        }
    }
    Ok(Measured {
        row: row.clone(),
        outcome,
        cpu_per_request,
        busy_cores,
        rss_kib: gate_tag.and_then(|_| server.peak_rss_kib()),
        file_rss_kib: gate_tag.and_then(|_| server.file_rss_kib()),
    })
}

/// The requests of a row. Rows that may repeat requests (baselines,
/// duplicates, forgeries) cycle through a small pool; rows with fresh
/// events get one event per request the row could possibly send.
fn pool_for(o: &Options, row: &Row, builder: &Builder, primed: Option<&Pool>) -> Pool {
    let secs = (o.warmup + o.duration).as_secs_f64();
    let fresh_count = match row.pacing {
        Pacing::Closed => secs * o.max_rate,
        // Ten percent over the schedule: the open loop never sends more.
        Pacing::Open(rate) => secs * rate * 1.1,
    }
    .ceil() as usize
        + 1;
    match row.target {
        Target::Direct | Target::Nginx => {
            let mut pool = builder.mixed(fresh_count.min(20_000), Mix::FRESH, None);
            pool.cycle = true;
            pool
        }
        Target::Gate(_) if row.mix.fresh == 0 => builder.mixed(o.dup_set, row.mix, primed),
        Target::Gate(_) => builder.mixed(fresh_count, row.mix, primed),
    }
}
