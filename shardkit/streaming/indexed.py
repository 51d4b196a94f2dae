"""IndexedShards: a map-style torch ``Dataset`` over a shard set: sample ``i``, or by key.

::

    ds = sk.IndexedShards("shards/manifest.json").decode().to_tuple("tokens.npy", "json")
    len(ds); ds[17]; ds[-1]; ds[100:200]          # a slice is a view, read lazily
    sk.IndexedShards(url, cache_dir="/nvme/sk").get("sample-00000042")

``ds[i]`` is global sample ``i`` in manifest order (shard by shard, each in tar order). A
lookup is a binary search over the shard starts in memory and one read of that one sample
through the sample index (:mod:`shardkit.read.lookup`). A local shard stays open in each
process (a bounded number of them); the pieces holding the sample are checked before it
is parsed and kept in memory a while (a bounded number of bytes), so a later lookup in
them reads nothing again. Remote shards go through the node cache when ``cache_dir`` is
given (the pieces holding the sample are fetched and verified once for the node, later
lookups in them read its file), else through piece-verified ranged reads (each piece
fetched once and kept as a local one is). ``get(key)`` uses the data set's key index
(:mod:`shardkit.read.keys`), built on first use by reading every key once and kept
beside the manifest or in the node cache, bound to the manifest's content.

It works with torch's samplers (``RandomSampler``, ``DistributedSampler``) and a
``DataLoader`` with workers: what it pickles is the recipe and the catalog (a compact
manifest form is mapped again in each worker); openers, open shard files and the key
index are made again in each process (after a fork too). A process's threads take turns at
the reads (a lock), not at the parse. :meth:`IndexedShards.close` closes what a process keeps
open.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from torch.utils.data import Dataset

from shardkit.cache import opener_for
from shardkit.format.manifest.model import Manifest
from shardkit.io import manifest_source
from shardkit.io.config import IoConfig, with_cache
from shardkit.per_process import PerProcess
from shardkit.read.catalog import Catalog, open_catalog
from shardkit.read.keys import KeyTable, build_key_table, key_table_path
from shardkit.read.lookup import Locator, Lookups
from shardkit.read.piece_opener import piece_verified
from shardkit.read.stream import read_stream
from shardkit.stages import Context, Cursor, Decode, Map, Stage, ToTuple
from shardkit.values import as_position

__all__ = ["IndexedShards"]

_MISSING: Any = object()


class _Feed(Stage):
    """The head of a lookup's stage chain: it yields the one sample it is given."""

    name = "feed"

    def __init__(self) -> None:
        super().__init__(None)
        self.item: Any = None

    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        cursor = Cursor()
        cursor.items = iter((self.item,))
        return cursor


class IndexedShards(Dataset[Any]):
    """Samples of a shard set by position and by key (see the module docstring).

    Args:
        source: a manifest (path, url or :class:`Manifest`; a folder, local or a remote url
            ending in ``/``, is its ``manifest.json``), a url list or a brace pattern
            (shards without a sample index are refused at the first lookup in them).
        allow_unsafe_urls: let the manifest name urls outside its base.
        allow_incomplete: read a manifest whose build did not finish.
        cache_dir: node-local cache directory for remote shards (and the key index).
        cache_limit: the cache's byte limit (``"500GB"``).
        io: every io option (:class:`~shardkit.io.config.IoConfig`).
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str] | Manifest,
        *,
        allow_unsafe_urls: bool = False,
        allow_incomplete: bool = False,
        cache_dir: str | None = None,
        cache_limit: int | str | None = None,
        io: IoConfig | None = None,
    ) -> None:
        if isinstance(source, os.PathLike):
            source = os.fspath(source)
        if isinstance(source, str):
            source = manifest_source(source)  # a build's -o: its manifest.json
        self._io = with_cache(io, cache_dir, cache_limit)
        self._source = source if isinstance(source, str) else None
        self._opener: Any = None
        self._catalog: Catalog = open_catalog(
            source if isinstance(source, (str, Manifest)) else list(source),
            self._open(),
            io=self._io,
            allow_unsafe_urls=allow_unsafe_urls,
            allow_incomplete=allow_incomplete,
        )
        self._ids = range(self._catalog.total)
        self._steps: Stage | None = None
        self._locator: Locator | None = None
        self._keys: KeyTable | None = None
        self._lookups: PerProcess[Lookups] = PerProcess(self._new_lookups)
        self._counts: dict[str, float] = {"samples": 0, "bytes": 0}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_opener=None, _locator=None, _keys=None)  # made again in each process
        if self._steps is not None:
            state["_steps"] = self._steps.clone()  # without what a lookup cached
        return state

    def _open(self) -> Any:
        if self._opener is None:
            self._opener = piece_verified(opener_for(self._io))
        return self._opener

    def _new_lookups(self) -> Lookups:
        return Lookups(self._catalog, self._open(), self._io.limits)

    def _locate(self, i: int) -> tuple[int, int]:
        if self._locator is None:
            self._locator = Locator(self._catalog.counts)
        return self._locator.locate(i)

    # -- positions ---------------------------------------------------------------------
    def __len__(self) -> int:
        """Samples in this data set (or view)."""
        return len(self._ids)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> IndexedShards: ...
    @overload
    def __getitem__(self, i: str) -> Any: ...
    def __getitem__(self, i: int | slice | str) -> Any:
        """Sample ``i`` of this view (an int or numpy integer, negative from the end), a
        view of a slice, or the sample whose ``__key__`` is ``i`` (a str, as :meth:`get`:
        ``ds["000003"]`` is the sample keyed ``000003``, never position 3)."""
        if isinstance(i, slice):
            view = self._derive()
            view._ids = self._ids[i]
            return view
        if isinstance(i, str):
            return self.get(i)
        return self._apply(self._raw(self.position(i)))

    def position(self, i: int) -> int:
        """The global sample number (manifest order) of this view's item ``i``."""
        return self._ids[as_position(i, len(self._ids))]

    def _raw(self, pos: int) -> dict[str, Any]:
        shard, j = self._locate(pos)
        sample = self._lookups.get().sample(shard, j, self._counts)
        self._counts["samples"] += 1
        return sample

    def _apply(self, sample: dict[str, Any]) -> Any:
        if self._steps is None:
            return sample
        head = self._steps
        while head.upstream is not None:
            head = head.upstream
        assert isinstance(head, _Feed)
        head.item = sample
        return next(self._steps.iterate(Context()))

    # -- keys ------------------------------------------------------------------------
    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The sample whose ``__key__`` is ``key`` (the first in manifest order when several
        have it); ``default`` (or :class:`KeyError`) when this view holds none."""
        found = self._find(key)
        if found is None:
            if default is _MISSING:
                raise KeyError(f"no sample has the key {key!r} in {self!r}")
            return default
        return self._apply(found[1])

    def index_of(self, key: str, default: Any = _MISSING) -> Any:
        """This view's position of the sample whose ``__key__`` is ``key``."""
        found = self._find(key)
        if found is None:
            if default is _MISSING:
                raise KeyError(f"no sample has the key {key!r} in {self!r}")
            return default
        return found[0]

    def _find(self, key: str) -> tuple[int, dict[str, Any]] | None:
        """This view's position of ``key`` and the raw sample (hash candidates checked)."""
        if not isinstance(key, str):
            raise TypeError(f"a key must be a str, not {type(key).__name__} {key!r}")
        for pos in self.key_index().find(key):
            if pos in self._ids:
                sample = self._raw(pos)
                if sample["__key__"] == key:
                    return self._ids.index(pos), sample
        return None

    def key_index(self) -> KeyTable:
        """The data set's key index, opened (or built, once per data set) on first use."""
        if self._keys is None:
            digest = self._catalog.digest
            path = key_table_path(self._source, digest, self._io.cache.cache_dir)
            self._keys = build_key_table(path, digest, self._all_keys)
        return self._keys

    def _all_keys(self) -> Iterator[str]:
        cat = self._catalog
        ranges = ((s, 0, int(n), 0) for s, n in enumerate(cat.counts))
        counts: dict[str, float] = {"samples": 0, "bytes": 0}
        for _, sample in read_stream(ranges, cat, self._open(), counts, "raise", self._io.limits):
            yield str(sample["__key__"])

    # -- the stage vocabulary (per sample) ---------------------------------------------
    def _derive(self) -> IndexedShards:
        new = IndexedShards.__new__(IndexedShards)
        new.__dict__.update(self.__dict__)
        new._steps = None if self._steps is None else self._steps.clone()
        new._counts = {"samples": 0, "bytes": 0}
        return new

    def _then(self, make: Callable[[Stage], Stage]) -> IndexedShards:
        new = self._derive()
        new._steps = make(new._steps or _Feed())
        return new

    def decode(
        self,
        *handlers: str | Mapping[str, Callable[[bytes], Any]] | Callable[[str, bytes], Any],
        allow_pickle: bool = False,
    ) -> IndexedShards:
        """Decode fields by extension, as :meth:`ShardDataset.decode` does."""
        return self._then(lambda up: Decode(up, *handlers, allow_pickle=allow_pickle))

    def map(self, fn: Callable[[Any], Any]) -> IndexedShards:
        """Apply ``fn`` to every item."""
        return self._then(lambda up: Map(up, fn))

    def to_tuple(self, *fields: str) -> IndexedShards:
        """Items as tuples of these fields (``"jpg;png"``: the first present)."""
        return self._then(lambda up: ToTuple(up, *fields))

    # -- facts -------------------------------------------------------------------------
    @property
    def catalog(self) -> Catalog:
        """The shard list read."""
        return self._catalog

    def counters(self) -> dict[str, float]:
        """Samples and bytes read by this process's lookups."""
        return dict(self._counts)

    def io_stats(self) -> dict[str, float]:
        """The io counters of this process's opener."""
        return dict(self._open().stats())

    def close(self) -> None:
        """Close the shard files this process keeps open for lookups, drop the pieces it
        keeps, and wait for the node cache's background fills this process started (so
        the cache dir can be removed); the data set can be used again afterwards."""
        lookups = self._lookups.peek()
        if lookups is not None:
            lookups.close()
        drain = getattr(self._opener, "drain", None)
        if drain is not None:
            drain()

    def __repr__(self) -> str:
        r = self._ids
        view = "" if r == range(self._catalog.total) else f", view={r}"
        return f"IndexedShards({self._source or '<shards>'!r}, {len(self)} samples{view})"
