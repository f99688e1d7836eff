//! The side-by-side run: every row against the same upstream on the same
//! machine, one after another, and the tables that compare them.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::load::{self, Outcome, Pacing, Plan};
use crate::requests::{Answerer, Builder, Mix, Pool};
use crate::services::{self, AppStats, GateLog, Queue, Service, Store};
use crate::steal::CpuTicks;
use crate::waits::Waits;

/// The default `queue.concurrency` (src/config/file.rs): the relay
/// attempts a gate has in flight.
pub const DEFAULT_QUEUE_CONCURRENCY: usize = 16;
/// How long a queue row waits for the relay to deliver what was accepted.
const DRAIN_WITHIN: Duration = Duration::from_secs(300);

/// What a run measures and with what.
#[derive(Clone, Debug)]
pub struct Options {
    pub hookgate: PathBuf,
    /// A second gate binary (a proposed change): every gate row runs
    /// twice, once per binary, side by side in the same run.
    pub candidate: Option<PathBuf>,
    pub nginx: PathBuf,
    pub redis: PathBuf,
    /// Node.js and the node rows' handler (bench/node/handler.js).
    pub node: PathBuf,
    pub node_handler: PathBuf,
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
    /// Then leave out the rows whose name contains one of these.
    pub skip: Vec<String>,
    pub gate_log: GateLog,
    pub gate_env: Vec<(String, String)>,
    /// Record a `perf` profile of each gate row into this directory.
    pub perf: Option<PathBuf>,
    pub perf_args: String,
    /// Run each gate row's gate under callgrind and count its instructions
    /// over the measured window.
    pub instructions: bool,
    /// With `instructions`: where each gate row's dump is kept.
    pub callgrind_dir: Option<PathBuf>,
    /// Events accepted (with the app holding the relay back) before a
    /// drain row times the relay.
    pub drain_events: usize,
    /// `queue.concurrency` of the drain rows: one row per value and store.
    pub drain_concurrency: Vec<usize>,
    /// Every row this many times; with a candidate, each gate row and its
    /// twin swap order every other round, so that drift of the machine
    /// falls on both alike.
    pub rounds: usize,
    /// The rows the targets are judged on (`judged`; the tree's, not a
    /// candidate's) this many times in all, the rounds past `rounds` after
    /// every other row but the drains: each target is
    /// then judged on the median of its rounds, each round's gate row
    /// against that round's nginx or direct row.
    pub target_rounds: usize,
}

impl Options {
    /// Whether the row labelled `label` runs: named by --only (or no --only
    /// given) and not by --skip.
    fn selects(&self, label: &str) -> bool {
        let named = |words: &[String]| words.iter().any(|w| label.contains(w.as_str()));
        (self.only.is_empty() || named(&self.only)) && !named(&self.skip)
    }
}

/// What sits between the load generator and the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Direct,
    Nginx,
    Gate(Store),
    /// What a user would write instead of the gate: bench/node/handler.js,
    /// Stripe's `constructEvent` and a Redis `SET NX EX`, with no app behind.
    Node,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub name: String,
    pub target: Target,
    pub mix: Mix,
    pub connections: usize,
    pub pacing: Pacing,
    /// The gate's provider in queue mode (accepts answered 202, the relay
    /// delivers to the upstream).
    pub queue: bool,
    /// Runs `--candidate` rather than `--hookgate`.
    pub candidate: bool,
    /// Which of `--rounds` this run of the row is, from 0.
    pub round: usize,
}

/// A drain row: the relay delivering a backlog of accepted events.
#[derive(Clone, Debug)]
pub struct Drain {
    pub store: Store,
    /// `queue.concurrency`.
    pub concurrency: usize,
    pub events: usize,
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
    /// The hypervisor's share of the machine's CPU time over the row
    /// (`steal`), 0 to 1.
    pub steal: Option<f64>,
    /// The gate's (or node's) peak resident set over the row (priming
    /// included), KiB.
    pub rss_kib: Option<u64>,
    /// Of that process's resident set at the end, the file-backed part, KiB.
    pub file_rss_kib: Option<u64>,
    /// Queue rows: what the relay did.
    pub queue: Option<Relayed>,
    /// With `--instructions`, a gate row's: the gate's instructions over
    /// the measured window, which answered `outcome.completed` requests.
    pub instructions: Option<u64>,
    /// A gate row's histograms of its own (warm-up included).
    pub waits: Option<Waits>,
}

/// What the relay of a queue row delivered.
#[derive(Clone, Copy, Debug)]
pub struct Relayed {
    /// Events the app received while the row ran (warm-up included), of
    /// `accepted`.
    pub delivered_during: u64,
    pub accepted: u64,
    /// The gate's CPU seconds from the row's start until the app had every
    /// accepted event, per accepted event: accept and delivery both. `None`
    /// when the relay had not delivered them all within the wait.
    pub gate_cpu_with_delivery: Option<f64>,
    /// From the row's end until the app had every accepted event.
    pub drained_after: Option<Duration>,
}

/// What a drain row measured.
pub struct DrainMeasured {
    pub drain: Drain,
    /// Accepts per second while the app held the relay back.
    pub accept_rate: f64,
    /// The gate's CPU seconds per accept while the relay was held back.
    pub accept_gate_cpu: f64,
    /// From the app's release to the last delivery it answered.
    pub drain_time: Duration,
    /// CPU seconds per delivered event over the drain, of each process:
    /// the gate (its relay), the app, redis.
    pub cpu_per_event: Vec<(Role, f64)>,
    pub busy_cores: f64,
    /// Relay attempts after the first (none expected: the app says 200).
    pub retries: u64,
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
        queue: false,
        candidate: false,
        round: 0,
    };
    let queued = |name: &str, target, mix, connections| Row {
        queue: true,
        ..closed(name, target, mix, connections)
    };
    let open = |name: &str, target| Row {
        name: name.to_owned(),
        target,
        mix: Mix::FRESH,
        connections: o.rate_connections,
        pacing: Pacing::Open(o.rate),
        queue: false,
        candidate: false,
        round: 0,
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
        closed("node on redis fresh", Target::Node, Mix::FRESH, c),
        closed("node on redis duplicate", Target::Node, Mix::DUPLICATE, c),
        queued("redis queue fresh", redis, Mix::FRESH, c),
        queued("sqlite queue fresh", sqlite, Mix::FRESH, c),
        queued("redis queue duplicate", redis, Mix::DUPLICATE, c),
        queued("sqlite queue duplicate", sqlite, Mix::DUPLICATE, c),
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
    all.retain(|r| o.selects(&label(r)));
    let mut run = rounds(&all, o.rounds);
    // The rows the targets are judged on again, after the whole set, so
    // that each target is judged on a median (report::targets).
    for round in o.rounds.max(1)..o.target_rounds {
        let judged = |row: &&Row| !row.candidate && judged(row, o);
        run.extend(all.iter().filter(judged).map(|row| Row {
            round,
            ..row.clone()
        }));
    }
    run
}

/// Whether the targets are judged on `row` (report::targets): nginx's and
/// the gate's closed-loop rows at `--connections` (mixed traffic and queue
/// mode aside), nginx's and the gate's fresh events at
/// `--rss-connections` (so that each round's have their own nginx), and
/// the direct and gate rows at the open-loop rate.
pub fn judged(row: &Row, o: &Options) -> bool {
    match (row.pacing, row.target) {
        (_, Target::Node) => false,
        (Pacing::Open(_), target) => matches!(target, Target::Direct | Target::Gate(_)),
        (Pacing::Closed, _) if row.queue => false,
        (Pacing::Closed, Target::Nginx) => {
            row.connections == o.connections || row.connections == o.rss_connections
        }
        (Pacing::Closed, Target::Gate(_)) if row.connections == o.connections => {
            row.mix != Mix::MIXED
        }
        (Pacing::Closed, Target::Gate(_)) => {
            row.connections == o.rss_connections && row.mix == Mix::FRESH
        }
        (Pacing::Closed, Target::Direct) => false,
    }
}

/// `rows` `n` times over; in every odd round each gate row comes after its
/// candidate twin instead of before it.
fn rounds(rows: &[Row], n: usize) -> Vec<Row> {
    let mut all = Vec::with_capacity(rows.len() * n);
    for round in 0..n.max(1) {
        let start = all.len();
        all.extend(rows.iter().map(|row| Row {
            round,
            ..row.clone()
        }));
        if round % 2 == 1 {
            let this = &mut all[start..];
            for i in 1..this.len() {
                if this[i].candidate && !this[i - 1].candidate {
                    this.swap(i - 1, i);
                }
            }
        }
    }
    all
}

/// The drain rows of a full run: each store at each concurrency.
pub fn drains(o: &Options) -> Vec<Drain> {
    let mut all = Vec::new();
    for &concurrency in &o.drain_concurrency {
        for store in [Store::Redis, Store::Sqlite] {
            all.push(Drain {
                store,
                concurrency,
                events: o.drain_events,
                candidate: false,
            });
            if o.candidate.is_some() {
                all.push(Drain {
                    store,
                    concurrency,
                    events: o.drain_events,
                    candidate: true,
                });
            }
        }
    }
    all.into_iter()
        .filter(|d| o.selects(&drain_label(d)))
        .collect()
}

/// A drain row's unique label, e.g. "sqlite queue drain q16".
pub fn drain_label(d: &Drain) -> String {
    let which = if d.candidate { " (candidate)" } else { "" };
    format!("{} queue drain q{}{which}", d.store.name(), d.concurrency)
}

/// A row's unique label: its name, connections and pacing, then its
/// round after the first.
pub fn label(row: &Row) -> String {
    format!("{}{}", pair_label(row), round_suffix(row))
}

/// What a row and its candidate twin share in every round, e.g. "redis
/// fresh c64".
pub fn pair_label(row: &Row) -> String {
    match row.pacing {
        Pacing::Closed => format!("{} c{}", row.name, row.connections),
        Pacing::Open(rate) => format!("{} @{rate}/s", row.name),
    }
}

/// " (candidate)" and " #2" (the second round), as they apply.
pub fn round_suffix(row: &Row) -> String {
    let which = if row.candidate { " (candidate)" } else { "" };
    match row.round {
        0 => which.to_owned(),
        r => format!("{which} #{}", r + 1),
    }
}

/// Runs `rows`, then `drains`, and returns what each measured. Services
/// start once (the upstream, nginx, redis); each gate row gets a gate of
/// its own, and each drain row an app of its own too.
pub fn run(
    o: &Options,
    rows: &[Row],
    drains: &[Drain],
    dir: &Path,
) -> io::Result<(Vec<Measured>, Vec<DrainMeasured>)> {
    let needs = |f: fn(&Target) -> bool| rows.iter().any(|r| f(&r.target));
    let upstream = services::upstream(dir, "upstream", o.upstream_threads, false)?;
    let nginx = match needs(|t| *t == Target::Nginx) {
        true => Some(services::nginx(&o.nginx, dir, upstream.port)?),
        false => None,
    };
    let redis = match needs(|t| matches!(t, Target::Gate(Store::Redis) | Target::Node))
        || drains.iter().any(|d| d.store == Store::Redis)
    {
        true => Some(services::redis(&o.redis, dir)?),
        false => None,
    };
    let mut results = Vec::new();
    let total = rows.len() + drains.len();
    for (i, row) in rows.iter().enumerate() {
        eprintln!("[{}/{total}] {}", i + 1, label(row));
        let measured = match row.target {
            Target::Direct => measure(
                o,
                dir,
                row,
                &upstream,
                i,
                None,
                None,
                &watched(Some(&upstream), None, None),
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
                    None,
                    &watched(Some(&upstream), Some(nginx), None),
                )?
            }
            Target::Node => {
                let redis = redis.as_ref().expect("started");
                let tag = format!("row{i}-node");
                let node = services::node(&o.node, &o.node_handler, dir, &tag, redis)?;
                // No upstream: the handler is the application.
                let procs = watched(None, Some(&node), Some(redis));
                measure(o, dir, row, &node, i, None, None, &procs)?
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
                    row.queue.then_some(Queue {
                        concurrency: DEFAULT_QUEUE_CONCURRENCY,
                        patient: false,
                    }),
                    &o.gate_log,
                    &o.gate_env,
                    o.instructions
                        .then(|| dir.join(format!("{tag}.cg")))
                        .as_deref(),
                )?;
                let redis = redis.as_ref().filter(|_| store == Store::Redis);
                let procs = watched(Some(&upstream), Some(&gate), redis);
                let app = row.queue.then_some(&upstream);
                measure(o, dir, row, &gate, i, Some(&tag), app, &procs)?
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
        if let Some(q) = measured.queue.as_ref().filter(|q| q.accepted > 0) {
            eprintln!(
                "        {} of {} accepted delivered during the row; all of them {}",
                q.delivered_during,
                q.accepted,
                q.drained_after.map_or_else(
                    || format!("NOT within {DRAIN_WITHIN:?} after it"),
                    |d| format!("{:.1} s after it", d.as_secs_f64())
                )
            );
        }
        results.push(measured);
    }
    let mut drained = Vec::new();
    for (i, d) in drains.iter().enumerate() {
        let index = rows.len() + i;
        eprintln!("[{}/{total}] {}", index + 1, drain_label(d));
        let m = drain(o, dir, d, index, redis.as_ref())?;
        eprintln!(
            "        accepted {:.0}/s (relay held); drained {} in {:.3} s: {:.0} events/s, {} retries",
            m.accept_rate,
            d.events,
            m.drain_time.as_secs_f64(),
            d.events as f64 / m.drain_time.as_secs_f64().max(1e-9),
            m.retries
        );
        drained.push(m);
    }
    Ok((results, drained))
}

/// A drain row: a gate in queue mode whose app holds every delivery. The
/// gate accepts `events` fresh events; its relay's first `concurrency`
/// attempts wait in the app, every other job waits in the store, due. Then
/// the app lets go, and the row times the relay from the release to the
/// app's answer to the last event, with each process's CPU over that span.
fn drain(
    o: &Options,
    dir: &Path,
    d: &Drain,
    index: usize,
    redis: Option<&Service>,
) -> io::Result<DrainMeasured> {
    let app = services::upstream(dir, &format!("row{index}-app"), o.upstream_threads, true)?;
    let tag = format!("row{index}-{}", d.store.name());
    let bin = match (&o.candidate, d.candidate) {
        (Some(candidate), true) => candidate,
        _ => &o.hookgate,
    };
    let gate = services::hookgate(
        bin,
        dir,
        &tag,
        d.store,
        redis,
        app.port,
        Some(Queue {
            concurrency: d.concurrency,
            patient: true,
        }),
        &o.gate_log,
        &o.gate_env,
        None,
    )?;
    let redis = redis.filter(|_| d.store == Store::Redis);
    let procs = watched(Some(&app), Some(&gate), redis);
    let builder = Builder::new(gate.port, Answerer::Queue, &format!("r{index}"));
    let pool = Arc::new(builder.mixed(d.events, Mix::FRESH, None));
    let plan = Plan {
        addr: gate.addr(),
        connections: o.connections,
        pacing: Pacing::Closed,
        warmup: Duration::ZERO,
        duration: Duration::from_secs(3600),
        threads: o.threads,
        timeout: Duration::from_secs(30),
    };
    let gate_before = services::cpu_seconds(gate.pid());
    let accepted = load::run(&plan, pool);
    let accept_gate_cpu = services::cpu_seconds(gate.pid()) - gate_before;
    if accepted.errors > 0 || accepted.answered_total as usize != d.events {
        return Err(io::Error::other(format!(
            "accepting {}: {} of {} answered, {} errors (first: {:?})",
            drain_label(d),
            accepted.answered_total,
            d.events,
            accepted.errors,
            accepted.first_error
        )));
    }
    // The relay's first attempts reach the app (and wait there).
    let first = d.concurrency.min(d.events) as u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while services::app_stats(&app)?.arrived < first && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Let the gate settle after the accepts (its store's checkpoints).
    std::thread::sleep(Duration::from_millis(500));
    let before: Vec<f64> = procs
        .iter()
        .map(|(_, pid)| services::cpu_seconds(*pid))
        .collect();
    let released = std::time::Instant::now();
    services::release(&app)?;
    let stats: AppStats = services::await_deliveries(&app, d.events as u64, DRAIN_WITHIN)?;
    let wall = released.elapsed().as_secs_f64();
    let cpu: Vec<(Role, f64)> = procs
        .iter()
        .zip(before)
        .filter(|((role, _), _)| *role != Role::Generator)
        .map(|((role, pid), before)| (*role, services::cpu_seconds(*pid) - before))
        .collect();
    let busy_cores = cpu.iter().map(|(_, s)| s).sum::<f64>() / wall;
    let events = d.events as f64;
    if let Err(e) = services::save_metrics(&gate, &dir.join(format!("{tag}.metrics"))) {
        eprintln!("        (no metrics from the gate: {e})");
    }
    Ok(DrainMeasured {
        drain: d.clone(),
        accept_rate: accepted.per_second(),
        accept_gate_cpu: accept_gate_cpu / events,
        drain_time: stats.last,
        cpu_per_event: cpu.into_iter().map(|(r, s)| (r, s / events)).collect(),
        busy_cores,
        retries: stats.retries,
    })
}

/// The processes whose CPU time a row accounts for.
fn watched(
    upstream: Option<&Service>,
    proxy: Option<&Service>,
    redis: Option<&Service>,
) -> Vec<(Role, u32)> {
    let mut procs = vec![(Role::Generator, std::process::id())];
    procs.extend(upstream.map(|u| (Role::Upstream, u.pid())));
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
    queue_app: Option<&Service>,
    procs: &[(Role, u32)],
) -> io::Result<Measured> {
    let answerer = match (row.target, row.queue) {
        (Target::Direct | Target::Nginx, _) => Answerer::Upstream,
        (Target::Node, _) => Answerer::Node,
        (Target::Gate(_), false) => Answerer::Forward,
        (Target::Gate(_), true) => Answerer::Queue,
    };
    let builder = Builder::new(server.port, answerer, &format!("r{index}"));
    // Counted before priming: in queue mode the relay delivers the primed
    // events as they are accepted.
    let app_before_priming = queue_app.map(services::app_stats).transpose()?;
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
        // In queue mode the relay delivers the primed events now: the row
        // measures duplicates once it is done.
        if let (Some(app), Some(before)) = (queue_app, app_before_priming) {
            let want = before.count + primed.len() as u64;
            let deadline = std::time::Instant::now() + DRAIN_WITHIN;
            while services::app_stats(app)?.count < want {
                if std::time::Instant::now() > deadline {
                    return Err(io::Error::other(format!(
                        "priming {}: the relay did not deliver the primed events",
                        label(row)
                    )));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
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
    let app_before = queue_app.map(services::app_stats).transpose()?;
    let ticks_before = CpuTicks::now();
    let started = std::time::Instant::now();
    let (outcome, instructions) = match server.counts_instructions() {
        false => (load::run(&plan, pool), None),
        // Counted from the end of the warm-up, with no request in flight,
        // to the last answer of the measured window.
        true => {
            let mut switched = Ok(());
            let pause: &mut dyn FnMut() = &mut || switched = server.count_instructions();
            let outcome = load::run_with(&plan, pool, Some(pause));
            switched?;
            let (instructions, dump) = server.instructions_counted()?;
            if let (Some(keep), Some(tag)) = (&o.callgrind_dir, gate_tag) {
                std::fs::copy(&dump, keep.join(format!("{tag}.callgrind")))?;
            }
            (outcome, Some(instructions))
        }
    };
    let wall = started.elapsed().as_secs_f64();
    let steal = ticks_before
        .zip(CpuTicks::now())
        .and_then(|(before, after)| before.steal_until(after));
    let cpu: Vec<(Role, f64)> = procs
        .iter()
        .zip(&cpu_before)
        .map(|((role, pid), before)| (*role, services::cpu_seconds(*pid) - before))
        .collect();
    drop(profiler);
    let queue = match (queue_app, app_before) {
        (Some(app), Some(before)) => Some(relayed(
            app,
            before,
            // Only fresh events are enqueued; a queue row is all one kind.
            match row.mix.fresh {
                100 => outcome.answered_total,
                _ => 0,
            },
            server.pid(),
            procs,
            &cpu_before,
        )?),
        _ => None,
    };
    let answers = outcome.answered_total.max(1) as f64;
    let busy_cores = cpu.iter().map(|(_, s)| s).sum::<f64>() / wall;
    let cpu_per_request = cpu.into_iter().map(|(r, s)| (r, s / answers)).collect();
    let waits = gate_tag.and_then(|tag| {
        let to = dir.join(format!("{tag}.metrics"));
        services::save_metrics(server, &to)
            .map_err(|e| eprintln!("        (no metrics from the gate: {e})"))
            .ok()
            .map(|text| Waits::parse(&text))
    });
    let has_rss = matches!(row.target, Target::Gate(_) | Target::Node);
    Ok(Measured {
        row: row.clone(),
        outcome,
        cpu_per_request,
        busy_cores,
        steal,
        rss_kib: has_rss.then(|| server.peak_rss_kib()).flatten(),
        file_rss_kib: has_rss.then(|| server.file_rss_kib()).flatten(),
        queue,
        instructions,
        waits,
    })
}

/// After a queue row: what the relay delivered while it ran, and the gate's
/// CPU once the app has every accepted event (the accepts of the row's
/// fresh events are answered with those events still to deliver).
fn relayed(
    app: &Service,
    before: AppStats,
    accepted: u64,
    gate_pid: u32,
    procs: &[(Role, u32)],
    cpu_before: &[f64],
) -> io::Result<Relayed> {
    let during = services::app_stats(app)?.count - before.count;
    let ended = std::time::Instant::now();
    let want = before.count + accepted;
    let drained = accepted > 0 && services::await_deliveries(app, want, DRAIN_WITHIN).is_ok();
    let gate_before = procs
        .iter()
        .zip(cpu_before)
        .find(|((_, pid), _)| *pid == gate_pid)
        .map_or(0.0, |(_, b)| *b);
    let gate_cpu = services::cpu_seconds(gate_pid) - gate_before;
    Ok(Relayed {
        delivered_during: during,
        accepted,
        gate_cpu_with_delivery: drained.then(|| gate_cpu / accepted.max(1) as f64),
        drained_after: drained.then(|| ended.elapsed()),
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
        Target::Gate(_) | Target::Node if row.mix.fresh == 0 => {
            builder.mixed(o.dup_set, row.mix, primed)
        }
        Target::Gate(_) | Target::Node => builder.mixed(fresh_count, row.mix, primed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(target_rounds: usize) -> Options {
        Options {
            hookgate: PathBuf::new(),
            candidate: None,
            nginx: PathBuf::new(),
            redis: PathBuf::new(),
            node: PathBuf::new(),
            node_handler: PathBuf::new(),
            duration: Duration::from_secs(1),
            warmup: Duration::from_secs(1),
            connections: 64,
            rss_connections: 256,
            rate: 1000.0,
            rate_connections: 32,
            threads: 1,
            upstream_threads: 1,
            dup_set: 1,
            max_rate: 1.0,
            only: Vec::new(),
            skip: Vec::new(),
            gate_log: GateLog::Null,
            gate_env: Vec::new(),
            perf: None,
            perf_args: String::new(),
            instructions: false,
            callgrind_dir: None,
            drain_events: 1,
            drain_concurrency: Vec::new(),
            rounds: 1,
            target_rounds,
        }
    }

    #[test]
    fn the_rows_the_targets_are_judged_on_run_again_after_the_rest() {
        let once = rows(&options(1));
        let thrice = rows(&options(3));
        let again = &thrice[once.len()..];
        assert_eq!(
            thrice[..once.len()].iter().map(label).collect::<Vec<_>>(),
            once.iter().map(label).collect::<Vec<_>>()
        );
        let judged: Vec<String> = again
            .iter()
            .filter(|r| r.round == 1)
            .map(pair_label)
            .collect();
        assert_eq!(
            judged,
            [
                "nginx c64",
                "redis fresh c64",
                "sqlite fresh c64",
                "redis duplicate c64",
                "sqlite duplicate c64",
                "sqlite forged c64",
                "nginx c256",
                "redis fresh c256",
                "sqlite fresh c256",
                "direct @1000/s",
                "redis fresh @1000/s",
                "sqlite fresh @1000/s",
            ]
        );
        assert_eq!(again.len(), 2 * judged.len());
        assert!(again[judged.len()..].iter().all(|r| r.round == 2));
    }

    #[test]
    fn a_candidate_runs_no_extra_round() {
        let o = Options {
            candidate: Some(PathBuf::from("candidate")),
            ..options(3)
        };
        let all = rows(&o);
        assert!(all.iter().any(|r| r.candidate && r.round == 0));
        assert!(all.iter().filter(|r| r.round > 0).all(|r| !r.candidate));
    }

    #[test]
    fn rounds_of_every_row_count_towards_the_target_rounds() {
        let o = Options {
            rounds: 3,
            ..options(3)
        };
        assert!(rows(&o).iter().all(|r| r.round < 3));
        assert_eq!(rows(&o).len(), 3 * rows(&options(1)).len());
    }
}
