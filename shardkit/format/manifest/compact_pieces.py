"""Piece checksums in the compact form: one array of raw digests for the whole data set.

A million 1 GB shards in 16 MiB pieces hold 64 million piece digests (2.2 GB as JSON hex,
1 GB raw). The compact form keeps them as one ``uint8`` array of 16-byte rows with a row
offset per shard, so a process maps them and touches only the pages of the shards it
reads. They are not hashed on open (that would read a gigabyte in every process): the
rows are hashed in blocks, each block's SHA-256 kept in a small array that is checked on
open, and a block is read (not mapped) and checked when one of its shards' pieces is asked
for; a reader keeps the last few checked blocks.

Arrays (prefix ``pieces.``): ``offsets`` (int64, one more than shards: shard ``i``'s rows
are ``offsets[i]:offsets[i+1]``), ``digests`` (uint8, rows x 16), ``blocks`` (uint8,
blocks x 32), and ``sizes`` (int64 piece size per shard, 0 where a shard has none) unless
every shard has pieces of one size (then ``meta["size"]``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardkit.errors import ManifestError
from shardkit.format.pieces import PIECE_ALGORITHM, Pieces

__all__ = ["BLOCK_ROWS", "PieceColumn", "encode_pieces"]

WIDTH = 16  # bytes of an xxh3-128 digest
BLOCK_ROWS = 1 << 16  # rows hashed together: 1 MiB of digests


def _block_hashes(digests: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(digests).reshape(-1)
    step = BLOCK_ROWS * WIDTH
    out = [hashlib.sha256(flat[i : i + step].tobytes()).digest() for i in range(0, len(flat), step)]
    return np.frombuffer(b"".join(out), dtype=np.uint8).reshape(len(out), 32)


def encode_pieces(pieces: Sequence[Pieces | None]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The meta and arrays of the piece column of ``pieces`` (one per shard)."""
    n = len(pieces)
    if all(p is None for p in pieces):
        return {"kind": "none"}, {}
    counts = np.fromiter((0 if p is None else len(p.digests) for p in pieces), np.int64, n)
    offsets = np.zeros(n + 1, dtype="<i8")
    np.cumsum(counts, out=offsets[1:])
    digests = np.empty((int(offsets[-1]), WIDTH), dtype=np.uint8)
    for i, p in enumerate(pieces):
        if p is not None and p.digests:
            row = np.frombuffer(bytes.fromhex("".join(p.digests)), dtype=np.uint8)
            digests[offsets[i] : offsets[i + 1]] = row.reshape(-1, WIDTH)
    sizes = np.fromiter((0 if p is None else p.size for p in pieces), np.int64, n)
    meta: dict[str, Any] = {"kind": "rows", "algorithm": PIECE_ALGORITHM}
    arrays = {"offsets": offsets, "digests": digests, "blocks": _block_hashes(digests)}
    if n and sizes.min() > 0 and sizes.min() == sizes.max():
        meta["size"] = int(sizes[0])
    else:
        arrays["sizes"] = sizes.astype("<i8")
    return meta, arrays


Rows = Callable[[int, int], bytes]  # rows [lo, hi) of the digests, unchecked
_KEEP = 8  # checked blocks a reader keeps (8 MiB at most)


@dataclass
class PieceColumn:
    """The pieces of every shard; ``self[i]`` is shard ``i``'s :class:`Pieces`.

    ``arrays`` holds the small arrays (checked on open); the digests are read by block
    through ``rows`` (``shape`` is theirs), each block checked against its hash before a
    row of it is used, the last few checked blocks kept.
    """

    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    path: str = ""
    rows: Rows | None = None
    shape: list[int] = field(default_factory=list)
    _blocks: OrderedDict[int, bytes] = field(default_factory=OrderedDict)

    def check(self, nshards: int) -> None:
        """Whether the arrays fit together (on open; the digests' blocks are checked later)."""
        if self.meta.get("kind") == "none":
            return
        a = self.arrays
        try:
            offsets, blocks = a["offsets"], a["blocks"]
        except KeyError as exc:
            raise ManifestError(f"compact form lacks piece array {exc}", path=self.path) from None
        sizes = a.get("sizes")
        nrows = self.shape[0] if len(self.shape) == 2 else -1
        ok = (
            self.rows is not None
            and len(offsets) == nshards + 1
            and (sizes is None or len(sizes) == nshards)
            and (sizes is not None or int(self.meta.get("size") or 0) > 0)
            and self.shape[1:] == [WIDTH]
            and int(offsets[-1]) == nrows
            and len(blocks) == -(-nrows // BLOCK_ROWS)
        )
        if not ok:
            raise ManifestError("compact form's piece arrays do not fit", path=self.path)

    def __getitem__(self, i: int) -> Pieces | None:
        if self.meta.get("kind") == "none":
            return None
        a = self.arrays
        size = int(a["sizes"][i]) if "sizes" in a else int(self.meta["size"])
        if size <= 0:
            return None
        lo, hi = int(a["offsets"][i]), int(a["offsets"][i + 1])
        parts = []
        for b in range(lo // BLOCK_ROWS, -(-hi // BLOCK_ROWS)):
            block = self._block(b)
            first = b * BLOCK_ROWS
            parts.append(
                block[
                    (max(lo, first) - first) * WIDTH : (min(hi, first + BLOCK_ROWS) - first) * WIDTH
                ]
            )
        raw = b"".join(parts).hex()
        step = 2 * WIDTH
        return Pieces(size, tuple(raw[k : k + step] for k in range(0, len(raw), step)))

    def _block(self, b: int) -> bytes:
        """Block ``b`` of the digests, read and checked (or kept from a recent check)."""
        if b in self._blocks:
            self._blocks.move_to_end(b)
            return self._blocks[b]
        assert self.rows is not None
        lo = b * BLOCK_ROWS
        data = self.rows(lo, min(lo + BLOCK_ROWS, self.shape[0]))
        if hashlib.sha256(data).digest() != self.arrays["blocks"][b].tobytes():
            raise ManifestError(
                f"compact form's piece checksums (block {b}) do not match their checksum: "
                "delete it and it is built again from manifest.json",
                path=self.path,
            )
        self._blocks[b] = data
        if len(self._blocks) > _KEEP:
            self._blocks.popitem(last=False)
        return data
