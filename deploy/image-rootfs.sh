#!/usr/bin/env bash
# Lays out the container image's files under OUT, from a static hookgate
# binary: OUT/root is the root filesystem, OUT/data the data directory's
# contents (empty; the Dockerfile copies it to /var/lib/hookgate owned by uid
# 65532, which a COPY of the whole tree would leave to root). Both ways of building the image run this one script, so
# both produce the same files (deploy/Dockerfile explains the two):
#
#   - deploy/Dockerfile's `build` stage (Docker), on the binary it compiles;
#   - deploy/build-image.sh (buildah), on the binary cargo built on the host.
#
# Usage: deploy/image-rootfs.sh BINARY OUT   (run from the repository root)
#
# The tree: the binary, the CA bundle of the machine that runs this (for
# https upstreams, rediss, postgres TLS, OTLP over https), the example config,
# passwd and group entries for uid 65532, the data directory (the volume) and
# an empty /tmp (`hookgate demo` writes there; mount a tmpfs on it when the
# root filesystem is read-only).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BINARY OUT" >&2
  exit 64
fi
bin=$1
out=$2
ca=/etc/ssl/certs/ca-certificates.crt

[ -x "$bin" ] || { echo "$0: $bin is not an executable" >&2; exit 1; }
[ -s "$ca" ] || { echo "$0: no CA bundle at $ca (Debian: apt-get install ca-certificates)" >&2; exit 1; }

rm -rf "$out"
root=$out/root
data=$out/data
install -D -m 0755 "$bin" "$root/usr/local/bin/hookgate"
install -D -m 0644 "$ca" "$root/etc/ssl/certs/ca-certificates.crt"
# In Kubernetes a ConfigMap is mounted over /etc/hookgate.
install -D -m 0644 config.toml "$root/etc/hookgate/config.toml"
# uid 65532 gets a name, so that tools resolving it (ps, id in a debug
# container, log shippers) show one; nothing in the image needs root's entry
# but it is the usual first line.
printf '%s\n' \
  'root:x:0:0:root:/root:/sbin/nologin' \
  'hookgate:x:65532:65532:hookgate:/var/lib/hookgate:/sbin/nologin' \
  >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' 'hookgate:x:65532:' >"$root/etc/group"
chmod 0644 "$root/etc/passwd" "$root/etc/group"
# The data directory, /var/lib/hookgate: the relative store.path of the
# example config ("hookgate.db") lands there, the image's working directory.
# Its parents are root's: the COPY that creates it would give them to 65532.
install -d -m 0755 "$root/var/lib"
install -d -m 0750 "$data"
install -d -m 1777 "$root/tmp"
