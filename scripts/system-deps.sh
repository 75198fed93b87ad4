#!/usr/bin/env bash
# Debian packages the test suite needs: python3-venv (for the project's .venv), redis-server/redis-tools (the
# Redis peer, redis-cli, redis-benchmark, and the Redis Cluster for the pool tests), chromium (the dashboard
# test), prometheus (promtool for the alert rules), gcc and python3-dev (the client's native copy helper and the
# predictor's extension module, compiled by `pip install -e .`), and valkey-server 8 from bookworm-backports (the pool tests run against it with
# KVSTRATA_POOL_SERVER=valkey-server; skipped where backports cannot be reached). Installs only what is missing;
# as root directly, otherwise through sudo.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

missing=()
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)  # for the project's .venv
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ command -v redis-cli >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1; } || missing+=(redis-tools)
command -v chromium >/dev/null 2>&1 || missing+=(chromium fonts-dejavu-core)
# gcc: `pip install -e .` compiles the client's native copy helper (hatch_build.py); without it, numpy copies.
command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
# Python.h: `pip install -e .` also compiles the predictor's extension module; without the headers the predictor
# runs in Python.
python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    >/dev/null 2>&1 || missing+=(python3-dev)
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
# Valkey 8 (the pool tests' second server): Debian bookworm has it only in bookworm-backports.
if ! command -v valkey-server >/dev/null 2>&1; then
  if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # The same Debian mirror the machine already uses, with the backports suite added.
    mirror=$(sed -n 's|^URIs: *\([^ ]*/debian\)/*$|\1|p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    if [ -n "$mirror" ]; then
      echo "deb $mirror bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
      $SUDO apt-get update -qq || true
    fi
  fi
  if $SUDO apt-get install -y -qq -t bookworm-backports --no-install-recommends valkey-server >/dev/null; then
    if command -v service >/dev/null 2>&1; then $SUDO service valkey-server stop >/dev/null 2>&1 || true; fi
  else
    echo "valkey-server (bookworm-backports) not installable here; the pool tests run against Redis only" >&2
  fi
fi
