//! hookgate's load generator and side-by-side benchmark.
//!
//! `hookgate-bench suite` starts an upstream, nginx, redis-server and one
//! gate per row on loopback ports, drives each row with pre-signed Stripe
//! deliveries, and prints markdown tables. `bench/run.sh` builds everything
//! and runs it; see docs/BENCHMARKS.md.

mod http1;
mod load;
mod report;
mod requests;
mod services;
mod steal;
mod suite;
mod upstream;
mod waits;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::services::GateLog;
use crate::suite::Options;

#[derive(Parser)]
#[command(about = "hookgate's load generator and side-by-side benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every row side by side and print the tables.
    Suite(Box<SuiteArgs>),
    /// Serve as the application: read the body, answer 200 {"ok":true}.
    Upstream {
        #[arg(long)]
        listen: SocketAddr,
        /// Runtime threads (1: a single-threaded runtime).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Keep every POST waiting until `POST /_bench/release`.
        #[arg(long)]
        hold: bool,
    },
}

#[derive(clap::Args)]
struct SuiteArgs {
    /// The gate's release binary.
    #[arg(long, default_value = "target/release/hookgate")]
    hookgate: PathBuf,
    /// A second gate binary, e.g. a proposed change: every gate row also
    /// runs with it, side by side in the same run, marked "candidate".
    #[arg(long)]
    candidate: Option<PathBuf>,
    #[arg(long, default_value = "nginx")]
    nginx: PathBuf,
    #[arg(long, default_value = "redis-server")]
    redis: PathBuf,
    /// Node.js, for the node rows.
    #[arg(long, default_value = "node")]
    node: PathBuf,
    /// The node rows' handler; its packages are installed beside it
    /// (`npm install` in its directory: bench/run.sh does).
    #[arg(long, default_value = "bench/node/handler.js")]
    node_handler: PathBuf,
    /// Seconds measured per row.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds sent before measuring, per row.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Closed-loop connections of the throughput rows.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Closed-loop connections of the peak-RSS rows.
    #[arg(long, default_value_t = 256)]
    rss_connections: usize,
    /// Open-loop rate of the added-latency rows, requests per second.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Connections of the open-loop rows.
    #[arg(long, default_value_t = 16)]
    rate_connections: usize,
    /// The load generator's runtime threads (1: single-threaded).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The upstream's runtime threads (1: single-threaded).
    #[arg(long, default_value_t = 1)]
    upstream_threads: usize,
    /// Events sent once before a duplicate or mixed row, then replayed.
    #[arg(long, default_value_t = 10_000)]
    dup_set: usize,
    /// Fresh events signed per second of a closed-loop row (a row that
    /// uses them all ends early and says so).
    #[arg(long, default_value_t = 30_000.0)]
    max_rate: f64,
    /// Only the rows whose label contains this (repeatable), e.g.
    /// "sqlite fresh c64", "nginx", "@1000".
    #[arg(long)]
    only: Vec<String>,
    /// Leave out the rows whose label contains this (repeatable), after
    /// --only, e.g. "node" (scripts/pgo-build.sh trains on the gate's rows).
    #[arg(long)]
    skip: Vec<String>,
    /// Send the gate's stdout (one JSON line per delivery) to /dev/null
    /// instead of a file in the run's directory.
    #[arg(long)]
    gate_log_null: bool,
    /// An environment variable for every gate, NAME=VALUE (repeatable), e.g.
    /// RUST_LOG=warn to measure without the per-delivery log line. By
    /// default the gate gets no RUST_LOG and no HOOKGATE_* variable.
    #[arg(long, value_name = "NAME=VALUE")]
    gate_env: Vec<String>,
    /// Record `perf` profiles of the gate rows into this directory.
    #[arg(long)]
    perf: Option<PathBuf>,
    /// Arguments for `perf record`.
    #[arg(long, default_value = "-F 999 -g")]
    perf_args: String,
    /// Run each gate under callgrind and print its instructions per answered
    /// request, counted from the end of the warm-up (and priming) to the end
    /// of the measured window. The gate runs 30-50x slower: try `--duration
    /// 5 --warmup 1 --dup-set 1000`. Its CPU, RSS and latency are valgrind's.
    #[arg(long, conflicts_with = "perf")]
    instructions: bool,
    /// With --instructions: keep each gate row's callgrind dump of the
    /// measured window in this directory (`<row>.callgrind`), for
    /// `callgrind_annotate --tree=caller`.
    #[arg(long, requires = "instructions", value_name = "DIR")]
    callgrind_dir: Option<PathBuf>,
    /// Events a drain row accepts (while the app holds the relay back)
    /// before it times the relay delivering them (500 with --smoke).
    #[arg(long, default_value_t = 20_000)]
    drain_events: usize,
    /// `queue.concurrency` of the drain rows (repeatable: one row per
    /// value and store); the gate's default is 16.
    #[arg(long, default_values_t = [suite::DEFAULT_QUEUE_CONCURRENCY])]
    drain_concurrency: Vec<usize>,
    /// Run every row this many times. With --candidate, each gate row and
    /// its candidate twin swap order every other round, and a table gives
    /// the candidate's CPU per request over the tree's in each round and
    /// their median: the A/B this shared, noisy machine can resolve.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    rounds: u16,
    /// Run the rows the targets are judged on this many times in all
    /// (nginx's and the gate's at --connections, the gate's fresh events at
    /// --rss-connections, the open-loop rows), the extra rounds after every
    /// other row; each target is then judged on the median of its rounds,
    /// each against nginx's (or the direct row's) of the same round. One
    /// run's nginx differs by a tenth from another's on this kind of
    /// machine, more than some targets' margins. bench/run.sh without
    /// arguments passes 3.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    target_rounds: u16,
    /// Keep the run's directory (configs, logs, databases) and print it.
    #[arg(long)]
    keep: bool,
    /// Also write the tables to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// A few seconds in all: every row for 1 s, fail only if a row got no
    /// answers or more than 1% errors. For CI; asserts no timing.
    #[arg(long)]
    smoke: bool,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Upstream {
            listen,
            threads,
            hold,
        } => match upstream::serve(listen, threads, hold) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("upstream: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Suite(args) => suite_main(*args),
    }
}

fn suite_main(a: SuiteArgs) -> ExitCode {
    let (duration, warmup, dup_set, drain_events) = if a.smoke {
        (1.0, 0.2, a.dup_set.min(200), a.drain_events.min(500))
    } else {
        (a.duration, a.warmup, a.dup_set, a.drain_events)
    };
    let options = Options {
        hookgate: a.hookgate,
        candidate: a.candidate,
        nginx: a.nginx,
        redis: a.redis,
        node: a.node,
        node_handler: a.node_handler,
        duration: Duration::from_secs_f64(duration),
        warmup: Duration::from_secs_f64(warmup),
        connections: a.connections,
        rss_connections: a.rss_connections,
        rate: a.rate,
        rate_connections: a.rate_connections,
        threads: a.threads,
        upstream_threads: a.upstream_threads,
        dup_set,
        max_rate: a.max_rate,
        only: a.only,
        skip: a.skip,
        gate_log: if a.gate_log_null {
            GateLog::Null
        } else {
            GateLog::File
        },
        gate_env: a
            .gate_env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        perf: a.perf,
        perf_args: a.perf_args,
        instructions: a.instructions,
        callgrind_dir: a.callgrind_dir,
        drain_events: drain_events.max(1),
        drain_concurrency: a.drain_concurrency,
        rounds: usize::from(a.rounds),
        target_rounds: if a.smoke {
            1
        } else {
            usize::from(a.target_rounds)
        },
    };
    if !options.hookgate.is_file() {
        eprintln!(
            "no gate binary at {} (build it: cargo build --release)",
            options.hookgate.display()
        );
        return ExitCode::FAILURE;
    }
    if options.instructions
        && !["valgrind", "callgrind_control"].iter().all(|tool| {
            std::process::Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
    {
        eprintln!("--instructions needs valgrind and callgrind_control (apt-get install valgrind)");
        return ExitCode::FAILURE;
    }
    if let Some(dir) = options.perf.as_ref().or(options.callgrind_dir.as_ref())
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let dir = match tempfile::Builder::new().prefix("hookgate-bench-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rows = suite::rows(&options);
    let drains = suite::drains(&options);
    if rows.iter().any(|r| r.target == suite::Target::Node) {
        let modules = options
            .node_handler
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("node_modules");
        if !options.node_handler.is_file() || !modules.is_dir() {
            eprintln!(
                "the node rows need {} and its packages in {} \
                 (`npm install --no-package-lock --no-audit --no-fund` there; bench/run.sh does)",
                options.node_handler.display(),
                modules.display()
            );
            return ExitCode::FAILURE;
        }
    }
    let machine = report::machine();
    eprintln!("machine: {machine}");
    eprintln!("run directory: {}", dir.path().display());
    let results = suite::run(&options, &rows, &drains, dir.path());
    let load_after = report::load_average();
    if a.keep {
        eprintln!("kept {}", dir.keep().display());
    }
    let (results, drained) = match results {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut text = format!(
        "Machine: {machine}; load average after the run {load_after}.\n\
         Each row: {warmup} s warm-up, then {duration} s measured. Load generator: \
         {} runtime thread(s); upstream: {} thread(s). Latencies in milliseconds.\n\n",
        options.threads, options.upstream_threads
    );
    if results
        .iter()
        .any(|m| matches!(m.row.pacing, load::Pacing::Closed))
    {
        text.push_str(&report::throughput(&results));
        text.push('\n');
        text.push_str(&report::cpu(&results));
    }
    if results
        .iter()
        .any(|m| matches!(m.row.pacing, load::Pacing::Open(_)))
    {
        text.push('\n');
        text.push_str(&report::latency(&results));
        let waits = report::waits(&results);
        if !waits.is_empty() {
            text.push('\n');
            text.push_str(&waits);
        }
    }
    if results.iter().any(|m| m.queue.is_some()) {
        text.push('\n');
        text.push_str(&report::queue(&results));
    }
    if !drained.is_empty() {
        text.push('\n');
        text.push_str(&report::drain(&drained));
    }
    if options.rounds > 1 && options.candidate.is_some() {
        text.push('\n');
        text.push_str(&report::rounds(&results));
    }
    if options.instructions {
        text.push('\n');
        text.push_str(&report::instructions(&results));
        text.push_str(
            "\nThe gates ran under callgrind (--instructions): their rows' requests/s, \
             latency, CPU and RSS are valgrind's, so no target is judged.\n",
        );
    } else {
        text.push('\n');
        text.push_str(&report::targets(&results, &options));
    }
    let steal = report::steal_summary(&results);
    if !steal.is_empty() {
        text.push('\n');
        text.push_str(&steal);
    }
    println!("{text}");
    if let Some(out) = &a.out
        && let Err(e) = std::fs::write(out, &text)
    {
        eprintln!("cannot write {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    let broken: Vec<_> = results
        .iter()
        .filter(|m| {
            m.outcome.completed == 0 || (a.smoke && m.outcome.errors * 100 > m.outcome.completed)
        })
        .map(|m| suite::label(&m.row))
        .collect();
    if broken.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("rows without answers or with errors: {}", broken.join(", "));
        ExitCode::FAILURE
    }
}
