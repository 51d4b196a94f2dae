"""Tar I/O: header encoding, header parsing, names, the reader, the sample index."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shardkit import Manifest, ShardFormatError, ShardWriter, WriterError, read_shard
from shardkit.format.tario import check_key, member_header, split_key
from shardkit.format.tario.headers import parse_number, parse_pax
from shardkit.format.tario.index import (
    index_entry_range,
    parse_index_pair,
    read_index,
    write_index,
)
from shardkit.format.tario.names import key_problem, name_problem
from shardkit.format.tario.reader import TarReader, iter_members, iter_samples
from tests.helpers import hostile


def _tarfile_bytes(members: list[tuple[str, bytes]], fmt: int, *, dirs: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        if dirs:
            info = tarfile.TarInfo("somedir")
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# -- header encoding -------------------------------------------------------------------
def test_short_name_is_one_ustar_block_tarfile_agrees() -> None:
    hdr = member_header("a/b.txt", 5)
    assert len(hdr) == 512 and hdr[156:157] == b"0" and hdr[257:263] == b"ustar\0"
    info = tarfile.TarInfo.frombuf(hdr, "utf-8", "strict")
    assert (info.name, info.size, info.mtime, info.uid, info.mode) == ("a/b.txt", 5, 0, 0, 0o444)


def test_name_over_100_bytes_splits_into_ustar_prefix() -> None:
    name = "p" * 120 + "/" + "n" * 90 + ".txt"
    hdr = member_header(name, 1)
    assert len(hdr) == 512  # no pax header needed
    assert tarfile.TarInfo.frombuf(hdr, "utf-8", "strict").name == name


@pytest.mark.parametrize("name", ["x" * 101 + ".txt", "ключ/файл.txt", "d/" + "é" * 60 + ".bin"])
def test_names_that_do_not_fit_ustar_get_a_pax_path(name: str) -> None:
    hdr = member_header(name, 3)
    assert len(hdr) == 3 * 512 and hdr[156:157] == b"x"
    data = hdr + b"abc".ljust(512, b"\0") + hostile.EOA
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.getnames() == [name]
    assert list(iter_members(io.BytesIO(data))) == [(name, b"abc")]


def test_size_over_8gib_gets_a_pax_size_record() -> None:
    hdr = member_header("big.bin", 9 << 30)
    assert hdr[156:157] == b"x" and b" size=%d\n" % (9 << 30) in hdr


# -- header parsing --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        (b"0000644\0", 0o644),
        (b" 644 \0\0\0", 0o644),
        (b"\0" * 8, 0),
        (hostile.base256(12345), 12345),
        (hostile.base256(1 << 70), 1 << 70),
    ],
)
def test_parse_number(field: bytes, value: int) -> None:
    assert parse_number(field) == value


@pytest.mark.parametrize(
    "field", [b"-0000001\0", b"00_00001\0", b"0o00001\0", b"0000009\0", hostile.base256(-1)]
)
def test_parse_number_refuses_signed_underscored_or_non_octal(field: bytes) -> None:
    with pytest.raises(ValueError):
        parse_number(field)


def test_parse_pax_reads_records_and_trailing_nul_padding() -> None:
    body = hostile.pax_record("path", "a/ключ.txt") + hostile.pax_record("mtime", "1.5")
    assert parse_pax(body + b"\0" * 7, "u", 0) == {"path": "a/ключ.txt", "mtime": "1.5"}


# -- names and keys --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("a/b.txt", None),
        ("./a.txt", None),
        ("key:1.txt", None),
        ("", "empty"),
        ("/a.txt", "absolute"),
        ("C:a.txt", "absolute"),
        ("a/../b.txt", "escapes"),
        ("..", "escapes"),
        ("a\\b.txt", "backslash"),
        ("a\0b", "NUL"),
    ],
)
def test_name_problem(name: str, problem: str | None) -> None:
    got = name_problem(name)
    assert got is None if problem is None else (got is not None and problem in got)


@pytest.mark.parametrize(
    "key",
    ["", "/abs", "a/", "a//b", "a/./b", "a/../b", "..", "a.b", "d/x.y", "C:x", "a\\b", "\ud800"],
)
def test_keys_that_would_not_round_trip_are_refused(key: str) -> None:
    assert key_problem(key) is not None
    with pytest.raises(WriterError):
        check_key(key)


@pytest.mark.parametrize("key", ["a", "dir.v2/sub/k", "ключ", "x" * 300, "a b", ".hidden/k"])
def test_good_keys(key: str) -> None:
    assert key_problem(key) is None
    check_key(key)


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("dir/abc.tokens.npy", ("dir/abc", "tokens.npy")),
        ("d.x/abc.txt", ("d.x/abc", "txt")),
        ("abc", None),
        ("dir/.hidden", None),
        ("abc.", ("abc", "")),
    ],
)
def test_split_key(name: str, split: tuple[str, str] | None) -> None:
    assert split_key(name) == split


# -- the reader ------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_reader_reads_tarfile_formats_and_skips_directories(fmt: int) -> None:
    long_dir = "d" * 120 + "/"
    members = [
        (long_dir + "k1.txt", b"one"),
        (long_dir + "k1.json", b"{}"),
        ("k2.txt", b""),
        ("README", b"no dot: not a field"),
        ("k3.bin", bytes(range(256)) * 5),
    ]
    data = _tarfile_bytes(members, fmt, dirs=True)
    got = list(read_shard(io.BytesIO(data)))
    assert got == [
        {"__key__": long_dir + "k1", "txt": b"one", "json": b"{}"},
        {"__key__": "k2", "txt": b""},
        {"__key__": "k3", "bin": bytes(range(256)) * 5},
    ]


def test_same_field_twice_in_a_sample_is_an_error() -> None:
    data = hostile.member("k.txt", b"a") + hostile.member("k.txt", b"b") + hostile.EOA
    with pytest.raises(ShardFormatError, match="twice") as info:
        list(read_shard(io.BytesIO(data), url="dup.tar"))
    assert info.value.offset == 1024


def test_reader_reports_end_offset_and_member_offsets() -> None:
    data = hostile.good(3) + hostile.EOA
    reader = TarReader(io.BytesIO(data))
    offsets = [off for off, _ in reader.samples()]
    assert offsets == [0, 2048, 4096]
    assert reader.end_offset == 6144


def test_scan_without_data_gives_the_same_structure() -> None:
    data = _tarfile_bytes(
        [("a.txt", b"x" * 3000), ("a.bin", b""), ("b.txt", b"y" * 70)], tarfile.GNU_FORMAT
    )
    full = list(TarReader(io.BytesIO(data)).samples())
    scan = TarReader(io.BytesIO(data), keep_data=False)
    got = list(scan.samples())
    assert [o for o, _ in got] == [o for o, _ in full] == [0, 4096]
    assert [sorted(s) for _, s in got] == [sorted(s) for _, s in full]
    sizes = [{k: len(v) for k, v in s.items() if k != "__key__"} for _, s in full]
    assert [{k: v for k, v in s.items() if k != "__key__"} for _, s in got] == sizes
    assert scan.end_offset == 5120  # 3584 + 512 + 1024 bytes of members before it


def test_missing_shard_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ShardFormatError, match="cannot open") as info:
        list(read_shard(tmp_path / "nope.tar"))
    assert info.value.url == str(tmp_path / "nope.tar")


def test_range_read_must_reach_its_end() -> None:
    data = hostile.good(3)  # no end marker, read as a range
    assert len(list(iter_samples(io.BytesIO(data), end=len(data)))) == 3
    with pytest.raises(ShardFormatError, match="before byte") as info:
        list(iter_samples(io.BytesIO(data[:4096]), end=len(data)))
    assert info.value.offset == 4096


# -- the sample index ------------------------------------------------------------------
@pytest.fixture(params=[None, "zstd"])
def indexed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Manifest, list[dict]]:
    rng = np.random.default_rng(1)
    samples = [
        {"__key__": f"k{i:03d}", "bin": rng.bytes(int(rng.integers(0, 3000))), "cls": b"%d" % i}
        for i in range(40)
    ]
    with ShardWriter(tmp_path, maxcount=25, compress=request.param) as w:
        for s in samples:
            w.write(s)
    return tmp_path, Manifest.load(tmp_path / "manifest.json"), samples


def test_index_matches_real_offsets_and_range_reads_give_samples_i_to_j(
    indexed: tuple[Path, Manifest, list[dict]],
) -> None:
    out, manifest, samples = indexed
    first = 0
    for entry in manifest.shards:
        assert entry.index is not None
        off = read_index((out / entry.index).read_bytes()).tolist()
        assert len(off) == entry.nsamples + 1
        path = out / entry.url
        if entry.url.endswith(".tar"):
            with open(path, "rb") as f:
                reader = TarReader(f)
                assert [o for o, _ in reader.samples()] == off[:-1]
                assert reader.end_offset == off[-1]
        mine = samples[first : first + entry.nsamples]
        for i, j in [(0, 1), (0, entry.nsamples), (3, 7), (entry.nsamples - 1, entry.nsamples)]:
            got = list(read_shard(path, start=off[i], end=off[j]))
            assert got == mine[i:j]
        first += entry.nsamples
    assert first == len(samples)


def test_index_pair_lookup() -> None:
    data = write_index([0, 1536, 4096], 9216)
    lo, hi = index_entry_range(1)
    assert parse_index_pair(data[lo:hi]) == (1536, 4096)
    assert read_index(data).tolist() == [0, 1536, 4096, 9216]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"SKIDX0", "truncated"),
        (b"NOTINDEX" + bytes(16), "magic"),
        (write_index([0, 512], 1024)[:-8], "should be"),
        (write_index([0, 512], 1024) + bytes(8), "should be"),
        (write_index([512, 0], 1024), "increasing"),
    ],
)
def test_malformed_index(data: bytes, match: str) -> None:
    with pytest.raises(ShardFormatError, match=match):
        read_index(data, url="x.idx")


@pytest.mark.parametrize("damage", ["garbage", "flip"])
def test_corrupt_zstd_shard_is_a_format_error(tmp_path: Path, damage: str) -> None:
    with ShardWriter(tmp_path, compress="zstd") as w:
        for i in range(20):
            w.write({"__key__": f"k{i}", "txt": b"some text %d " % i * 50})
    path = tmp_path / "data-000000.tar.zst"
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data[:8] = b"NOTZSTD!"
    else:  # the frame checksum catches what the tar layer cannot see
        data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match="zstd") as info:
        list(read_shard(path))
    assert info.value.url == str(path) and info.value.offset is not None
