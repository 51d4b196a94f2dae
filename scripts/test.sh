#!/usr/bin/env bash
# Set up everything (test and dev tools, Azurite, bsdtar), then lint, type-check and run the
# whole test suite. .ci/run calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
