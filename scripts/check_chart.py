#!/usr/bin/env python3
"""Helpers of scripts/check-chart.sh, one subcommand per step.

  split RENDERED OUTDIR     split a rendered stream: Kubernetes resources to
                            OUTDIR/resources.yaml, each config.toml to
                            OUTDIR/<configmap>.toml; check the Prometheus
                            Operator objects (unknown to kubernetes-validate)
                            and the gate containers' hardening and probes
  secrets CONFIG WORKDIR    stand-ins for a config's secrets: file sources
                            re-rooted under WORKDIR and created there, env
                            sources printed as NAME=value; the config with the
                            new paths is written to WORKDIR/config.toml
  roundtrip CONFIG VALUES.. config.toml rendered by the chart against the
                            values it came from (chart defaults, then files)
  monitoring ALERTS DASHBOARD
                            rule and dashboard structure, and every metric,
                            label and outcome they use against SPEC section 6

Each prints what it checked; a failure prints why and exits 1.
"""

import json
import re
import sys
import tomllib
from pathlib import Path

import yaml

# SPEC section 6.
METRICS = {
    "hookgate_deliveries_total": {"provider", "outcome"},
    "hookgate_request_duration_seconds": {"provider", "outcome"},
    "hookgate_upstream_duration_seconds": {"provider"},
    "hookgate_store_operation_duration_seconds": {"backend", "operation"},
    "hookgate_secret_matches_total": {"provider", "secret"},
    "hookgate_mark_retries_total": {"provider"},
    # The postgres store's partition maintenance (gauges, no labels).
    "hookgate_postgres_estimated_rows": set(),
    "hookgate_postgres_oldest_partition_age_seconds": set(),
    "hookgate_postgres_partitions_ahead": set(),
    "hookgate_postgres_last_maintenance_timestamp_seconds": set(),
    # Queue mode (SPEC section 1b).
    "hookgate_queue_depth": {"provider", "state"},
    "hookgate_queue_oldest_pending_seconds": {"provider"},
    "hookgate_relay_attempts_total": {"provider", "outcome"},
    "hookgate_accept_to_delivery_seconds": {"provider"},
    "hookgate_dead_letters_total": {"provider"},
}
# Gauges state a level, so their alerts need no rate: `for:` still holds them
# over time.
GAUGES = {n for n in METRICS if n.startswith("hookgate_postgres_")} | {
    "hookgate_queue_depth", "hookgate_queue_oldest_pending_seconds",
}
HISTOGRAMS = {n for n in METRICS if n.endswith("_seconds") and n not in GAUGES}
OUTCOMES = {
    "forwarded", "duplicate", "in_flight", "payload_mismatch", "invalid_signature",
    "stale_timestamp", "missing_key", "bad_payload", "rate_limited", "overloaded", "store_unavailable",
    "upstream_error", "upstream_unreachable", "upstream_timeout", "payload_too_large",
    "request_timeout", "internal_error", "accepted",
}
# The outcomes of a relay attempt (hookgate_relay_attempts_total).
RELAY_OUTCOMES = {"delivered", "retry", "dead"}
# Labels Prometheus adds when it scrapes, plus the histogram bucket bound.
SCRAPE_LABELS = {"namespace", "job", "instance", "pod", "le"}
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


class Failed(Exception):
    pass


def need(cond, message):
    if not cond:
        raise Failed(message)


def seconds(duration):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"([0-9]+)(ms|s|m|h|d)", duration)
    need(parts, f"cannot read the duration {duration!r}")
    return sum(int(n) * units[u] for n, u in parts)


# --- split -------------------------------------------------------------------

def check_operator_object(doc):
    kind, name = doc["kind"], doc["metadata"]["name"]
    need(doc.get("apiVersion") == "monitoring.coreos.com/v1", f"{kind}/{name}: apiVersion")
    spec = doc.get("spec") or {}
    if kind == "ServiceMonitor":
        need(spec.get("selector", {}).get("matchLabels"), f"{kind}/{name}: no selector")
        ports = [e.get("port") for e in spec.get("endpoints", [])]
        need(ports == ["admin"], f"{kind}/{name}: endpoints should scrape the admin port, got {ports}")
    else:
        groups = spec.get("groups") or []
        need(groups and all(g.get("rules") for g in groups), f"{kind}/{name}: no rules")
        check_rules(spec, f"{kind}/{name}")
    return f"{kind}/{name}"


def pod_value(pod, container, key):
    """A securityContext setting from the container, else from the pod."""
    value = (container.get("securityContext") or {}).get(key)
    if value is None:
        value = (pod.get("securityContext") or {}).get(key)
    return value


def check_gate(workload, configs):
    """The gate container of a Deployment: hardening, probes, sidecar shape,
    secrets mounted as a directory, grace period longer than shutdown_grace."""
    name = workload["metadata"]["name"]
    pod = workload["spec"]["template"]["spec"]
    init = [c for c in pod.get("initContainers", []) if c["name"] == "hookgate"]
    regular = [c for c in pod.get("containers", []) if c["name"] == "hookgate"]
    need(len(init) + len(regular) == 1, f"Deployment/{name}: expected one hookgate container")
    gate = (init or regular)[0]
    where = f"Deployment/{name} hookgate"
    if init:
        need(gate.get("restartPolicy") == "Always",
             f"{where}: an init container without restartPolicy: Always is not a sidecar")
    sc = gate.get("securityContext") or {}
    need(sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem")
    need(sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation")
    need("ALL" in (sc.get("capabilities") or {}).get("drop", []), f"{where}: capabilities not dropped")
    need(pod_value(pod, gate, "runAsNonRoot") is True, f"{where}: runAsNonRoot")
    need((pod_value(pod, gate, "seccompProfile") or {}).get("type") == "RuntimeDefault",
         f"{where}: seccompProfile")
    ports = {p["name"]: p["containerPort"] for p in gate.get("ports", [])}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (gate.get(probe) or {}).get("httpGet") or {}
        need(get.get("path") == path, f"{where}: {probe} should GET {path}")
        port = ports.get(get.get("port"), get.get("port"))
        need(port == ports.get("admin"), f"{where}: {probe} should use the admin port")
    mounts = {m["mountPath"]: m for m in gate.get("volumeMounts", [])}
    need("/etc/hookgate" in mounts, f"{where}: /etc/hookgate not mounted")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in gate.get("volumeMounts", []):
        if "secret" in volumes.get(m["name"], {}):
            need("subPath" not in m, f"{where}: a Secret mounted with subPath never sees rotation")
    config_volume = volumes[mounts["/etc/hookgate"]["name"]]
    config = configs.get(config_volume.get("configMap", {}).get("name"))
    need(config is not None, f"{where}: its ConfigMap is not in the rendered output")
    server = config.get("server", {})
    grace = seconds(server.get("shutdown_grace", "20s"))
    period = pod.get("terminationGracePeriodSeconds", 30)
    need(period > grace, f"{where}: terminationGracePeriodSeconds {period} <= shutdown_grace {grace}s")
    for key, port_name in (("listen", "http"), ("admin_listen", "admin")):
        port = int(server.get(key, "0.0.0.0:8080" if key == "listen" else "0.0.0.0:9090").rsplit(":", 1)[1])
        need(ports.get(port_name) == port, f"{where}: port {port_name} is not server.{key}")
    store = config.get("store", {})
    if store.get("backend", "sqlite") == "sqlite":
        path = store.get("path", "hookgate.db")
        need(any(path.startswith(p.rstrip("/") + "/") for p in mounts if p != "/etc/hookgate"),
             f"{where}: store.path {path} is not on a mounted volume (the root filesystem is read-only)")
        need(workload["spec"].get("replicas", 1) == 1, f"Deployment/{name}: sqlite with several replicas")
    return ("native sidecar" if init else "container")


def split(rendered, outdir):
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    docs = [d for d in yaml.safe_load_all(Path(rendered).read_text()) if d]
    need(docs, f"{rendered}: nothing rendered")
    resources, seen, skipped, configs = [], [], [], {}
    for doc in docs:
        kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
        need(kind and name, f"{rendered}: a document without kind or name")
        if kind in OPERATOR_KINDS:
            skipped.append(doc)
            continue
        resources.append(doc)
        seen.append(f"{kind}/{name}")
        if kind == "ConfigMap" and "config.toml" in (doc.get("data") or {}):
            text = doc["data"]["config.toml"]
            try:
                configs[name] = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise Failed(f"ConfigMap/{name}: config.toml is not TOML: {e}")
            (outdir / f"{name}.toml").write_text(text)
    # Written before the checks below, so that the other steps still run.
    with open(outdir / "resources.yaml", "w") as f:
        yaml.safe_dump_all(resources, f, sort_keys=False)
    print(f"    resources: {', '.join(seen)}")
    gates = [f"Deployment/{d['metadata']['name']} ({check_gate(d, configs)})"
             for d in resources if d["kind"] == "Deployment"]
    if skipped:
        checked = [check_operator_object(doc) for doc in skipped]
        print(f"    Prometheus Operator objects (checked here, not by kubernetes-validate): {', '.join(checked)}")
    if gates:
        print(f"    gate hardening, probes, ports, grace period: {', '.join(gates)}")
    need(configs, f"{rendered}: no ConfigMap with a config.toml")


# --- secrets -----------------------------------------------------------------

def secrets(config, workdir):
    workdir = Path(workdir)
    text = Path(config).read_text()
    parsed = tomllib.loads(text)
    envs = set()
    for name, provider in parsed.get("providers", {}).items():
        for entry in provider.get("secrets", []):
            source = entry["source"] if isinstance(entry, dict) else entry
            if source.startswith("file:/"):
                stand_in = workdir / "root" / source[len("file:/"):]
                stand_in.parent.mkdir(parents=True, exist_ok=True)
                stand_in.write_text(f"ci-stand-in-for-{name}\n")
                # toJson wrote the source as a JSON string: replace it as one.
                text = text.replace(json.dumps(source), json.dumps(f"file:{stand_in}"))
            elif source.startswith("env:"):
                envs.add(source[len("env:"):])
    (workdir / "config.toml").write_text(text)
    for env in sorted(envs):
        print(f"{env}=ci-stand-in")


# --- roundtrip ---------------------------------------------------------------

def merge(base, override):
    """Helm's coalescing: maps merge, null deletes, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def prune(value):
    if isinstance(value, dict):
        return {k: prune(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune(v) for v in value]
    return value


def roundtrip(config, values_files):
    values = {}
    for path in values_files:
        values = merge(values, yaml.safe_load(Path(path).read_text()) or {})
    expected = {k: prune(values.get(k) or {}) for k in ("server", "upstream", "store", "telemetry", "queue", "providers")}
    if expected["store"].get("backend") != "sqlite":
        expected["store"].pop("path", None)
    if not expected["upstream"].get("url"):
        expected["upstream"]["url"] = f"http://127.0.0.1:{values['app']['port']}"
    got = tomllib.loads(Path(config).read_text())
    got = {k: got.get(k, {}) for k in expected}
    need(got == expected, f"config.toml does not say what the values say:\n  values: {expected}\n  toml:   {got}")
    providers = ", ".join(sorted(expected["providers"])) or "none"
    print(f"    config.toml == values (server, upstream, store, telemetry, queue, providers: {providers})")


# --- monitoring --------------------------------------------------------------

def check_expr(expr, where):
    names = set(re.findall(r"\bhookgate_[a-z_]+", expr))
    need(names, f"{where}: uses no hookgate metric")
    for n in names:
        base = re.sub(r"_(bucket|sum|count)$", "", n)
        need(base in METRICS, f"{where}: unknown metric {n}")
        need(base == n or base in HISTOGRAMS, f"{where}: {n}: not a histogram")
        need(base not in HISTOGRAMS or n != base, f"{where}: use {base}_bucket/_sum/_count")
    allowed = set().union(*(METRICS[re.sub(r'_(bucket|sum|count)$', '', n)] for n in names)) | SCRAPE_LABELS
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in filter(None, (l.strip() for l in group.split(","))):
            need(label in allowed, f"{where}: label {label} is not on {sorted(names)}")
    for selector in re.findall(r"\{([^{}]*)\}", expr):
        for label, value in re.findall(r'([a-z_]+)\s*=~?\s*"([^"]*)"', selector):
            need(label in allowed, f"{where}: label {label} is not on {sorted(names)}")
            if label == "outcome":
                known = RELAY_OUTCOMES if "hookgate_relay_attempts_total" in names else OUTCOMES
                for outcome in value.split("|"):
                    need(outcome in known, f"{where}: unknown outcome {outcome}")


def check_rules(spec, where):
    alerts = []
    for group in spec["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert")
            need(name, f"{where}: a rule without alert")
            at = f"{where} {name}"
            need(rule.get("for"), f"{at}: no `for:` (alerts hold over time, never on single events)")
            on_gauges = set(re.findall(r"\bhookgate_[a-z_]+", rule["expr"])) <= GAUGES
            need(on_gauges or re.search(r"\b(rate|increase)\(", rule["expr"]), f"{at}: not a rate or an increase over a window")
            need(rule.get("labels", {}).get("severity") in {"warning", "critical"}, f"{at}: severity")
            ann = rule.get("annotations", {})
            need(ann.get("summary") and ann.get("description"), f"{at}: summary and description")
            check_expr(rule["expr"], at)
            alerts.append(name)
    need(len(alerts) == len(set(alerts)), f"{where}: duplicate alert names")
    return alerts


def monitoring(alerts_path, dashboard_path):
    alerts = check_rules(yaml.safe_load(Path(alerts_path).read_text()), alerts_path)
    print(f"    {alerts_path}: {len(alerts)} alerts ({', '.join(alerts)})")
    dashboard = json.loads(Path(dashboard_path).read_text())
    panels = dashboard.get("panels", [])
    need(panels and dashboard.get("uid") and dashboard.get("title"), f"{dashboard_path}: not a dashboard")
    used = set()
    for panel in panels:
        need(panel.get("targets"), f"{dashboard_path}: panel {panel.get('title')} has no query")
        for target in panel["targets"]:
            check_expr(target["expr"], f"{dashboard_path} panel {panel['title']!r}")
            used |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"\bhookgate_[a-z_]+", target["expr"])}
    need(used == set(METRICS), f"{dashboard_path}: metrics without a panel: {sorted(set(METRICS) - used)}")
    ids = [p["id"] for p in panels]
    need(len(ids) == len(set(ids)), f"{dashboard_path}: duplicate panel ids")
    print(f"    {dashboard_path}: {len(panels)} panels over all {len(METRICS)} metrics")


def main(argv):
    commands = {
        "split": lambda a: split(*a),
        "secrets": lambda a: secrets(*a),
        "roundtrip": lambda a: roundtrip(a[0], a[1:]),
        "monitoring": lambda a: monitoring(*a),
    }
    if len(argv) < 2 or argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        commands[argv[1]](argv[2:])
    except Failed as e:
        print(f"    FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
