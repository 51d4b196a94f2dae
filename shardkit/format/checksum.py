"""Checksums written as ``algo:hex``.

``sha256`` is the default: universal, and what most tools can check. ``xxh3_128`` (via the
``xxhash`` package) runs ~4 GB/s per core against sha256's ~0.85 GB/s and is enough to
catch corruption (it is not a defence against someone who forges shards); ``blake3`` is
used when its package is installed, and ``md5`` / ``sha1`` / ``blake2b`` come from hashlib.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import BinaryIO, Protocol

from shardkit.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "DIGEST_HEX_LENGTHS",
    "Hasher",
    "file_checksum",
    "new_hasher",
    "split_checksum",
]

ALGORITHMS = ("sha256", "xxh3_128", "blake3", "blake2b", "sha1", "md5")


class Hasher(Protocol):
    """The subset of the hashlib interface shardkit uses."""

    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


def _xxh3() -> Hasher:
    try:
        import xxhash
    except ImportError as exc:  # pragma: no cover - xxhash is a dependency
        raise ConfigError("checksum xxh3_128 needs the 'xxhash' package") from exc
    h: Hasher = xxhash.xxh3_128()
    return h


def _blake3() -> Hasher:
    try:
        import blake3  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise ConfigError("checksum blake3 needs the 'blake3' package") from exc
    h: Hasher = blake3.blake3()  # type: ignore[assignment,unused-ignore]
    return h


_FACTORIES: dict[str, Callable[[], Hasher]] = {
    "sha256": hashlib.sha256,
    "sha1": hashlib.sha1,
    "md5": hashlib.md5,
    "blake2b": hashlib.blake2b,
    "xxh3_128": _xxh3,
    "blake3": _blake3,
}


def new_hasher(algo: str) -> Hasher:
    """Return a fresh hasher for ``algo`` (one of :data:`ALGORITHMS`)."""
    try:
        factory = _FACTORIES[algo]
    except KeyError:
        raise ConfigError(
            f"unknown checksum algorithm {algo!r}; choose one of {', '.join(ALGORITHMS)}"
        ) from None
    return factory()


DIGEST_HEX_LENGTHS = {
    "sha256": 64,
    "xxh3_128": 32,
    "blake3": 64,
    "blake2b": 128,
    "sha1": 40,
    "md5": 32,
}
_HEX = frozenset("0123456789abcdef")


def split_checksum(value: str) -> tuple[str, str]:
    """Split ``"sha256:ab12..."`` into ``("sha256", "ab12...")``, checking the digest."""
    algo, sep, digest = value.partition(":")
    if not sep or algo not in _FACTORIES or not digest:
        raise ConfigError(f"checksum must look like 'sha256:<hex>', got {value!r}")
    digest = digest.lower()
    if not _HEX.issuperset(digest) or len(digest) != DIGEST_HEX_LENGTHS[algo]:
        raise ConfigError(
            f"checksum {value!r}: a {algo} digest is {DIGEST_HEX_LENGTHS[algo]} hex digits"
        )
    return algo, digest


def file_checksum(
    f: BinaryIO,
    algo: str,
    *,
    chunk: int = 4 << 20,
    progress: Callable[[int], object] | None = None,
) -> tuple[str, int]:
    """Hash a whole binary stream; return ``("algo:hex", nbytes)``."""
    h = new_hasher(algo)
    total = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    readinto = getattr(f, "readinto", None)
    while True:
        if readinto is not None:
            n = readinto(buf)
            if not n:
                break
            h.update(view[:n])
        else:
            data = f.read(chunk)
            if not data:
                break
            n = len(data)
            h.update(data)
        total += n
        if progress is not None:
            progress(n)
    return f"{algo}:{h.hexdigest()}", total
