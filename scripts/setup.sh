#!/usr/bin/env bash
# Create .venv and install shardkit into it.
#   bash scripts/setup.sh runtime   torch and shardkit's core dependencies (what demo.sh needs)
#   bash scripts/setup.sh dev       (the default) also the test and dev tools, every optional
#                                   backend, Azurite from npm and bsdtar/pzstd (best effort)
#   bash scripts/setup.sh PROFILE --check   exit 0 if .venv holds PROFILE already, else 1
# torch is pinned first: torch==2.13.0 is the CPU wheel on disk; an unpinned torch would
# download a CUDA build. A second run with the same pyproject.toml and this script installs
# nothing; a runtime venv asked for dev is upgraded (dev holds all of runtime).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-dev}
check=${2:-}
case "$profile:$check" in
runtime: | dev: | runtime:--check | dev:--check) ;;
*)
  echo "usage: bash scripts/setup.sh [runtime|dev] [--check]" >&2
  exit 2
  ;;
esac

# The stamp says which profile was installed from which pyproject.toml and script.
stamp=.venv/.shardkit-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
installed() {
  [ -x .venv/bin/python ] && .venv/bin/python -c "import shardkit" 2>/dev/null || return 1
  [ "$have" = "dev $want" ] && return 0
  [ "$profile" = runtime ] && [ "$have" = "runtime $want" ]
}

if [ -n "$check" ]; then
  installed
  exit
fi

# The dev profile's system tools go beside pip (they wait on the network, not the CPU):
# bsdtar and pzstd write part of the tar conformance corpus (tests/helpers/tarcorpus.py;
# without them those tests write the same layouts with Python): best effort, as root with
# apt-get (a Debian CI machine), never a failed setup where apt is missing or offline.
# Azurite (Azure Blob's emulator) for the az:// tests, from npm into .tools/: required.
dev_tools() {
  local apt=0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then apt=1; fi
  local want_pkgs=""
  if ! command -v bsdtar >/dev/null 2>&1 || ! command -v pzstd >/dev/null 2>&1; then
    want_pkgs="libarchive-tools zstd"
  fi
  if ! command -v npm >/dev/null 2>&1; then want_pkgs="$want_pkgs nodejs npm"; fi
  if [ -n "$want_pkgs" ] && [ "$apt" = 1 ]; then
    # shellcheck disable=SC2086 # a list of package names
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $want_pkgs; } \
      >/dev/null 2>&1 || echo "setup.sh: could not install $want_pkgs with apt-get" >&2
  fi
  if [ ! -x .tools/node_modules/.bin/azurite-blob ]; then
    if ! command -v npm >/dev/null 2>&1; then
      echo "setup.sh: npm is missing (install Node.js and npm): Azurite, which the az:// tests" \
        "need, comes from npm" >&2
      return 1
    fi
    npm install --silent --no-audit --no-fund --prefix .tools azurite@3
  fi
}
tools_pid=""
if [ "$profile" = dev ]; then
  dev_tools &
  tools_pid=$!
fi
wait_tools() {
  if [ -n "$tools_pid" ]; then
    wait "$tools_pid"
  fi
}

if installed; then
  wait_tools
  exit 0
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# the frameworks extra (transformers, accelerate, lightning) must not move torch off the pin
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
echo "torch==2.13.0" >"$pin"
if [ "$profile" = runtime ]; then
  echo "setup.sh: installing torch 2.13.0 (CPU wheel, ~190 MB unpacked to ~700 MB) and" \
    "shardkit's core dependencies into .venv: about a minute the first time, nothing after." >&2
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -c "$pin" -e .
else
  echo "setup.sh: installing torch 2.13.0 and shardkit with its test and dev tools (ray," \
    "transformers, lightning, moto, ...) into .venv: several minutes the first time." >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -c "$pin" -e ".[dev]"
fi
echo "$profile $want" >"$stamp"
wait_tools
