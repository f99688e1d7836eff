#!/usr/bin/env bash
# The benchmark in one command: installs nginx, redis-server and Node.js
# when missing (Debian packages) and the node rows' packages (bench/node,
# with npm), builds the gate and the load generator in release mode, then
# runs every row side by side on this machine and prints markdown tables
# (docs/BENCHMARKS.md explains them).
#
#   bench/run.sh                  # the run of record: every row, then the
#                                 # rows the targets are judged on twice
#                                 # more (--target-rounds 3: each target on
#                                 # its median), about 10 minutes of rows,
#                                 # on the profile-guided build (below)
#   bench/run.sh --smoke          # CI: every row for 1 s (drain rows: 500
#                                 # events), no timing asserted
#   bench/run.sh --duration 30 --only "sqlite fresh"   # one kind of row
#   bench/run.sh --only queue     # queue mode: accepts, and the relay's drain
#   bench/run.sh --instructions --duration 5 --warmup 1 --dup-set 1000 \
#     --only "sqlite duplicate c64"   # the gate's instructions per request
#                                     # (callgrind; needs valgrind)
#   bench/run.sh --help           # every option of `hookgate-bench suite`
#
# Arguments go to `hookgate-bench suite`. The gate's stdout (one JSON line
# per delivery, at the default `info` filter) goes to a file in the run's
# temporary directory; `--gate-log-null` sends it to /dev/null instead.
set -euo pipefail
cd "$(dirname "$0")/.."

# Without arguments, the run of record: one run's nginx can differ by a
# tenth from the next one's on a shared machine, more than some targets'
# margins, so each target is judged on three rounds of its rows.
if [ $# -eq 0 ]; then
  set -- --target-rounds 3
fi

nginx_bin() {
  command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; }
}

missing=()
nginx_bin >/dev/null || missing+=(nginx)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # policy-rc.d may refuse to start the packaged service; the bench starts
  # its own nginx on a free port either way.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "bench/run.sh: $tool is missing after the install (Debian packages nodejs and npm); the node rows need it" >&2
    exit 1
  fi
done
# The node rows' handler needs stripe and redis at the versions its
# package.json pins; no lock file is kept (like the gate's Cargo.lock).
node_packages_ok() {
  (cd bench/node && node -e '
    const deps = require("./package.json").dependencies;
    for (const [name, want] of Object.entries(deps)) {
      if (require(`./node_modules/${name}/package.json`).version !== want) process.exit(1);
    }') >/dev/null 2>&1
}
if ! node_packages_ok; then
  echo "installing the node rows' packages into bench/node/node_modules" >&2
  (cd bench/node && npm install --no-package-lock --no-audit --no-fund >&2)
  node_packages_ok || { echo "bench/run.sh: bench/node/node_modules lacks the pinned packages after npm install" >&2; exit 1; }
fi

# Both builds share bench/target (the bench mirrors the gate's release
# profile, so every dependency is compiled once) and leave target/ alone.
# The gate measured is the one the image ships: built with profile-guided
# optimization (scripts/pgo-build.sh: two full builds and about 2.5
# minutes of training, some 15 minutes the first time). The smoke run,
# --help and HOOKGATE_BENCH_PGO=0 take the plain release build.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-bench/target}
case " $* " in
  *" --smoke "* | *" --help "* | *" -h "*) HOOKGATE_BENCH_PGO=0 ;;
esac
echo "building release binaries into $CARGO_TARGET_DIR" >&2
cargo build --release --manifest-path bench/Cargo.toml --bin hookgate-bench >&2
if [ "${HOOKGATE_BENCH_PGO:-1}" != 0 ]; then
  gate=$(scripts/pgo-build.sh)
  build="release, profile-guided"
else
  cargo build --release --bin hookgate >&2
  gate="$CARGO_TARGET_DIR/release/hookgate"
  build="release"
fi

echo "hookgate $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')$(git diff --quiet HEAD -- src 2>/dev/null || echo ' with local changes in src/') ($build), $("$(nginx_bin)" -v 2>&1), $(redis-server --version | cut -d' ' -f1-3), node $(node --version)" >&2
exec "$CARGO_TARGET_DIR/release/hookgate-bench" suite \
  --hookgate "$gate" \
  --nginx "$(nginx_bin)" \
  --node "$(command -v node)" \
  --node-handler bench/node/handler.js \
  "$@"
