#!/usr/bin/env bash
# Create the benchmark venv (.bench-venv, gitignored): shardkit plus its peers, which are
# installed here for the benchmarks only and never become shardkit dependencies.
#
# - torch==2.13.0 goes in FIRST and stays pinned through a constraint file: it is the CPU
#   wheel on disk, and mosaicml-streaming / litdata would otherwise pull a newer (CUDA) torch
#   and gigabytes of nvidia-* wheels.
# - The only torchvision on the package index is a CUDA build whose _C.so needs
#   libc10_cuda.so, which the CPU torch does not have: importing it fails. Nothing the
#   benchmarks use needs it (mosaic streaming imports it only for streaming.vision, litdata
#   only for image/video serializers), so it is removed again; scripts/bench/_peers.py
#   puts an empty streaming.vision module in place before importing mosaic streaming.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=${BENCH_VENV:-.bench-venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
$PIP install -q "torch==2.13.0"
PIN=$(mktemp)
trap 'rm -f "$PIN"' EXIT
echo "torch==2.13.0" >"$PIN"
$PIP install -q -c "$PIN" -e ".[s3,gcs,azure]" webdataset xxhash py-spy moto[server] obstore
$PIP install -q -c "$PIN" "mosaicml-streaming==0.13.0" "litdata==0.2.76"
$PIP install -q -c "$PIN" "grain==0.2.18"  # packing.py's peer (Grain's first/best-fit packers)
$PIP uninstall -q -y torchvision || true
"$VENV/bin/python" - <<'PY'
import sys, types
sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
import litdata, streaming, torch, webdataset, shardkit
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"bench venv ready: torch {torch.__version__}, webdataset {webdataset.__version__}, "
      f"mosaicml-streaming {streaming.__version__}, litdata {litdata.__version__}")
PY
