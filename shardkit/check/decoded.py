"""Decoded fields checked (``verify --decode``): every image, npy, json and text field of
a shard is decoded as a reader would, and a field that does not decode is named by its
sample's key, its field and the sample's byte offset (a truncated JPEG, text named
``.jpg``, a broken ``.npy``, invalid JSON or UTF-8 pass the checksum and the tar parse,
and failed only at decode time in training)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from shardkit.format.compression import open_tar
from shardkit.format.images import IMAGE_EXTS
from shardkit.format.tario.reader import TarReader

__all__ = ["BadField", "bad_fields", "field_problem"]

BadField = tuple[int, str, str, str]
"""``(sample offset, key, field, why)``."""

_TEXT = ("txt", "text")


def _image(data: bytes) -> None:
    from PIL import Image  # Pillow: only when an image field is checked

    with Image.open(io.BytesIO(data)) as im:
        im.load()  # the whole image: a truncated JPEG fails here, not at open


def field_problem(field: str, data: bytes) -> str | None:
    """Why ``data`` does not decode as its field's extension says, or None when it does
    (or when shardkit has no decoder for it)."""
    ext = field.rsplit(".", 1)[-1].lower()
    try:
        if ext in IMAGE_EXTS:
            _image(data)
        elif ext == "npy":
            np.load(io.BytesIO(data), allow_pickle=False)
        elif ext == "json":
            json.loads(data)
        elif ext in _TEXT:
            data.decode("utf-8")
        else:
            return None
    except (OSError, ValueError, SyntaxError, EOFError, RecursionError) as exc:
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - Pillow's DecompressionBombError and kin
        return f"{type(exc).__name__}: {exc}"
    return None


def bad_fields(
    f: BinaryIO, url: str, size: int | None, *, tar_policy: str = "strict"
) -> Iterator[BadField]:
    """Every field of the shard ``f`` that does not decode (read under ``tar_policy``)."""
    with open_tar(f, url=url) as (tar, kind):
        reader = TarReader(tar, url=url, size=size if kind is None else None, policy=tar_policy)
        for off, sample in reader.samples():
            key = str(sample["__key__"])
            for name, value in sample.items():
                if name.startswith("__") or not isinstance(value, (bytes, bytearray, memoryview)):
                    continue
                why = field_problem(name, bytes(value))
                if why is not None:
                    yield off, key, name, why
