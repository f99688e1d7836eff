#!/usr/bin/env bash
# Fuzz in CI: every cargo-fuzz target for FUZZ_SECONDS seconds (default 20),
# after one build of them all, so that each target's time is fuzzing only.
#
# Each run starts from the checked-in corpus (fuzz/corpus/<target>/, read as
# seeds only) and writes what it finds into a scratch directory that is
# thrown away, so the checked-in corpus is not flooded. A crash, leak,
# timeout or out-of-memory input is copied into fuzz/corpus/<target>/ and the
# script fails: fix the bug and commit that input with the fix, so that the
# corpus replay (`cargo test --test it fuzz_corpus`) keeps it fixed.
#
# cargo-fuzz needs a nightly compiler; RUSTC_BOOTSTRAP=1 lets a stable one
# stand in (docs/RELIABILITY.md, "Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${FUZZ_SECONDS:-20}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

started=$SECONDS
mapfile -t targets < <(cargo fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
  echo "fuzz-ci: cargo fuzz list found no target" >&2
  exit 1
fi

echo "fuzz-ci: building ${#targets[@]} targets"
cargo fuzz build
built=$SECONDS
echo "fuzz-ci: built in $((built - started)) s"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

summary=()
failed=()
for target in "${targets[@]}"; do
  mkdir -p "$scratch/$target" "corpus/$target"
  log="$scratch/$target.log"
  echo "fuzz-ci: $target for $seconds s"
  status=ok
  if ! cargo fuzz run "$target" "$scratch/$target" "corpus/$target" -- \
      -max_total_time="$seconds" >"$log" 2>&1; then
    status=FAILED
  fi
  # libFuzzer ends a completed run with "Done N runs in S second(s)"; a run
  # cut short by a crash has only its "#N ..." progress lines.
  runs="$(sed -n 's/^Done \([0-9]*\) runs in.*/\1/p' "$log" | tail -n 1)"
  if [ -z "$runs" ]; then
    runs="$(sed -n 's/^#\([0-9]*\)[[:space:]].*/\1/p' "$log" | tail -n 1)"
  fi
  cov="$(sed -n 's/.* cov: \([0-9]*\) .*/\1/p' "$log" | tail -n 1)"
  new="$(find "$scratch/$target" -type f | wc -l)"
  line="$(printf '%-20s %-6s %12s runs  cov %5s  new inputs %5s' \
    "$target" "$status" "${runs:-?}" "${cov:-?}" "$new")"
  if [ "$status" != ok ]; then
    echo "---- $target failed: ----" >&2
    grep -a -m 1 -A 3 -E 'panicked at|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' \
      "$log" >&2 || tail -n 40 "$log" >&2
    # libFuzzer names each input it saves (crash-, leak-, timeout-, oom-
    # under fuzz/artifacts/<target>/) on a "Test unit written to" line.
    found="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log")"
    if [ -z "$found" ]; then
      # The run failed without leaving an input (a build or setup error).
      line="$line  (no input left; see the log above)"
    fi
    while IFS= read -r input; do
      [ -n "$input" ] || continue
      cp "$input" "corpus/$target/"
      line="$line  -> fuzz/corpus/$target/$(basename "$input")"
    done <<<"$found"
    failed+=("$target")
  fi
  summary+=("$line")
done

echo
echo "fuzz-ci: $seconds s per target; build $((built - started)) s, total $((SECONDS - started)) s"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo
  echo "fuzz-ci: ${failed[*]} failed. Each input that failed is now in fuzz/corpus/<target>/" >&2
  echo "(named above); reproduce with" >&2
  echo "  cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run <target> corpus/<target>/<file>" >&2
  echo "then fix the bug and commit the input with the fix: the corpus replay" >&2
  echo "(cargo test --test it fuzz_corpus) fails on it until then." >&2
  exit 1
fi
