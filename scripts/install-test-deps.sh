#!/usr/bin/env bash
# Installs the servers the integration tests start (they start and stop
# them themselves, on free ports): redis-server and PostgreSQL.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# Debian keeps initdb and pg_ctl off PATH, under /usr/lib/postgresql/*/bin.
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1 \
  || missing+=(postgresql)

if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
