#!/usr/bin/env bash
# Set up from scratch, then build, verify and stream a generated demo data set.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/shardkit demo "$@"
