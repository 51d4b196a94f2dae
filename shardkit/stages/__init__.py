"""Pipeline stages with WebDataset's names; each stateful one gives and takes its cursor."""

from __future__ import annotations

from shardkit.read.policy import POLICIES, check_policy
from shardkit.stages.base import Context, Stage, check_state, merge_counters
from shardkit.stages.basic import Batched, Map, Select, ToTuple
from shardkit.stages.collate import collate_numpy
from shardkit.stages.decode import Decode
from shardkit.stages.elastic import ResumePlan, elastic_merge, resume_plan
from shardkit.stages.source import ShardSource
from shardkit.stages.tokens import PackTokens

__all__ = [
    "POLICIES",
    "Batched",
    "Context",
    "Decode",
    "Map",
    "PackTokens",
    "ResumePlan",
    "Select",
    "ShardSource",
    "Stage",
    "ToTuple",
    "check_policy",
    "check_state",
    "collate_numpy",
    "elastic_merge",
    "merge_counters",
    "resume_plan",
]
