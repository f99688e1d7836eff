#!/usr/bin/env bash
# Builds the gate with profile-guided optimization (rustc's PGO on LLVM's
# instrumentation profiles), the build that the container image and the
# benchmark's run of record use (docs/BENCHMARKS.md, "Profile-guided
# optimization"):
#
#   1. an instrumented gate (-Cprofile-generate) into $DIR/generate;
#   2. the benchmark's gate rows against it, a few seconds each, on sqlite
#      and redis: fresh events, duplicates, forgeries, mixed, queue mode,
#      256 connections, 1,000 requests/s, the relay's drain;
#   3. their counts merged (llvm-profdata, from rustup's llvm-tools);
#   4. the gate built again with them (-Cprofile-use) into $DIR/use: the
#      paths those rows run optimized for speed, the code they never ran
#      for size.
#
# Written here rather than taken from cargo-pgo: that tool wraps steps 1,
# 3 and 4, a command each here; step 2 is this project's own load
# generator either way.
#
# Prints the optimized binary's path on stdout; the rest goes to stderr.
# The profile is made anew each time and not kept in the repository: it
# matches functions by their symbols, which differ with the compiler's
# version and the target, and a profile that matches nothing is ignored
# without a word. Its file is named by its contents, since cargo does not
# rebuild a crate whose profile changed under the same name.
#
#   scripts/pgo-build.sh                  # the host's target, profile release
#   scripts/pgo-build.sh --target x86_64-unknown-linux-musl --profile image
#
# Needs redis-server (scripts/install-test-deps.sh installs it); builds the
# load generator (bench/, into bench/target) when it is not up to date.
# Environment: CARGO_TARGET_DIR (default target); $DIR is
# $CARGO_TARGET_DIR/pgo, and each step's build keeps its own directory
# there, so a second run rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

HOST=$(rustc -vV | sed -n 's/^host: //p')
TARGET=$HOST
PROFILE=release
while [ $# -gt 0 ]; do
  case "$1" in
    --target) TARGET=${2:?--target needs a target triple}; shift 2 ;;
    --profile) PROFILE=${2:?--profile needs a cargo profile}; shift 2 ;;
    *) echo "usage: $0 [--target TRIPLE] [--profile CARGO_PROFILE]" >&2; exit 2 ;;
  esac
done

command -v redis-server >/dev/null 2>&1 || {
  echo "$0: redis-server is missing (apt-get install redis-server): the training runs the redis rows" >&2
  exit 1
}
TOOLS=$(rustc --print sysroot)/lib/rustlib/$HOST/bin
if [ ! -x "$TOOLS/llvm-profdata" ]; then
  rustup component add llvm-tools >&2
fi

DIR=$(realpath -m "${CARGO_TARGET_DIR:-target}/pgo")
RAW=$DIR/raw
BENCH=bench/target/release/hookgate-bench
mkdir -p "$DIR"

# --target even for the host, so that RUSTFLAGS reach the gate's code and
# not the build scripts and proc macros (which would write counts of their
# own, or find none). The caller's RUSTFLAGS come first.
build() { # build DIR RUSTFLAGS
  RUSTFLAGS="${RUSTFLAGS:-} $2" cargo build --profile "$PROFILE" --target "$TARGET" --bin hookgate \
    --target-dir "$1" >&2
  echo "$1/$TARGET/$PROFILE/hookgate"
}

echo "pgo: 1/4 the instrumented gate ($TARGET, profile $PROFILE)" >&2
instrumented=$(build "$DIR/generate" "-Cprofile-generate=$RAW")
cargo build --release --manifest-path bench/Cargo.toml --bin hookgate-bench --target-dir bench/target >&2

echo "pgo: 2/4 training on the benchmark's gate rows" >&2
rm -rf "$RAW"
# The rows of bench/run.sh that run the gate; the node handler's rows
# (whose labels contain the redis rows') are left out.
"$BENCH" suite --hookgate "$instrumented" --skip node \
  --only "sqlite " --only "redis " --duration 3 --warmup 1 --dup-set 2000 \
  --drain-events 5000 --gate-log-null >/dev/null
shopt -s nullglob
raws=("$RAW"/*.profraw)
if [ ${#raws[@]} -eq 0 ]; then
  echo "$0: the training left no counts in $RAW (did the gate exit cleanly?)" >&2
  exit 1
fi

echo "pgo: 3/4 merging ${#raws[@]} count file(s)" >&2
"$TOOLS/llvm-profdata" merge -o "$DIR/merged.profdata" "${raws[@]}" >&2
PROFDATA=$DIR/hookgate-$(sha256sum "$DIR/merged.profdata" | cut -c1-16).profdata
rm -f "$DIR"/hookgate-*.profdata
mv "$DIR/merged.profdata" "$PROFDATA"

echo "pgo: 4/4 the gate built with the profile" >&2
build "$DIR/use" "-Cprofile-use=$PROFDATA"
