"""Tar I/O on the hot path: header encoding, a streaming sample reader, sample indexes."""

from __future__ import annotations

from shardkit.format.tario.index import read_index, write_index
from shardkit.format.tario.names import split_key
from shardkit.format.tario.reader import TarReader, iter_members, read_shard
from shardkit.format.tario.writer import TarBuilder, check_key, member_header

__all__ = [
    "TarBuilder",
    "TarReader",
    "check_key",
    "iter_members",
    "member_header",
    "read_index",
    "read_shard",
    "split_key",
    "write_index",
]
