#!/usr/bin/env bash
# Set up the runtime only (torch and shardkit's core dependencies: no test or dev tools),
# then generate a small data set, build shards, verify them, stream them and print throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh runtime
.venv/bin/shardkit demo "$@"
