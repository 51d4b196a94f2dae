"""pack_tokens: concatenate documents' token arrays into fixed-length training sequences.

Each sample's ``field`` (a 1-D integer array, decoded from ``.npy``, or a list) is
appended to a running stream, optionally followed by an ``eos`` token, and the stream is
cut into arrays of exactly ``seq_len`` tokens; a document can span two sequences. The
tokens left at the end of an epoch (fewer than ``seq_len``) are dropped.

State: the upstream's state *before* the document being cut, and how many of its tokens
are used (``skip``). A restore re-reads that one document and skips its used tokens. An
elastic resume (another world size or worker count) continues *after* that document: the
rest of a document a worker was cutting is left out, so nothing is read twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, DecodeError
from shardkit.stages.base import Context, Grid, Stage, check_int, check_state

__all__ = ["PackTokens"]


class PackTokens(Stage):
    """Pack ``field`` token arrays into ``seq_len``-token arrays.

    Args:
        upstream: the stage before (samples are dicts holding ``field``).
        field: the token field, e.g. ``"tokens.npy"``.
        seq_len: tokens per output sequence.
        eos: a token appended after every document (None: none).
        dtype: the output dtype (default: the first document's).
    """

    name = "pack_tokens"
    version = 1

    def __init__(
        self,
        upstream: Stage,
        field: str,
        seq_len: int,
        *,
        eos: int | None = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(upstream)
        if seq_len < 1:
            raise ConfigError(f"pack_tokens: seq_len must be at least 1, got {seq_len}")
        self.field = field
        self.seq_len = seq_len
        self.eos = eos
        self.dtype = dtype
        self._state: dict[str, Any] | None = None

    def _tokens(self, sample: Any) -> np.ndarray:
        try:
            value = sample[self.field]
        except (KeyError, TypeError, IndexError):
            raise DecodeError(
                f"pack_tokens: no field {self.field!r} (did you decode()?)",
                key=str(sample.get("__key__")) if isinstance(sample, dict) else None,
            ) from None
        if isinstance(value, (bytes, bytearray, memoryview)):
            raise DecodeError(
                f"pack_tokens: field {self.field!r} holds raw bytes: decode() it first",
                key=str(sample.get("__key__")),
                field=self.field,
            )
        arr = np.asarray(value)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise DecodeError(
                f"pack_tokens: field {self.field!r} must be a 1-D integer array, got "
                f"{arr.dtype} of shape {arr.shape}",
                key=str(sample.get("__key__")),
                field=self.field,
            )
        if self.eos is not None:
            arr = np.append(arr, np.asarray(self.eos, dtype=arr.dtype))
        return arr

    def __iter__(self) -> Iterator[np.ndarray]:
        up = self._up()
        st = self._take_pending()  # the upstream took its part in load_state_dict
        skip = 0 if st is None else int(st["skip"])
        self._state = None
        return self._pack(up, skip)

    def _pack(self, up: Stage, skip: int) -> Iterator[np.ndarray]:
        seq_len = self.seq_len
        it = iter(up)
        cur = np.empty(0, dtype=np.int64)
        cur_off = 0
        before = up.state_dict()
        out: np.ndarray | None = None
        while True:
            fill = 0
            while fill < seq_len:
                if cur_off >= len(cur):
                    before = up.state_dict()
                    sample = next(it, None)
                    if sample is None:
                        return
                    cur, cur_off, skip = self._tokens(sample), skip, 0
                    if out is None:
                        out = np.empty(seq_len, dtype=self.dtype or cur.dtype)
                take = min(seq_len - fill, len(cur) - cur_off)
                assert out is not None
                out[fill : fill + take] = cur[cur_off : cur_off + take]
                fill += take
                cur_off += take
            assert out is not None
            if cur_off < len(cur):
                self._state = {"source": before, "skip": cur_off}
            else:
                self._state = None  # nothing held: upstream's state is exact
            yield out.copy()

    def state_dict(self) -> dict[str, Any]:
        if self._pending is not None:
            return dict(self._pending)
        held = self._state
        now = self._up().state_dict()
        out = {"stage": self.name, "version": self.version, "skip": 0, "source": now}
        if held:  # a document is being cut: resume re-reads it; "after" has it consumed
            out.update(skip=held["skip"], source=held["source"], after=now)
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        st = check_state(state, self.name, self.version, ("skip", "source"))
        check_int(st, self.name, "skip")
        self._up().load_state_dict(st["source"])
        self._pending = st

    def params(self) -> dict[str, Any]:
        dtype = None if self.dtype is None else np.dtype(self.dtype).str
        return {"field": self.field, "seq_len": self.seq_len, "eos": self.eos, "dtype": dtype}

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """Every worker goes on after the document it was cutting (its rest is dropped)."""
        after = [
            [None if st is None else st.get("after", st["source"]) for st in row] for row in grid
        ]
        source = self._up().merge(after)
        if source is None:
            return None
        return {"stage": self.name, "version": self.version, "skip": 0, "source": source}

    def state_epoch(self, state: Mapping[str, Any]) -> int:
        return self._up().state_epoch(state["source"])

    def lengths(self, ctx: Context) -> list[int] | None:
        return None
