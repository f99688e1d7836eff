#!/usr/bin/env bash
# README's quick start, run as written, so that it cannot drift: `hookgate
# demo`, then terminal 1 (`hookgate echo`, the app) and terminal 2, the
# README's own code block taken from README.md and run unchanged (check,
# run, sign, curl twice, keys get, kill). It fails unless the first curl is
# forwarded, the second is a duplicate, the app saw the event once and
# `keys get` says it is completed.
#
# The binary: README builds it with `cargo install --path .`; in CI the
# benchmark's smoke run has just built the same release binary into
# bench/target, so this uses that one instead of a second ten-minute build.
# QUICKSTART_BIN names another (not HOOKGATE_*: the gate would read that as
# configuration). The ports are the README's: 8080, 9090, 3000.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bin=${QUICKSTART_BIN:-}
if [ -z "$bin" ]; then
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-bench/target}
  cargo build --release --bin hookgate >&2
  bin="$CARGO_TARGET_DIR/release/hookgate"
fi
bin=$(realpath "$bin")

work=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/bin"
ln -s "$bin" "$work/bin/hookgate"
export PATH="$work/bin:$PATH"
cp config.toml "$work/"

# Terminal 2's block: the ```sh block that follows "Terminal 2" in README.
python3 - "$root/README.md" > "$work/terminal2.sh" <<'PY'
import sys
text = open(sys.argv[1]).read()
start = text.index("```sh\n", text.index("Terminal 2")) + len("```sh\n")
print(text[start:text.index("```", start)])
PY
grep -q 'hookgate run --config config.toml' "$work/terminal2.sh" || {
  echo "check-quickstart: README's terminal 2 block not found" >&2
  exit 1
}

fail() {
  echo "check-quickstart: $1" >&2
  for f in "$work"/*.out; do echo "--- $f" >&2; cat "$f" >&2; done
  exit 1
}

cd "$work"
hookgate demo > demo.out 2>&1 || fail "hookgate demo failed"
grep -q duplicate demo.out || fail "the demo shows no duplicate"

# Terminal 1: the app.
hookgate echo > echo.out 2>&1 &
for _ in $(seq 100); do
  curl -s -o /dev/null localhost:3000 && break
  sleep 0.1
done

# Terminal 2, as README has it.
bash -e terminal2.sh > terminal2.out 2>&1 || fail "README's terminal 2 block failed"
grep -qi '^hookgate-result: forwarded' terminal2.out || fail "the first delivery was not forwarded"
grep -qi '^hookgate-result: duplicate' terminal2.out || fail "the second delivery was not a duplicate"
grep -q 'completed' terminal2.out || fail "keys get does not say completed"
[ "$(grep -c 'evt_1' echo.out)" -ge 1 ] || fail "the app never saw the event"
calls=$(grep -c '^--- POST /webhooks/stripe' echo.out || true)
[ "$calls" = 1 ] || fail "the app was called $calls times, not once"
echo "check-quickstart: README's quick start works as written (forwarded, duplicate, completed)"
