# shellcheck shell=bash disable=SC2034  # the arrays are for the scripts that source this
# Sourced by deploy/build-image.sh and scripts/check-image.sh: how buildah and
# podman run on this project's machines, in one place so both use the same
# image store.
#
#   HOOKGATE_CONTAINERS_DIR  the image store (default: target/containers, so
#                            it is private to this work tree; nothing in it is
#                            pulled, every image there is built here)

CONTAINERS_DIR=${HOOKGATE_CONTAINERS_DIR:-${CARGO_TARGET_DIR:-target}/containers}
mkdir -p "$CONTAINERS_DIR"
CONTAINERS_DIR=$(cd "$CONTAINERS_DIR" && pwd)
# cgroupfs and no default ulimits (see the file).
CONTAINERS_CONF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/containers.conf
export CONTAINERS_CONF
# vfs: overlay mounts fail in these machines' containers. runc: crun fails.
STORAGE_OPTS=(--storage-driver vfs --root "$CONTAINERS_DIR/storage" --runroot "$CONTAINERS_DIR/run")
BUILDAH=(buildah "${STORAGE_OPTS[@]}")
PODMAN=(podman "${STORAGE_OPTS[@]}" --runtime runc)

# install_missing COMMAND=PACKAGE...: apt-get install the Debian packages of
# the commands that are not on PATH (as scripts/install-test-deps.sh does).
install_missing() {
  local pair missing=()
  for pair in "$@"; do
    command -v "${pair%%=*}" >/dev/null 2>&1 || missing+=("${pair#*=}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  fi
}
