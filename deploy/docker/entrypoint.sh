#!/usr/bin/env bash
# Entry point of the kvstrata container image (see docs/deploy.md).
#
#   entrypoint.sh [kvstrata] serve [FLAGS...]   run the server (the default command is `serve`)
#   entrypoint.sh --port=6379 ...               flags alone: the same as `serve --port=6379 ...`
#   entrypoint.sh healthcheck                   exit 0 when the server answers PING (used by HEALTHCHECK)
#   entrypoint.sh [kvstrata] bench|top|version  other kvstrata commands, as they are
#   entrypoint.sh CMD ...                       anything else is executed as it is (e.g. bash)
#
# Environment, read here or by the server itself (flags given on the command line win):
#   DRAM_SIZE      DRAM tier budget (512mb, 4G...). Unset: half the container's memory limit (cgroup), else the
#                  server's default (a quarter of RAM, at most 4 GiB)
#   ESSD_PATH      SSD tier directory (default /data/essd in the image: the /data volume); empty: no SSD tier
#   ESSD_SIZE      SSD tier budget (default 16G)
#   HBM_SIZE       GPU tier budget (kept in the configuration; the server itself has no GPU tier)
#   REQUIREPASS / REQUIREPASS_FILE (or KVSTRATA_REQUIREPASS[_FILE])  password; the _FILE form reads a secret file
#   KVSTRATA_BIND  listen address (default 0.0.0.0 here; the server alone defaults to loopback)
#   KVSTRATA_PORT  RESP port (default 6379)
#   KVSTRATA_*     any other server parameter (KVSTRATA_HTTP_PORT, KVSTRATA_EVICTION_POLICY, ...)
#   KVSTRATA_DRY_RUN=1 (or --dry-run anywhere in the arguments): print the command and the settings, run nothing
set -euo pipefail

PYTHON="${KVSTRATA_PYTHON:-python3}"

die() { echo "kvstrata-entrypoint: $*" >&2; exit 2; }

# First value found among the named variables (empty when none is set).
first_set() {
  local name
  for name in "$@"; do
    if [[ -n "${!name:-}" ]]; then printf '%s' "${!name}"; return 0; fi
  done
}

has_flag() {  # has_flag NAME ARGS...: is --NAME or --NAME=... among ARGS?
  local name="$1" a
  shift
  for a in "$@"; do
    [[ "$a" == "--$name" || "$a" == "--$name="* ]] && return 0
  done
  return 1
}

# The password: a secret file wins over a plain variable. Exported as KVSTRATA_REQUIREPASS so that it never
# appears on a command line (ps).
load_password() {
  local file
  file="$(first_set REQUIREPASS_FILE KVSTRATA_REQUIREPASS_FILE)"
  if [[ -n "$file" ]]; then
    [[ -r "$file" ]] || die "password file $file is not readable"
    KVSTRATA_REQUIREPASS="$(head -n 1 "$file" | tr -d '\r\n')"
  else
    KVSTRATA_REQUIREPASS="$(first_set KVSTRATA_REQUIREPASS REQUIREPASS)"
  fi
  if [[ -n "$KVSTRATA_REQUIREPASS" ]]; then export KVSTRATA_REQUIREPASS; else unset KVSTRATA_REQUIREPASS; fi
  unset REQUIREPASS
}

# Memory limit of this container in bytes (cgroup v2, then v1), or nothing when unlimited or unknown.
cgroup_memory_limit() {
  local f v
  for f in "${KVSTRATA_CGROUP_MEMORY_FILE:-}" /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do
    [[ -n "$f" && -r "$f" ]] || continue
    v="$(tr -d '[:space:]' < "$f")"
    # "max" (v2) or a huge number (v1, 2^63 rounded to the page size) mean no limit.
    if [[ "$v" =~ ^[0-9]+$ ]] && (( ${#v} < 16 )); then printf '%s' "$v"; fi
    return 0
  done
}

healthcheck() {
  load_password
  local port="${KVSTRATA_PORT:-6379}"
  exec "$PYTHON" - "$port" <<'PY'
import os, socket, sys

port = int(sys.argv[1])
password = os.environ.get("KVSTRATA_REQUIREPASS")
try:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.settimeout(3)
        out = b""
        if password:
            p = password.encode()
            out += b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(p), p)
        s.sendall(out + b"*1\r\n$4\r\nPING\r\n")
        data = b""
        while data.count(b"\r\n") < (2 if password else 1):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
except OSError as exc:
    print(f"unhealthy: {exc}", file=sys.stderr)
    sys.exit(1)
if data.rstrip().endswith(b"+PONG"):
    sys.exit(0)
print(f"unhealthy: {data[:200]!r}", file=sys.stderr)
sys.exit(1)
PY
}

serve() {
  local args=() dry="${KVSTRATA_DRY_RUN:-}" a
  for a in "$@"; do
    if [[ "$a" == "--dry-run" ]]; then dry=1; else args+=("$a"); fi
  done
  load_password

  # Listen on every interface of the container unless told otherwise (the image's network is the boundary).
  if ! has_flag bind "${args[@]+"${args[@]}"}"; then
    args=(--bind "${KVSTRATA_BIND:-0.0.0.0}" "${args[@]+"${args[@]}"}")
  fi
  if ! has_flag port "${args[@]+"${args[@]}"}" && [[ -n "${KVSTRATA_PORT:-}" ]]; then
    args+=(--port "$KVSTRATA_PORT")
  fi
  # The HTTP endpoint (/metrics, dashboard) may leave loopback only with a password (the server insists).
  if ! has_flag http-bind "${args[@]+"${args[@]}"}" && [[ -z "${KVSTRATA_HTTP_BIND:-}" ]]; then
    if [[ -n "${KVSTRATA_REQUIREPASS:-}" ]]; then
      args+=(--http-bind 0.0.0.0)
    else
      args+=(--http-bind 127.0.0.1)
    fi
  fi
  # DRAM budget from the container's memory limit when DRAM_SIZE is not given.
  local dram_source="DRAM_SIZE"
  if has_flag dram-size "${args[@]+"${args[@]}"}" || has_flag maxmemory "${args[@]+"${args[@]}"}"; then
    dram_source="command line"
  elif [[ -z "${DRAM_SIZE:-}${KVSTRATA_DRAM_SIZE:-}" ]]; then
    local limit
    limit="$(cgroup_memory_limit)"
    if [[ -n "$limit" ]]; then
      export DRAM_SIZE=$(( limit / 2 ))
      dram_source="half the container memory limit ($limit bytes)"
    else
      dram_source="server default"
    fi
  fi
  # The SSD tier directory must exist and be writable by this (non-root) user.
  local essd="${ESSD_PATH-}"
  if [[ -n "${KVSTRATA_ESSD_PATH:-}" ]]; then essd="$KVSTRATA_ESSD_PATH"; fi
  if [[ -n "$essd" && -z "$dry" ]]; then
    mkdir -p "$essd" 2>/dev/null || die "cannot create ESSD_PATH $essd"
    [[ -w "$essd" ]] || die "ESSD_PATH $essd is not writable by uid $(id -u) (check the volume's owner)"
  fi

  local cmd=("$PYTHON" -m kvstrata serve "${args[@]}")
  if [[ -n "$dry" ]]; then
    printf 'command:'; printf ' %q' "${cmd[@]}"; printf '\n'
    printf 'DRAM_SIZE=%s (%s)\n' "${DRAM_SIZE:-${KVSTRATA_DRAM_SIZE:-}}" "$dram_source"
    printf 'ESSD_PATH=%s\n' "$essd"
    printf 'ESSD_SIZE=%s\n' "${ESSD_SIZE:-${KVSTRATA_ESSD_SIZE:-}}"
    printf 'HBM_SIZE=%s\n' "${HBM_SIZE:-${KVSTRATA_HBM_SIZE:-}}"
    printf 'requirepass=%s\n' "$([[ -n "${KVSTRATA_REQUIREPASS:-}" ]] && echo set || echo unset)"
    exit 0
  fi
  exec "${cmd[@]}"
}

main() {
  if [[ $# -gt 0 && "$1" == "kvstrata" ]]; then shift; fi
  if [[ $# -eq 0 ]]; then serve; fi
  case "$1" in
    serve) shift; serve "$@" ;;
    healthcheck) healthcheck ;;
    bench|top|version|--version|help|--help|-h) exec "$PYTHON" -m kvstrata "$@" ;;
    -*) serve "$@" ;;
    *) exec "$@" ;;
  esac
}

main "$@"
