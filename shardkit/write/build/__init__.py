"""``shardkit build`` as a library: plan (inputs, parts, workers, what the output holds),
run (one writer or worker processes), join (one manifest), merge (parts)."""

from shardkit.write.build.config import BuildConfig, BuildPlan, BuildResult
from shardkit.write.build.merge import merge_parts
from shardkit.write.build.plan import plan_build, split_contiguous
from shardkit.write.build.run import build, run_build

__all__ = [
    "BuildConfig",
    "BuildPlan",
    "BuildResult",
    "build",
    "merge_parts",
    "plan_build",
    "run_build",
    "split_contiguous",
]
