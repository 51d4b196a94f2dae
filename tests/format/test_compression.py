"""Whole-shard compression is told by magic bytes; what shardkit cannot read is named."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
from pathlib import Path

import pytest
import zstandard

from shardkit.errors import FetchError, ShardFormatError
from shardkit.format.compression import compressed_name, open_tar, sniff
from shardkit.format.tario.reader import iter_samples, read_shard
from shardkit.write.writer import ShardWriter
from tests.helpers.data import make_samples
from tests.helpers.streams import OneWay


def _plain_shard(tmp_path: Path, n: int = 7) -> tuple[Path, list[dict[str, object]]]:
    with ShardWriter(tmp_path / "plain", maxcount=10_000) as w:
        for s in make_samples(n):
            w.write(s)
    path = tmp_path / "plain" / "data-000000.tar"
    return path, list(read_shard(path))


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"\x28\xb5\x2f\xfd\x00\x00", "zstd"),
        (b"\x1f\x8b\x08\x00\x00\x00", "gzip"),
        (b"BZh91AY", "bzip2"),
        (b"\xfd7zXZ\x00", "xz"),
        (b"\x04\x22\x4d\x18\x00\x00", "lz4"),
        (b"data-0", None),
        (b"", None),
    ],
)
def test_sniff(head: bytes, kind: str | None) -> None:
    assert sniff(head) == kind


@pytest.mark.parametrize(
    ("url", "packed"),
    [
        ("a/data-000000.tar.gz", True),
        ("https://h/x.TGZ?sig=1", True),
        ("s3://b/x.tar.zst", True),
        ("x.tar", False),
        ("x.tar?download=x.gz", False),
    ],
)
def test_compressed_name(url: str, packed: bool) -> None:
    assert compressed_name(url) is packed


@pytest.mark.parametrize("pack", ["gzip", "zstd", None])
@pytest.mark.parametrize("seekable", [True, False])
def test_open_tar_gives_the_tar_bytes(pack: str | None, seekable: bool) -> None:
    tar = bytes(range(256)) * 40
    data = {"gzip": gzip.compress, "zstd": zstandard.compress, None: bytes}[pack](tar)
    f = io.BytesIO(data) if seekable else OneWay(data)
    with open_tar(f, url="x") as (s, kind):  # type: ignore[arg-type]
        assert kind == pack
        if pack is None and seekable:
            assert s is f  # a plain file keeps its size and seeks
        got = b""
        while chunk := s.read(1000):
            got += chunk
    assert got == tar


@pytest.mark.parametrize("name", ["data-000000.tar.gz", "data-000000.tgz", "renamed.tar"])
def test_gzip_shard_reads_by_magic_whatever_its_name(tmp_path: Path, name: str) -> None:
    path, samples = _plain_shard(tmp_path)
    target = tmp_path / name
    target.write_bytes(gzip.compress(path.read_bytes()))
    assert list(read_shard(target)) == samples
    with open(target, "rb") as f:
        assert list(read_shard(OneWay(f.read()), url=name)) == samples  # type: ignore[arg-type]


def test_gzip_range_read_from_decompressed_offsets(tmp_path: Path) -> None:
    path, samples = _plain_shard(tmp_path)
    with open(path, "rb") as f:
        offsets = [off for off, _ in iter_samples(f)]
    target = tmp_path / "x.tar.gz"
    target.write_bytes(gzip.compress(path.read_bytes()))
    assert list(read_shard(target, start=offsets[2], end=offsets[5])) == samples[2:5]


@pytest.mark.parametrize(("pack", "kind"), [(bz2.compress, "bzip2"), (lzma.compress, "xz")])
def test_unknown_compression_is_named(tmp_path: Path, pack: object, kind: str) -> None:
    path, _ = _plain_shard(tmp_path)
    target = tmp_path / "x.tar"
    target.write_bytes(pack(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(ShardFormatError, match=f"compressed with {kind}") as info:
        list(read_shard(target))
    assert info.value.offset == 0 and info.value.url == str(target)


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_corrupt_gzip_is_a_format_error(tmp_path: Path, damage: str) -> None:
    path, _ = _plain_shard(tmp_path, n=50)
    data = bytearray(gzip.compress(path.read_bytes()))
    if damage == "cut":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    target = tmp_path / "x.tar.gz"
    target.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError) as info:
        list(read_shard(target))
    assert info.value.url == str(target)
    assert info.value.offset is not None


def test_multi_member_gzip_with_zero_padding_reads_whole(tmp_path: Path) -> None:
    path, samples = _plain_shard(tmp_path, n=30)
    data = path.read_bytes()
    cut = len(data) // 3
    packed = gzip.compress(data[:cut]) + b"\0" * 700 + gzip.compress(data[cut:]) + b"\0" * 9
    target = tmp_path / "multi.tar.gz"
    target.write_bytes(packed)
    assert list(read_shard(target)) == samples
    target.write_bytes(gzip.compress(data) + b"garbage")
    with pytest.raises(ShardFormatError, match="not gzip"):
        list(read_shard(target))


class _Dropping(io.RawIOBase):
    """A network stream that fails after ``n`` bytes, as FetchError after the retries."""

    def __init__(self, data: bytes, n: int) -> None:
        self._src = io.BytesIO(data)
        self._left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._left <= 0:
            raise FetchError("connection reset", url="http://h/x.tar.gz")
        got = self._src.readinto(memoryview(b)[: self._left])
        self._left -= got
        return got


def test_a_fetch_error_under_gzip_stays_a_fetch_error(tmp_path: Path) -> None:
    path, _ = _plain_shard(tmp_path, n=30)
    packed = gzip.compress(path.read_bytes())
    stream = io.BufferedReader(_Dropping(packed, len(packed) // 2))
    with pytest.raises(FetchError):
        list(read_shard(stream, url="http://h/x.tar.gz"))  # type: ignore[arg-type]
