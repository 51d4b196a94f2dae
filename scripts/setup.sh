#!/usr/bin/env bash
# Create .venv and install shardkit with its test and dev tools. torch is pinned first:
# torch==2.13.0 is the CPU wheel on disk; an unpinned torch would download a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# bsdtar and pzstd write part of the tar conformance corpus (tests/helpers/tarcorpus.py;
# without them those tests write the same layouts with Python). Best effort: as root with
# apt-get (a Debian CI machine), and never a failed setup where apt is missing or offline.
if ! command -v bsdtar >/dev/null 2>&1 || ! command -v pzstd >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        libarchive-tools zstd; } >/dev/null 2>&1 ||
      echo "setup.sh: could not install bsdtar and pzstd; tar tests write with Python" >&2
  fi
fi
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Azurite (Azure Blob's emulator) for the az:// tests, from npm into .tools/
if [ ! -x .tools/node_modules/.bin/azurite-blob ]; then
  command -v npm >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq nodejs npm; }
  npm install --silent --no-audit --no-fund --prefix .tools azurite@3
fi
# Installed already from this pyproject.toml and this script: nothing to reinstall.
stamp=.venv/.shardkit-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import shardkit" 2>/dev/null; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# the frameworks extra (transformers, accelerate, lightning) must not move torch off the pin
pin=$(mktemp)
echo "torch==2.13.0" >"$pin"
.venv/bin/python -m pip install -q -c "$pin" -e ".[dev]"
rm -f "$pin"
echo "$want" > "$stamp"
