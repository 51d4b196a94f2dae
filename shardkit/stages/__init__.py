"""Pipeline stages with WebDataset's names; each stateful one gives and takes its cursor."""

from __future__ import annotations

from shardkit.plan.world import Context
from shardkit.read.policy import POLICIES, check_policy
from shardkit.stages.base import Cursor, Grid, Stage, check_state, state_epoch
from shardkit.stages.basic import Batched, Map, Select, ToTuple
from shardkit.stages.collate import collate_numpy
from shardkit.stages.costs import attention_cost
from shardkit.stages.decode import Decode
from shardkit.stages.source import ShardSource, sources_of
from shardkit.stages.tokens import PackTokens

__all__ = [
    "POLICIES",
    "Batched",
    "Context",
    "Cursor",
    "Decode",
    "Grid",
    "Map",
    "PackTokens",
    "Select",
    "ShardSource",
    "Stage",
    "ToTuple",
    "attention_cost",
    "check_policy",
    "check_state",
    "collate_numpy",
    "sources_of",
    "state_epoch",
]
