"""What a manifest's field statistics say about a token set: tokens per sample, dtype.

The manifest counts, per field, the samples having it and their payload bytes. For an
``npy`` token field the payload is an npy header and ``n`` tokens of the array's dtype:
the dtype and header length are read from the first sample that has the field (one
short read of the first shard), and the manifest's bytes give the token count.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit._types import ObjectRef
from shardkit.errors import ConfigError, DecodeError
from shardkit.format.manifest.model import Manifest
from shardkit.io import Opener

__all__ = ["TokenField", "guess_token_field", "token_field"]


@dataclass(frozen=True)
class TokenField:
    """A token field and what the manifest says of it.

    Args:
        name: the field, e.g. ``tokens.npy``.
        dtype: the tokens' numpy dtype (``int32``).
        header_bytes: bytes of npy header per sample (0 for raw token bytes).
        tokens: tokens in the whole set (from the manifest's bytes).
        samples: samples in the set (all of them, with the field or not).
    """

    name: str
    dtype: str
    header_bytes: int
    tokens: int
    samples: int

    @property
    def itemsize(self) -> int:
        return int(np.dtype(self.dtype).itemsize)

    @property
    def tokens_per_sample(self) -> float:
        return self.tokens / self.samples if self.samples else 0.0


def guess_token_field(m: Manifest) -> str | None:
    """The token field: an npy field named like tokens (``tokens.npy``, ``input_ids.npy``),
    else the only npy field; None when there is none."""
    npy = [f for f in m.fields if f.endswith(".npy")]
    named = [f for f in npy if "token" in f or "input_ids" in f or f.startswith("ids")]
    if named:
        return named[0]
    return npy[0] if len(npy) == 1 else None


def _first_payload(m: Manifest, opener: Opener, field: str, tar_policy: str) -> bytes:
    """The field's bytes in the first sample that has it (of the first shards)."""
    from shardkit.format.compression import open_tar
    from shardkit.format.tario.reader import iter_samples

    for entry in m.shards[:4]:
        url = m.resolve(entry.url)
        with contextlib.ExitStack() as stack:
            raw: Any = stack.enter_context(opener.open(ObjectRef(url, entry.size, entry.checksum)))
            f, _ = stack.enter_context(open_tar(raw, url=url))  # compression by magic bytes
            for _, sample in iter_samples(f, url=url, policy=tar_policy):
                value = sample.get(field)
                if isinstance(value, bytes | bytearray | memoryview):
                    return bytes(value)
    raise ConfigError(f"no sample of the first shards has the field {field!r}")


def _npy_header(data: bytes, field: str) -> tuple[str, int]:
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            _, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            _, _, dtype = np.lib.format.read_array_header_2_0(f)
    except ValueError as exc:
        raise DecodeError(f"the token field is not an npy array: {exc}", field=field) from exc
    return str(dtype.name), f.tell()


def token_field(
    m: Manifest,
    opener: Opener,
    field: str | None = None,
    dtype: str | None = None,
    *,
    tar_policy: str = "strict",
) -> TokenField:
    """The token statistics of ``field`` (guessed when None). ``dtype`` skips the read of
    one sample (the npy header is then taken to be 128 bytes, numpy's for 1-D arrays),
    read under ``tar_policy``."""
    name = field or guess_token_field(m)
    if name is None:
        raise ConfigError(
            f"no token field in the manifest (fields: {sorted(m.fields)}); give --token-field"
        )
    stats = m.fields.get(name)
    if stats is None:
        raise ConfigError(f"the manifest has no field {name!r} (fields: {sorted(m.fields)})")
    npy = name.endswith(".npy")
    header = 0
    if dtype is None:
        if not npy:
            raise ConfigError(f"field {name!r} is not npy: give --token-dtype")
        dtype, header = _npy_header(_first_payload(m, opener, name, tar_policy), name)
    elif npy:
        header = 128
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        raise ConfigError(f"unknown numpy dtype {dtype!r}") from None
    payload = int(stats["bytes"]) - header * int(stats["count"])
    return TokenField(name, str(np.dtype(dtype).name), header, payload // itemsize, m.total_samples)
