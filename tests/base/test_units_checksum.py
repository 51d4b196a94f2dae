"""Sizes people write, and checksums written as ``algo:hex``."""

from __future__ import annotations

import hashlib
import io

import pytest
import xxhash

from shardkit import ConfigError
from shardkit.format.checksum import ALGORITHMS, file_checksum, new_hasher, split_checksum
from shardkit.units import format_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("1GB", 10**9),
        ("512MiB", 512 * 2**20),
        (" 1.5 kb ", 1500),
        ("4096", 4096),
        ("1.5e9", 1_500_000_000),
        (123, 123),
        (2.0**40, 2**40),
        ("2TiB", 2 * 2**40),
    ],
)
def test_parse_size(text: str | int | float, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize(
    "bad", ["", "lots", "1XB", "-5", -1, True, float("nan"), "inf", "1e400", float("inf")]
)
def test_parse_size_refuses(bad: object) -> None:
    with pytest.raises(ConfigError):
        parse_size(bad)  # type: ignore[arg-type]


def test_format_bytes() -> None:
    assert format_bytes(999) == "999 B"
    assert format_bytes(1_500_000) == "1.50 MB"
    assert format_bytes(3e15) == "3000.00 TB"


def _reference(algo: str, data: bytes) -> str:
    if algo == "xxh3_128":
        return xxhash.xxh3_128(data).hexdigest()
    return hashlib.new(algo, data).hexdigest()


@pytest.mark.parametrize("algo", [a for a in ALGORITHMS if a != "blake3"])
@pytest.mark.parametrize("size", [0, 1, 4 << 20, (4 << 20) + 7])
def test_file_checksum_matches_reference(algo: str, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    seen: list[int] = []
    got = file_checksum(io.BytesIO(data), algo, progress=seen.append)
    assert got == (f"{algo}:{_reference(algo, data)}", size)
    assert sum(seen) == size


class _ReadOnly:
    """A stream with read() and no readinto()."""

    def __init__(self, data: bytes) -> None:
        self._f = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)


def test_file_checksum_without_readinto() -> None:
    data = b"abc" * 100_000
    got = file_checksum(_ReadOnly(data), "sha256", chunk=4096)  # type: ignore[arg-type]
    assert got == ("sha256:" + hashlib.sha256(data).hexdigest(), len(data))


def test_split_checksum_checks_the_digest() -> None:
    good = "sha256:" + "AB" * 32
    assert split_checksum(good) == ("sha256", "ab" * 32)
    assert split_checksum("xxh3_128:" + "0" * 32)[0] == "xxh3_128"
    for bad in ["sha256", "sha256:", "crc:00", "sha256:" + "g" * 64, "sha256:" + "a" * 63, ""]:
        with pytest.raises(ConfigError):
            split_checksum(bad)


def test_unknown_algorithm() -> None:
    with pytest.raises(ConfigError, match="sha256"):
        new_hasher("crc32")
