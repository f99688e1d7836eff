#!/usr/bin/env bash
# Builds the container image without Docker and without pulling anything:
#
#   1. the static binary on this machine: cargo, target
#      x86_64-unknown-linux-musl, profile `image` (Cargo.toml), built with
#      profile-guided optimization (scripts/pgo-build.sh);
#   2. the image's files from it: deploy/image-rootfs.sh, into
#      target/image-rootfs;
#   3. the image: buildah on deploy/Dockerfile with that directory as the
#      build context and ROOTFS_FROM=prebuilt, so every stage starts FROM
#      scratch and the runtime stage is the one `docker build` uses too.
#
# Installs what is missing: musl-tools and buildah (Debian packages), the
# rustup target. Run from anywhere; prints the image's size at the end.
#
# Environment:
#   IMAGE                    the tag (default: hookgate:dev)
#   HOOKGATE_IMAGE_PROFILE   the cargo profile (default: image; `release`
#                            gives the fat-LTO binary, slower to build)
#   HOOKGATE_CONTAINERS_DIR  the image store (deploy/ci/containers.sh)
#   HOOKGATE_IMAGE_BIN       a static binary built before: skips step 1
#   HOOKGATE_IMAGE_PGO       0: a plain build in step 1 instead of the
#                            profile-guided one (scripts/pgo-build.sh: an
#                            instrumented build, the benchmark's gate rows
#                            run against it, then the build with the profile;
#                            needs redis-server, installed when missing)
#
# Then, for example (scripts/check-image.sh does this and more):
#   podman --storage-driver vfs --root target/containers/storage \
#     --runroot target/containers/run --runtime runc run --rm hookgate:dev demo
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=deploy/ci/containers.sh
. deploy/ci/containers.sh

IMAGE=${IMAGE:-hookgate:dev}
PROFILE=${HOOKGATE_IMAGE_PROFILE:-image}
TARGET=x86_64-unknown-linux-musl
PGO=${HOOKGATE_IMAGE_PGO:-1}
BIN=${HOOKGATE_IMAGE_BIN:-${CARGO_TARGET_DIR:-target}/$TARGET/$PROFILE/hookgate}
CONTEXT=${CARGO_TARGET_DIR:-target}/image-rootfs

t0=$(date +%s)
if [ -z "${HOOKGATE_IMAGE_BIN:-}" ]; then
  install_missing musl-gcc=musl-tools buildah=buildah
  if ! rustup target list --installed | grep -qx "$TARGET"; then
    rustup target add "$TARGET"
  fi
  # musl-gcc compiles the C in the dependencies (the bundled SQLite, ring,
  # mimalloc).
  export CC_x86_64_unknown_linux_musl=musl-gcc
  if [ "$PGO" != 0 ]; then
    install_missing redis-server=redis-server
    BIN=$(scripts/pgo-build.sh --target "$TARGET" --profile "$PROFILE")
  else
    cargo build --profile "$PROFILE" --target "$TARGET" --bin hookgate
  fi
else
  install_missing buildah=buildah
fi
t1=$(date +%s)
if readelf -lW "$BIN" | grep -q 'program interpreter'; then
  echo "$BIN is dynamically linked: the image has no libc" >&2
  exit 1
fi

deploy/image-rootfs.sh "$BIN" "$CONTEXT"
"${BUILDAH[@]}" bud --quiet -f deploy/Dockerfile --build-arg ROOTFS_FROM=prebuilt \
  -t "$IMAGE" "$CONTEXT" >/dev/null
# buildah 1.28 leaves a working container behind for the `rootfs` stage;
# then the `prebuilt` stage's image and a previous build under the same tag
# can go. The store is this script's own (deploy/ci/containers.sh).
"${BUILDAH[@]}" rm --all >/dev/null
"${BUILDAH[@]}" rmi --prune >/dev/null
t2=$(date +%s)

echo "built $IMAGE: binary $(du -k "$BIN" | cut -f1) KiB (profile $PROFILE, pgo $PGO, built in $((t1 - t0)) s)," \
  "image $("${BUILDAH[@]}" images --format '{{.Size}}' "$IMAGE") (buildah $((t2 - t1)) s)"
