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
$PIP install -q -c "$PIN" "grain==0.2.18"  # packing.py's and read.py's peer (array_record with it)
# read.py's loader peers (issue 22 item 5). All accept torch 2.13.0 through the constraint.
# - torchdata 0.11.0 (torchdata.nodes) and spdl 0.8.0 (spdl_core + spdl_io: a cp311
#   manylinux x86_64 wheel, CPU-only; numpy its only dependency) install as they are.
# - megatron-energon 7.4.1 goes in with --no-deps plus its real needs: its s3fs requirement
#   resolves to aiobotocore 3.10, which pins botocore<1.43.118 and would downgrade the
#   botocore that boto3 1.44.8 (moto, the s3 benches) needs. energon never imports s3fs
#   (its remote storage goes through multi-storage-client), so s3fs is left out.
$PIP install -q -c "$PIN" "torchdata==0.11.0" "spdl==0.8.0"
$PIP install -q -c "$PIN" --no-deps "megatron-energon==7.4.1"
$PIP install -q -c "$PIN" braceexpand click "filetype>=1.0.0" mfusepy \
  "multi-storage-client==1.3.1" "pillow>=10.0.1" pyyaml "rapidyaml>=0.10.0" tqdm
$PIP uninstall -q -y torchvision || true
"$VENV/bin/python" - <<'PY'
import sys, types
sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
import litdata, streaming, torch, webdataset, shardkit
import megatron.energon, spdl.pipeline, torchdata.nodes, grain.python
from importlib.metadata import version
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"bench venv ready: torch {torch.__version__}, webdataset {webdataset.__version__}, "
      f"mosaicml-streaming {streaming.__version__}, litdata {litdata.__version__}, "
      f"megatron-energon {version('megatron-energon')}, grain {version('grain')}, "
      f"spdl {version('spdl')}, torchdata {version('torchdata')}")
PY
