#!/usr/bin/env python3
"""Where the gate's CPU went, from a `perf record --call-graph dwarf` profile.

    perf script -i PROFILE.data -F comm,ip,sym,dso | bench/perf-owners.py

Each sample is attributed once: first to the task it ran in (found by the
frames nearest the root), then, inside the delivery task, to the first
pipeline component met walking from the leaf up. A flat `perf report`
spreads the same time over malloc, memmove and kernel frames instead.
"""
import collections
import re
import sys

TASKS = [
    # Since the delivery's future is boxed before its spawn (and with perf's
    # inlined frames), the task's frames read `poll<...Box<hookgate::
    # pipeline::deliver::...>>` and `hookgate::pipeline::stages::...`.
    ("delivery task",
     r"^hookgate::pipeline::deliver|^hookgate::pipeline::phases|^hookgate::pipeline::stages"
     r"|Box<hookgate::pipeline::deliver::"),
    ("inbound connection task (hyper server: parse request, write answer, socket I/O)",
     r"^hookgate::server::serve::\{\{closure\}\}::\{\{closure\}\}"
     r"|^hookgate::server::spawn_connection|^hookgate::server::Protocols::serve"
     r"|^<hyper_util::server::graceful::GracefulConnectionFuture"),
    ("upstream connection task (hyper client: write request, parse answer, socket I/O)",
     r"UpgradeableConnection"),
    ("redis connection task (redis-rs multiplexer)", r"^<?redis::|^<?combine::"),
    ("sqlite (blocking pool or store thread)",
     r"BlockingTask<hookgate::store::sqlite|^hookgate::store::sqlite|^sqlite3|^<?rusqlite::"),
]
COMPONENTS = [
    ("key + fingerprint (serde_json parse, canonical JSON, SHA-256)",
     r"^hookgate::key::|^hookgate::pipeline::claim::identify|^<?serde_json::|^<&mut serde_json"),
    ("signature check (HMAC-SHA256)",
     r"^hookgate::provider::|^<?hmac::|^<?sha2::|^hookgate::secret::|^hookgate::pipeline::verify::"),
    ("delivery log line (tracing JSON)",
     r"^<?tracing_subscriber::|^<?tracing_core::|^<?tracing::|^hookgate::telemetry::"),
    ("metrics (prometheus-client)", r"prometheus_client|^hookgate::metrics::"),
    ("redis call (redis-rs, script, decode)", r"^<?redis::|^hookgate::store::redis::"),
    ("sqlite call (hand-off to the blocking pool)",
     r"^hookgate::store::sqlite::|^<?tokio::runtime::blocking"),
    ("forward: build request, pooled client checkout, await answer",
     r"^hookgate::pipeline::forward::|^hookgate::upstream::|^<?hyper_util::client::"
     r"|^<?hyper::client::|^<?http::"),
    ("finish: snapshot, mark, relay", r"^hookgate::pipeline::finish::"),
    ("read body", r"^hookgate::pipeline::read::|^<?http_body_util::"),
]
TASKS = [(n, re.compile(p)) for n, p in TASKS]
COMPONENTS = [(n, re.compile(p)) for n, p in COMPONENTS]


# What a stack cut short may be attributed to: components whose frames run
# only in a delivery (`http::`, `redis::` and `serde_json::` frames also run
# in the connection tasks, so those stay with the runtime).
ONLY_IN_A_DELIVERY = re.compile(
    r"^hookgate::(key|provider|secret|telemetry|metrics|pipeline)::|^<?(hmac|sha2)::")


def component(syms, patterns=None):
    for s in syms:
        for name, pat in COMPONENTS:
            if pat.search(s) and (patterns is None or patterns.search(s)):
                return "delivery: " + name
    return None


# The frames a whole stack of the gate's threads ends in.
THREAD_ROOT = re.compile(r"__rust_begin_short_backtrace|start_thread|clone3|^_start\b|^main\b")


def classify(syms):
    # Walking from the root, the first frame that names a task: a task that
    # awaits another's output (the connection awaits its delivery) is not
    # counted as the one it awaits.
    task = next((n for s in reversed(syms) for n, p in TASKS if p.search(s)), None)
    if task is None:
        # A stack cut short before its task's frames (deep async frames can
        # outgrow the sampled stack) still names the pipeline's component;
        # a whole stack without a task frame is the runtime's own work
        # (including the park hook's write of the core's log lines).
        cut_short = not any(THREAD_ROOT.search(s) for s in syms)
        named = component(syms, ONLY_IN_A_DELIVERY) if cut_short else None
        return named or "runtime: scheduler, I/O driver, timers, idle (no task frame)"
    if task != "delivery task":
        return task
    return component(syms) or "delivery: pipeline glue (allocation, headers, tokio)"


def main():
    counts = collections.Counter()
    frames = []

    def flush():
        if frames:
            syms = [f.split(None, 1)[1] if len(f.split(None, 1)) > 1 else f for f in frames]
            counts[classify(syms)] += 1
            frames.clear()

    for line in sys.stdin:
        if not line.strip():
            flush()
        elif line.startswith(("\t", " ")):
            frames.append(line.strip())
    flush()
    total = sum(counts.values()) or 1
    for name, n in counts.most_common():
        print(f"| {name} | {100 * n / total:.1f}% |")
    print(f"({total} samples)")


if __name__ == "__main__":
    main()
