#!/usr/bin/env bash
# CI: builds the container image (deploy/build-image.sh: static musl binary,
# then buildah, nothing pulled) and runs it with podman the way a cluster
# does: as uid 65532, read-only root filesystem, a tmpfs on /tmp, the data
# volume on /var/lib/hookgate.
#
#   - its size: at most MAX_IMAGE_MIB (15);
#   - `hookgate check` on the bundled config;
#   - `hookgate demo`;
#   - the image's default command (`run` on the bundled config) in front of
#     an app on the host (scripts/check_image_app.py), on the host's network:
#     a delivery signed on the host with `hookgate sign` is forwarded, the
#     same again is a duplicate, the app saw it once, byte for byte, and the
#     sqlite file is on the volume; SIGTERM ends the gate with exit 0; a new
#     container on the same volume still answers duplicate.
#
# Installs what is missing: podman, runc (and what deploy/build-image.sh
# installs). How podman runs here: deploy/ci/containers.sh.
#
# Environment:
#   IMAGE          the tag to build and run (default: hookgate:check)
#   MAX_IMAGE_MIB  the size limit (default: 15)
#   and deploy/build-image.sh's (HOOKGATE_IMAGE_BIN: check an image of a
#   binary built before)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/ci/containers.sh
. deploy/ci/containers.sh

export IMAGE=${IMAGE:-hookgate:check}
MAX_IMAGE_MIB=${MAX_IMAGE_MIB:-15}
PROFILE=${HOOKGATE_IMAGE_PROFILE:-image}
# Where deploy/build-image.sh's binary is (scripts/pgo-build.sh's unless
# HOOKGATE_IMAGE_PGO=0); it signs the check's delivery on the host.
BUILT=${CARGO_TARGET_DIR:-target}
[ "${HOOKGATE_IMAGE_PGO:-1}" != 0 ] && BUILT=$BUILT/pgo/use
HOST_BIN=${HOOKGATE_IMAGE_BIN:-$BUILT/x86_64-unknown-linux-musl/$PROFILE/hookgate}
SECRET=whsec_check_image_$RANDOM$RANDOM

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

install_missing podman=podman runc=runc curl=curl

t0=$(date +%s)
deploy/build-image.sh
t1=$(date +%s)

WORK=$(mktemp -d)
NAME=hookgate-check-$$
VOLUME=hookgate-check-$$
APP_PID=""
cleanup() {
  "${PODMAN[@]}" rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  "${PODMAN[@]}" volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  if [ -n "$APP_PID" ]; then kill "$APP_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# What every container here gets: the user, a read-only root with a tmpfs on
# /tmp (podman adds one by itself; Docker and Kubernetes do not, so it is
# spelled out), the data volume, the host's network.
CONTAINER=(--user 65532:65532 --read-only --read-only-tmpfs=false --tmpfs /tmp
  -v "$VOLUME:/var/lib/hookgate" --network host)

echo "image $IMAGE ($("${PODMAN[@]}" --version), $(runc --version | head -1)):"

# --- size ----------------------------------------------------------------------
bytes=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
if [ "$bytes" -le $((MAX_IMAGE_MIB * 1048576)) ]; then
  pass "size $mib MiB ($bytes bytes), at most $MAX_IMAGE_MIB MiB"
else
  fail "size $mib MiB ($bytes bytes), over $MAX_IMAGE_MIB MiB"
fi
# What is in it: the files of deploy/build-image.sh's context, largest first.
(cd "${CARGO_TARGET_DIR:-target}/image-rootfs/root" && find . -type f -printf '%s %P\n') \
  | sort -rn | awk '{ printf "       %8.1f KiB  /%s\n", $1 / 1024, $2 }'

"${PODMAN[@]}" volume create "$VOLUME" >/dev/null

# --- hookgate check ------------------------------------------------------------
rc=0
out=$("${PODMAN[@]}" run --rm "${CONTAINER[@]}" -e STRIPE_WEBHOOK_SECRET="$SECRET" "$IMAGE" \
  check --config /etc/hookgate/config.toml 2>&1) || rc=$?
if [ "$rc" -eq 0 ] && grep -q '^provider stripe' <<<"$out"; then
  pass "hookgate check on the bundled config: exit 0, provider stripe"
else
  fail "hookgate check on the bundled config: exit $rc"
  indent <<<"$out"
fi

# --- hookgate demo -------------------------------------------------------------
rc=0
out=$("${PODMAN[@]}" run --rm "${CONTAINER[@]}" "$IMAGE" demo 2>&1) || rc=$?
if [ "$rc" -eq 0 ] && grep -q 'again (a retry) *200 *duplicate' <<<"$out" \
  && grep -q 'forged signature *400 *invalid_signature' <<<"$out" \
  && grep -q 'The app received 1 delivery(ies); byte for byte: true' <<<"$out"; then
  pass "hookgate demo: forwarded once, duplicate, forgery refused"
else
  fail "hookgate demo: exit $rc"
  indent <<<"$out"
fi

# --- a delivery through the gate in the container to an app on the host ---------
python3 scripts/check_image_app.py "$WORK/app.port" "$WORK/app.log" &
APP_PID=$!
for _ in $(seq 100); do
  [ -s "$WORK/app.port" ] && break
  sleep 0.1
done
APP_PORT=$(cat "$WORK/app.port")
read -r GATE_PORT ADMIN_PORT < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))')

# start_gate: the image's default command, `run --config
# /etc/hookgate/config.toml`, on free loopback ports, in front of the app.
start_gate() {
  "${PODMAN[@]}" run -d --name "$NAME" "${CONTAINER[@]}" \
    -e STRIPE_WEBHOOK_SECRET="$SECRET" \
    -e HOOKGATE_SERVER__LISTEN="127.0.0.1:$GATE_PORT" \
    -e HOOKGATE_SERVER__ADMIN_LISTEN="127.0.0.1:$ADMIN_PORT" \
    -e HOOKGATE_UPSTREAM__URL="http://127.0.0.1:$APP_PORT" \
    "$IMAGE" >/dev/null
  for _ in $(seq 150); do
    curl -sf "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null 2>&1 && return 0
    [ "$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$NAME")" = true ] || break
    sleep 0.2
  done
  "${PODMAN[@]}" logs "$NAME" 2>&1 | tail -20 | indent
  return 1
}

# stop_gate: SIGTERM, as a cluster stops a pod; the exit status.
stop_gate() {
  "${PODMAN[@]}" stop -t 30 "$NAME" >/dev/null
  "${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$NAME"
  "${PODMAN[@]}" rm "$NAME" >/dev/null
}

# deliver N: POST the signed event; sets status and result.
deliver() {
  local n=$1
  status=$(curl -s -o "$WORK/answer.$n" -D "$WORK/headers.$n" -w '%{http_code}' \
    -H "$SIG" -H 'Content-Type: application/json' --data-binary @"$WORK/event.json" \
    "http://127.0.0.1:$GATE_PORT/webhooks/stripe") || status=000
  result=$(tr -d '\r' <"$WORK/headers.$n" | awk -F': ' 'tolower($1) == "hookgate-result" { print $2 }')
}

event_id=evt_image_$RANDOM$RANDOM
printf '{"id":"%s","object":"event","type":"invoice.paid"}' "$event_id" >"$WORK/event.json"
# Signed on the host, with the binary the image holds (it is static) and the
# same config and secret: the header a real sender would attach.
SIG=$(env -i PATH="$PATH" STRIPE_WEBHOOK_SECRET="$SECRET" \
  "$HOST_BIN" sign --config config.toml --provider stripe --body "$WORK/event.json")

if start_gate; then
  pass "hookgate run (the default command) is ready, on the host's network"
  deliver 1
  if [ "$status" = 200 ] && [ "$result" = forwarded ]; then
    pass "signed delivery: 200 forwarded"
  else
    fail "signed delivery: $status ${result:-no Hookgate-Result}"
    indent <"$WORK/answer.1"
  fi
  deliver 2
  if [ "$status" = 200 ] && [ "$result" = duplicate ]; then
    pass "the same delivery again: 200 duplicate"
  else
    fail "the same delivery again: $status ${result:-no Hookgate-Result}"
    indent <"$WORK/answer.2"
  fi
  if python3 - "$WORK/app.log" "$WORK/event.json" "stripe:$event_id" <<'EOF'; then
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
body = open(sys.argv[2], "rb").read().hex()
ok = (len(records) == 1 and records[0]["body"] == body
      and records[0]["path"] == "/webhooks/stripe"
      and records[0]["hookgate"].get("hookgate-event-key") == sys.argv[3])
sys.exit(0 if ok else 1)
EOF
    pass "the app got it once, byte for byte, with Hookgate-Event-Key stripe:$event_id"
  else
    fail "the app's requests"
    indent <"$WORK/app.log"
  fi
  db=$("${PODMAN[@]}" volume inspect --format '{{.Mountpoint}}' "$VOLUME")/hookgate.db
  if [ "$(stat -c %u "$db" 2>/dev/null)" = 65532 ]; then
    pass "the sqlite file is on the volume, owned by 65532"
  else
    fail "no hookgate.db of uid 65532 on the volume"
    find "$(dirname "$db")" -printf '%M %U:%G %p\n' 2>&1 | indent
  fi
  code=$(stop_gate)
  if [ "$code" = 0 ]; then
    pass "SIGTERM: exit 0"
  else
    fail "SIGTERM: exit $code"
  fi
  if start_gate; then
    deliver 3
    if [ "$status" = 200 ] && [ "$result" = duplicate ]; then
      pass "a new container on the same volume: 200 duplicate"
    else
      fail "a new container on the same volume: $status ${result:-no Hookgate-Result}"
    fi
    stop_gate >/dev/null
  else
    fail "the second container did not get ready"
  fi
else
  fail "hookgate run did not get ready on 127.0.0.1:$ADMIN_PORT"
fi
t2=$(date +%s)

echo
if [ "$failed" -gt 0 ]; then
  echo "failed:"
  printf '  %s\n' "${failures[@]}"
fi
echo "image build $((t1 - t0)) s, container checks $((t2 - t1)) s"
echo "check-image: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
