# shellcheck shell=bash
# Sourced by serve.sh and test.sh: create (once) and activate the project-local virtual environment .venv, so
# nothing is installed into the system Python. pip inside it reads the same configuration as outside (the global
# and user pip.conf files and PIP_* variables; only a pip.conf inside .venv would be specific to it).
# KVSTRATA_PYTHON picks the interpreter (default python3, which must be 3.11 or newer).
_kvstrata_python="${KVSTRATA_PYTHON:-python3}"
_kvstrata_venv="$(pwd)/.venv"

_kvstrata_venv_ok() {
  [ -x "$_kvstrata_venv/bin/python" ] && "$_kvstrata_venv/bin/python" -m pip --version >/dev/null 2>&1
}

if ! _kvstrata_venv_ok; then
  rm -rf "$_kvstrata_venv"
  if ! "$_kvstrata_python" -m venv "$_kvstrata_venv" >/dev/null 2>&1; then
    # Debian ships venv (ensurepip) separately from python3.
    rm -rf "$_kvstrata_venv"
    if command -v apt-get >/dev/null 2>&1; then
      _kvstrata_sudo=""
      if [ "$(id -u)" != "0" ]; then _kvstrata_sudo="sudo"; fi
      export DEBIAN_FRONTEND=noninteractive
      $_kvstrata_sudo apt-get update -qq
      $_kvstrata_sudo apt-get install -y -qq python3-venv >/dev/null
    fi
    "$_kvstrata_python" -m venv "$_kvstrata_venv"
  fi
fi
# shellcheck source=/dev/null
. "$_kvstrata_venv/bin/activate"
