"""pack_tokens: documents' token arrays into fixed-length training sequences.

Each sample's ``field`` (a 1-D integer array, decoded from ``.npy``, or a list) is one
document, optionally followed by an ``eos`` token. Two strategies:

- ``"greedy"`` (default): the documents are concatenated into one stream cut into arrays
  of exactly ``seq_len`` tokens; a document can span two sequences; nothing is padded. The
  tokens left at the end of an epoch (fewer than ``seq_len``) are dropped.
- ``"best_fit"``: documents are read in groups of ``buffer``; a document longer than
  ``seq_len`` is cut into ``seq_len`` pieces and a rest first; the group's pieces are
  placed best-fit decreasing (:func:`shardkit.stages.packing.best_fit`) into sequences,
  padded with ``pad`` to ``seq_len``. Fewer documents are cut (only those longer than
  ``seq_len``), at the cost of padding; every token of every document is given once.

``boundaries=True`` yields a dict per sequence: ``tokens``, ``position_ids`` (each token's
offset in its document: 0 at each document start; a document continued from the sequence
before goes on from its offset) and ``cu_seqlens`` (0, the end of each document's run, and
``seq_len``: padding is a run of its own), which ``batched`` collates for varlen attention
(:func:`shardkit.stages.packing.collate_packed`).

State: the upstream's state *before* the document (greedy) or group (best-fit) being cut,
and how much of it was given (``skip``: tokens of the document, or sequences of the
group). A restore re-reads that document or group and skips what was given. An elastic
resume (another world size or worker count) continues *after* it: the rest a worker was
cutting is left out, so nothing is read twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, DecodeError, StateDictError
from shardkit.plan.world import Context
from shardkit.stages.base import Cursor, Grid, Stage, check_int, check_state
from shardkit.stages.mix_draws import drawn_from
from shardkit.stages.mixture import find_mix
from shardkit.stages.packing import Segment, best_fit, pieces, segments_boundaries
from shardkit.values import as_int, is_integer

__all__ = ["STRATEGIES", "PackTokens"]

STRATEGIES = ("greedy", "best_fit")


def _int_dtype(dtype: Any) -> np.dtype[Any]:
    """``dtype`` as a native integer numpy dtype (else a ConfigError naming it)."""
    try:
        out = np.dtype(dtype)
    except TypeError:
        raise ConfigError(f"pack_tokens: dtype {dtype!r} is not a numpy dtype") from None
    if out.kind not in "iu":
        raise ConfigError(f"pack_tokens: dtype must be an integer dtype, got {out}")
    native: np.dtype[Any] = out.newbyteorder("=")
    return native


def _check_token(what: str, token: Any, dtype: np.dtype[Any] | None) -> None:
    """``eos``/``pad``: an int the output ``dtype`` (when given) holds."""
    if not is_integer(token):
        raise ConfigError(f"pack_tokens: {what} must be an int, got {token!r}")
    if dtype is not None:
        info = np.iinfo(dtype)
        if not info.min <= int(token) <= info.max:
            raise ConfigError(
                f"pack_tokens: {what}={int(token)} does not fit dtype {dtype} "
                f"({info.min}..{info.max}): give another {what} or a wider dtype="
            )


def widest(dtype: np.dtype[Any], more: np.dtype[Any] | int) -> np.dtype[Any]:
    """The integer dtype that holds every value of ``dtype`` and ``more`` (a dtype or one
    id); a ConfigError where none does (uint64 beside a signed dtype)."""
    if isinstance(more, int):
        info = np.iinfo(dtype)
        if info.min <= more <= info.max:
            return dtype.newbyteorder("=")
        other = np.min_scalar_type(more)
    else:
        other = more
    out = np.promote_types(dtype, other)
    if out.kind not in "iu":
        raise ConfigError(
            f"pack_tokens: token ids of {dtype} and {more} have no common integer dtype: "
            "give dtype="
        )
    return out.newbyteorder("=")


def _narrowed(arr: np.ndarray, dtype: np.dtype[Any], sample: Any, field: str) -> np.ndarray:
    """``arr`` cast to ``dtype``, every id checked to fit (else a DecodeError naming the id,
    the dtype and the sample's key)."""
    if not np.can_cast(arr.dtype, dtype, "safe") and len(arr):
        info = np.iinfo(dtype)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            key = str(sample.get("__key__")) if isinstance(sample, dict) else None
            raise DecodeError(
                f"pack_tokens: token id {bad} of sample {key!r} does not fit dtype={dtype} "
                f"({info.min}..{info.max}): give a wider dtype=",
                key=key,
                field=field,
            )
    return arr.astype(dtype, copy=False)


class PackTokens(Stage):
    """Pack ``field`` token arrays into ``seq_len``-token sequences.

    Args:
        upstream: the stage before (samples are dicts holding ``field``).
        field: the token field, e.g. ``"tokens.npy"``.
        seq_len: tokens per output sequence.
        eos: a token appended after every document (None: none).
        dtype: the output dtype, an integer one: a document id it cannot hold is a
            :class:`DecodeError` naming the id, the dtype and the sample's key (default:
            the widest dtype seen so far, ``eos`` and ``pad`` included: a ``uint16``
            source mixed with an ``int32`` one gives ``int32`` from there on; ids are
            never narrowed).
        strategy: ``"greedy"`` (cut the stream) or ``"best_fit"`` (place whole documents).
        buffer: documents per best-fit group.
        boundaries: yield dicts with ``tokens``, ``position_ids`` and ``cu_seqlens``.
        pad: the token that fills a best-fit sequence's free room.
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
        strategy: str = "greedy",
        buffer: int = 64,
        boundaries: bool = False,
        pad: int = 0,
    ) -> None:
        mixture = find_mix(upstream)
        if mixture is not None and mixture.tokens_field is None:
            # a mixture before counts its sources' tokens by the packed field: this stage
            # reads from a copy of the pipeline made so (the one given is not changed)
            upstream = upstream.replacing(mixture, mixture.counting(field))
        super().__init__(upstream)
        seq_len = as_int(seq_len, "pack_tokens: seq_len", low=1, floats=False)
        if dtype is not None:
            dtype = _int_dtype(dtype)
        for what, token in (("eos", eos), ("pad", pad)):
            if token is not None or what == "pad":  # no eos is None; a pad is always one
                _check_token(what, token, dtype)
        if strategy not in STRATEGIES:
            raise ConfigError(
                f"pack_tokens: strategy must be one of {STRATEGIES}, not {strategy!r}"
            )
        buffer = as_int(buffer, "pack_tokens: buffer", low=1, floats=False)
        self.field = field
        self.seq_len = seq_len
        self.eos = None if eos is None else int(eos)
        self.dtype: np.dtype[Any] | None = dtype
        self.strategy = strategy
        self.buffer = buffer
        self.boundaries = boundaries
        self.pad = int(pad)

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
        if self.dtype is not None and arr.dtype != self.dtype:
            arr = _narrowed(arr, self.dtype, sample, self.field)
        if self.eos is not None:
            eos = self.dtype if self.dtype is not None else widest(arr.dtype, self.eos)
            arr = np.append(arr, np.asarray(self.eos, dtype=eos))
        return arr

    def out_dtype(self, seen: np.dtype[Any] | None, doc: np.ndarray) -> np.dtype[Any]:
        """The dtype a sequence is written in once ``doc`` came: ``dtype=``, else the
        widest of what was ``seen``, ``doc``'s and (best-fit) ``pad``'s."""
        if self.dtype is not None:
            return self.dtype
        wide = widest(doc.dtype if seen is None else seen, doc.dtype)
        return widest(wide, self.pad) if self.strategy == "best_fit" else wide

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        if state is None:
            return _PackCursor(self, self._up().iterate(ctx), 0)
        st = check_state(state, self.name, self.version, ("skip", "source"))
        skip = check_int(st, self.name, "skip")
        cursor = _PackCursor(self, self._up().iterate(ctx, st["source"]), skip)
        if st.get("dtype") is not None:  # the widest dtype seen before the state
            try:
                cursor.seen = _int_dtype(st["dtype"])
            except ConfigError as exc:
                raise StateDictError(f"{self.name}: key 'dtype': {exc}") from None
        return cursor

    def _emit(self, out: np.ndarray, segments: list[Segment]) -> Any:
        if not self.boundaries:
            return out
        pos, cu = segments_boundaries(segments, self.seq_len)
        return {"tokens": out, "position_ids": pos, "cu_seqlens": cu}

    def _place(
        self, docs: list[np.ndarray], dtype: np.dtype[Any]
    ) -> list[tuple[Any, list[tuple[int, int, int]]]]:
        """One group's sequences, its documents' pieces placed best-fit decreasing, each
        with its pieces ``(document, offset, length)``."""
        if not docs:
            return []
        parts = [(i, off, n) for i, d in enumerate(docs) for off, n in pieces(len(d), self.seq_len)]
        out = []
        for members in best_fit([n for _, _, n in parts], self.seq_len):
            seq = np.full(self.seq_len, self.pad, dtype=dtype)
            segments: list[Segment] = []
            at = 0
            for m in members:
                i, off, n = parts[m]
                seq[at : at + n] = docs[i][off : off + n]
                segments.append((off, n))
                at += n
            out.append((self._emit(seq, segments), [parts[m] for m in members]))
        return out

    def real_tokens(self, doc: np.ndarray) -> int:
        """A document's own tokens (its ``eos`` aside): what a mixture counts of it."""
        return len(doc) - (1 if self.eos is not None else 0)

    def params(self) -> dict[str, Any]:
        dtype = None if self.dtype is None else self.dtype.str
        out = {"field": self.field, "seq_len": self.seq_len, "eos": self.eos, "dtype": dtype}
        if self.strategy != "greedy" or self.boundaries:  # the fingerprint of older states stays
            out.update(
                strategy=self.strategy, buffer=self.buffer, boundaries=self.boundaries, pad=self.pad
            )
        return out

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        """Every worker goes on after the document it was cutting (its rest is dropped)."""
        after = [
            [None if st is None else st.get("after", st["source"]) for st in row] for row in grid
        ]
        source = self._up().merge(after)
        if source is None:
            return None
        return {"stage": self.name, "version": self.version, "skip": 0, "source": source}

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        return None

    def carry(self, state: Mapping[str, Any] | None, epoch: int) -> dict[str, Any] | None:
        """The upstream's carried state, after the document or group being cut."""
        if state is None:
            return None
        source = self._up().carry(state.get("after", state["source"]), epoch)
        if source is None:
            return None
        return {"stage": self.name, "version": self.version, "skip": 0, "source": source}


class _PackCursor(Cursor):
    """Cuts its upstream's documents into sequences; holds the document or group being cut
    (``held``: the upstream's state before it, and how much of it was given)."""

    def __init__(self, stage: PackTokens, up: Cursor, skip: int) -> None:
        super().__init__(up)
        self.stage = stage
        self.held: dict[str, Any] | None = None
        self.seen: np.dtype[Any] | None = None  # the widest output dtype so far
        self.mix = drawn_from(up)  # a mixture below: exposure is counted at delivery
        # "samples": a document counts once its first token is delivered (held back
        # from the source's count while it waits in a group or is never reached)
        self.own["samples"] = 0.0
        self.items = self._best_fit(skip) if stage.strategy == "best_fit" else self._greedy(skip)

    def state(self) -> dict[str, Any]:
        held = self.held
        now = self.upstream.state()
        out = {"stage": self.stage.name, "version": self.stage.version, "skip": 0, "source": now}
        if held:  # a document is being cut: resume re-reads it; "after" has it consumed
            out.update(skip=held["skip"], source=held["source"], after=now)
            if held.get("given"):  # what of it was delivered, per mixture source
                out["given"] = [list(g) for g in held["given"]]
        if self.seen is not None and self.stage.dtype is None:
            out["dtype"] = self.seen.str
        return out

    def _doc(self, sample: Any) -> np.ndarray:
        """A document's tokens; the output dtype widened to hold them."""
        doc = self.stage._tokens(sample)
        self.seen = self.stage.out_dtype(self.seen, doc)
        return doc

    def _source(self) -> int | None:
        """The mixture source of the document read last (None: no mixture)."""
        return None if self.mix is None else self.mix.last

    def _greedy(self, skip: int) -> Iterator[Any]:
        stage, up = self.stage, self.upstream
        seq_len = stage.seq_len
        it = up
        cur = np.empty(0, dtype=np.int64)
        cur_off = 0
        source: int | None = None
        before = up.state()
        out: np.ndarray | None = None
        while True:
            fill = 0
            segments: list[Segment] = []
            while fill < seq_len:
                if cur_off >= len(cur):
                    before = up.state()
                    sample = next(it, None)
                    if sample is None:
                        return
                    cur, cur_off, skip = self._doc(sample), skip, 0
                    source = self._source()
                    self.own["samples"] -= 1 if len(cur) else 0
                    if out is None:
                        out = np.empty(seq_len, dtype=self.seen)
                    elif out.dtype != self.seen:  # a wider document: never narrow its ids
                        out = out.astype(self.seen)
                take = min(seq_len - fill, len(cur) - cur_off)
                if take == 0:
                    continue
                assert out is not None
                out[fill : fill + take] = cur[cur_off : cur_off + take]
                segments.append((cur_off, take))
                fill += take
                cur_off += take
            assert out is not None
            if cur_off < len(cur):
                self.held = {"source": before, "skip": cur_off}
                if source is not None:  # the held document's delivered tokens
                    self.held["given"] = [[source, 1, min(cur_off, stage.real_tokens(cur))]]
            else:
                self.held = None  # nothing held: upstream's state is exact
            self.own["samples"] += sum(1 for off, _ in segments if off == 0)
            yield stage._emit(out.copy(), segments)

    def _best_fit(self, skip: int) -> Iterator[Any]:
        stage, up = self.stage, self.upstream
        it = up
        while True:
            before = up.state()
            docs, sources = [], []
            for _ in range(stage.buffer):
                sample = next(it, None)
                if sample is None:
                    break
                doc = self._doc(sample)
                if len(doc):
                    docs.append(doc)
                    sources.append(self._source())
                    self.own["samples"] -= 1
            seqs = stage._place(docs, self.seen) if self.seen is not None else []
            given: dict[int, list[int]] = {}  # per source: samples, tokens delivered
            for i, (seq, parts) in enumerate(seqs):
                for d, off, n in parts:
                    k = sources[d]
                    if k is not None:
                        real = stage.real_tokens(docs[d])
                        got = given.setdefault(k, [0, 0])
                        got[0] += off == 0
                        got[1] += max(min(off + n, real) - off, 0)
                if i < skip:
                    continue
                held = i + 1 < len(seqs)  # sequences of this group are still to come
                self.held = {"source": before, "skip": i + 1} if held else None
                if self.held is not None and given:
                    self.held["given"] = [[k, s, t] for k, (s, t) in sorted(given.items())]
                self.own["samples"] += sum(1 for _, off, _ in parts if off == 0)
                yield seq
            skip = 0
            if sample is None:
                return
