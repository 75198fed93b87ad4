#!/usr/bin/env bash
# Debian packages the test suite needs: python3-venv (for the project's .venv), redis-server/redis-tools (the
# Redis peer, redis-cli, redis-benchmark, and the Redis Cluster for the pool tests), chromium (the dashboard
# test) and prometheus (promtool for the alert rules). Installs only what is missing; as root directly,
# otherwise through sudo.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

missing=()
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)  # for the project's .venv
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ command -v redis-cli >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1; } || missing+=(redis-tools)
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
prometheus=0
command -v promtool >/dev/null 2>&1 || prometheus=1

if [ ${#missing[@]} -gt 0 ] || [ "$prometheus" = 1 ]; then
  $SUDO apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; fi
  if [ "$prometheus" = 1 ]; then $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; fi
  # Freshly installed packages may start services on their default ports; the tests start their own servers on
  # free ports and need none of them.
  if command -v service >/dev/null 2>&1; then
    $SUDO service redis-server stop >/dev/null 2>&1 || true
    $SUDO service prometheus stop >/dev/null 2>&1 || true
  fi
fi
