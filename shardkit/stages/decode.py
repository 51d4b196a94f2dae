"""The decode stage: turn field bytes into values by extension, plus the user's handlers.

``decode()`` uses the built-in codecs of :mod:`shardkit.format.codecs` (json, npy, txt, cls, ...)
and decodes images with Pillow when it is installed (to ``PIL.Image``; other image
forms by name: ``"pil"``, ``"rgb8"`` (uint8 HxWx3), ``"rgb"`` (float32 in [0, 1]),
``"l8"``, ``"l"``, ``"torchrgb"`` (a float32 CxHxW torch tensor in [0, 1], as
WebDataset's ``torchrgb``)). Handlers given by the user come first:

- a dict ``{"ext" or "field": fn(bytes) -> value}``;
- a callable ``fn(field, bytes) -> value or None`` (None: not mine), as in WebDataset.

A handler reports bad bytes by raising ``ValueError`` (or :class:`DecodeError`): that is a
data error the ``handler`` policy may skip. Any other exception is a bug in the handler
and propagates unchanged, whatever the policy: it would otherwise drop every sample.

Fields whose name starts with ``__`` (``__key__``, ``__url__``) are left alone.
"""

from __future__ import annotations

import importlib.util
import io
import logging
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from time import perf_counter
from typing import Any

import numpy as np

from shardkit.errors import ConfigError, DecodeError, StateDictError
from shardkit.format.codecs import NpyDecoder, decode_field, field_decoder
from shardkit.format.images import IMAGE_EXTS
from shardkit.per_process import PerProcess
from shardkit.plan.world import Context
from shardkit.read.policy import check_policy, count_error, report
from shardkit.stages.base import (
    Cursor,
    Fruitless,
    Grid,
    Stage,
    callable_name,
    check_state,
    sub_grid,
)

__all__ = ["IMAGE_MODES", "Decode"]

log = logging.getLogger(__name__)

IMAGE_MODES = ("pil", "rgb8", "rgb", "l8", "l", "torchrgb")
FieldHandler = Callable[[str, bytes], Any]


def _image_decoder(mode: str) -> Callable[[bytes], Any] | None:
    """A bytes -> image function for ``mode``; None when Pillow is not installed. Pillow
    is imported at the first image decoded: a data set without images never pays for it
    (importing it was 19 ms of a worker process's 31 ms to its first batch of tokens)."""
    if importlib.util.find_spec("PIL") is None:
        return None

    def decode(data: bytes) -> Any:
        from PIL import Image

        try:
            img = Image.open(io.BytesIO(data))
            if mode == "pil":
                img.load()
                return img
            gray = mode in ("l8", "l")
            arr = np.asarray(img.convert("L" if gray else "RGB"))
        except (OSError, SyntaxError, EOFError, Image.DecompressionBombError) as exc:
            # Pillow's ways of saying the bytes are no (safe) image: bad data, not a bug
            raise ValueError(f"not a decodable image: {exc}") from exc
        if mode.endswith("8"):
            return arr
        scaled = arr.astype(np.float32) / 255.0
        if mode == "torchrgb":
            import torch  # lazy: only this mode hands out tensors

            return torch.from_numpy(np.ascontiguousarray(scaled.transpose(2, 0, 1)))
        return scaled

    return decode


def _handler_table(
    image_mode: str, explicit_images: bool, by_name: Mapping[str, Callable[[bytes], Any]]
) -> dict[str, Callable[[bytes], Any]]:
    """Field extension -> decoder: images (when Pillow is there), ``npy``, the user's."""
    table: dict[str, Callable[[bytes], Any]] = {}
    images = _image_decoder(image_mode)
    if images is None and explicit_images:
        raise ConfigError(f"decode({image_mode!r}) needs Pillow: pip install 'shardkit[image]'")
    if images is not None:
        table.update(dict.fromkeys(IMAGE_EXTS, images))
    table["npy"] = NpyDecoder()
    table.update(by_name)
    return table


_PLANS = 4096  # field names whose decoder a process remembers (a hostile shard has many)
Plans = dict[str, tuple[str, Callable[[Any], Any] | None]]


def _decoders(
    image_mode: str, explicit_images: bool, by_name: Mapping[str, Callable[[bytes], Any]]
) -> tuple[dict[str, Callable[[bytes], Any]], Plans]:
    """This process's handler table and its field name -> decoder memo."""
    return _handler_table(image_mode, explicit_images, by_name), {}


class Decode(Stage):
    """Decode every field of each sample (see the module docstring).

    Args:
        upstream: the stage before.
        handlers: image mode names, dicts and callables, tried in order.
        allow_pickle: decode ``pickle``/``pth`` fields (an untrusted shard could run code).
        handler: the bad-data policy for a field that does not decode.
    """

    name = "decode"
    version = 1

    def __init__(
        self,
        upstream: Stage,
        *handlers: str | Mapping[str, Callable[[bytes], Any]] | FieldHandler,
        allow_pickle: bool = False,
        handler: str = "raise",
    ) -> None:
        super().__init__(upstream)
        self.by_name: dict[str, Callable[[bytes], Any]] = {}
        self.callables: list[FieldHandler] = []
        image_mode = "pil"
        for h in handlers:
            if isinstance(h, str):
                if h not in IMAGE_MODES:
                    raise ConfigError(f"decode: unknown image mode {h!r}; use one of {IMAGE_MODES}")
                image_mode = h
            elif isinstance(h, Mapping):
                self.by_name.update(h)
            elif callable(h):
                self.callables.append(h)
            else:
                raise ConfigError(f"decode: a handler must be a str, dict or callable, not {h!r}")
        self.image_mode = image_mode
        self.explicit_images = any(isinstance(h, str) for h in handlers)
        self.allow_pickle = allow_pickle
        self.policy = check_policy(handler)
        # the image decoder is a closure that does not pickle: made in each process
        self._table = PerProcess(
            partial(_decoders, self.image_mode, self.explicit_images, self.by_name)
        )

    def decode_sample(self, sample: dict[str, Any]) -> dict[str, Any]:
        table, plans = self._table.get()
        callables = self.callables
        out: dict[str, Any] = {}
        for field, data in sample.items():
            if field.startswith("__"):
                out[field] = data
                continue
            value = self._by_callables(sample, field, data) if callables else None
            if value is None:
                plan = plans.get(field)
                if plan is None:
                    plan = field_decoder(field, table)
                    if len(plans) < _PLANS:
                        plans[field] = plan
                ext, fn = plan
                if fn is None:  # pickled: decode_field's own checks
                    key = sample.get("__key__", "?")
                    value = decode_field(
                        key, field, data, allow_pickle=self.allow_pickle, handlers=table
                    )
                else:
                    try:
                        value = fn(data)
                    except DecodeError:
                        raise
                    except ValueError as exc:
                        key = sample.get("__key__", "?")
                        raise DecodeError(
                            f"cannot decode as {ext}: {exc}", key=key, field=field
                        ) from exc
                if type(value) is np.ndarray and not value.flags.writeable:
                    value = value.copy()  # npy over immutable bytes: torch wants writable
            out[field] = value
        return out

    def _by_callables(self, sample: dict[str, Any], field: str, data: bytes) -> Any:
        for fn in self.callables:
            try:
                value = fn(field, data)
            except DecodeError:
                raise
            except ValueError as exc:  # bad bytes; any other exception is a bug: it flies
                raise DecodeError(
                    f"handler {fn!r} failed: {exc}", key=sample.get("__key__", "?"), field=field
                ) from exc
            if value is not None:
                return value
        return None

    # -- the protocol: the shards given up on are part of the cursor ------------------
    def iterate(self, ctx: Context, state: Mapping[str, Any] | None = None) -> Cursor:
        if state is None:
            return _DecodeCursor(self, self._up().iterate(ctx), set())
        st = check_state(state, self.name, self.version, ("bad_urls", "source"))
        bad = st["bad_urls"]
        if not isinstance(bad, list) or not all(isinstance(u, str) for u in bad):
            raise StateDictError("decode: key 'bad_urls' must be a list of urls")
        return _DecodeCursor(self, self._up().iterate(ctx, st["source"]), set(bad))

    def params(self) -> dict[str, Any]:
        names = sorted(self.by_name)
        fns = [callable_name(fn) for fn in self.callables]
        return {
            "images": self.image_mode,
            "fields": names,
            "callables": fns,
            "handler": self.policy,
        }

    def merge(self, grid: Grid) -> dict[str, Any] | None:
        source = self._up().merge(sub_grid(grid, "source"))
        bad = sorted({u for row in grid for st in row if st is not None for u in st["bad_urls"]})
        if source is None:
            return None
        return {"stage": self.name, "version": self.version, "bad_urls": bad, "source": source}

    def lengths(self, ctx: Context, state: Mapping[str, Any] | None = None) -> list[int] | None:
        return self._up().lengths(ctx, None if state is None else state["source"])

    def carry(self, state: Mapping[str, Any] | None, epoch: int) -> dict[str, Any] | None:
        source = None if state is None else self._up().carry(state["source"], epoch)
        if source is None:
            return None
        return {"stage": self.name, "version": self.version, "bad_urls": [], "source": source}


class _DecodeCursor(Cursor):
    """Decodes its upstream's samples; skips those of shards given up on."""

    def __init__(self, stage: Decode, up: Cursor, bad: set[str]) -> None:
        super().__init__(up)
        self.stage = stage
        self.bad = bad
        # "samples": minus those skipped here (the source counted them as read)
        self.skipped = {
            "skipped_samples": 0.0,
            "skipped_shards": 0.0,
            "decode_s": 0.0,
            "samples": 0.0,
        }
        self.items = self._decode_all()

    def state(self) -> dict[str, Any]:
        return {
            "stage": self.stage.name,
            "version": self.stage.version,
            "bad_urls": sorted(self.bad),
            "source": self.upstream.state(),
        }

    def _decode_all(self) -> Iterator[dict[str, Any]]:
        policy = self.stage.policy
        bad_urls = self.bad
        skipped = self.skipped
        fruitless = Fruitless(f"decode(handler={policy!r})", self.stage._up())
        for sample in self.upstream:
            if bad_urls and sample.get("__url__") in bad_urls:
                skipped["skipped_samples"] += 1
                skipped["samples"] -= 1
                fruitless.dropped()
                continue
            t = perf_counter()
            try:
                out = self.stage.decode_sample(sample)
            except DecodeError as exc:
                skipped["decode_s"] += perf_counter() - t
                if policy == "raise":
                    raise
                skipped["skipped_samples"] += 1
                skipped["samples"] -= 1
                count_error(skipped, exc)
                if policy == "skip_shard":
                    bad_urls.add(str(sample.get("__url__")))
                    skipped["skipped_shards"] += 1
                report(policy, exc, f"sample {sample.get('__key__')!r}")
                fruitless.dropped()
                continue
            skipped["decode_s"] += perf_counter() - t
            fruitless.kept()
            yield out

    def counters(self) -> dict[str, float]:
        out = super().counters()
        for k, v in self.skipped.items():
            out[k] = out.get(k, 0) + v
        return out
