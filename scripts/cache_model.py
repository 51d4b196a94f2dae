"""The node cache's model-based test in its long mode (issue 19 item 6): many seeds, many
steps each (tests/property/test_cache_model.py runs two short seeds in CI).

    PYTHONPATH=. python scripts/cache_model.py --seeds 20 --steps 500
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.cache_model import run_model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=10, help="how many seeds (from --first)")
    p.add_argument("--first", type=int, default=100, help="the first seed")
    p.add_argument("--steps", type=int, default=400, help="reads per seed")
    p.add_argument("--readers", type=int, default=3, help="reader processes")
    args = p.parse_args()
    failed = 0
    for seed in range(args.first, args.first + args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            report = run_model(Path(tmp), seed=seed, steps=args.steps, readers=args.readers)
        print(json.dumps({"seed": seed, **report.__dict__}), flush=True)
        failed += bool(report.broken)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
