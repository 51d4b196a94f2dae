"""Hostile, broken and random tars: always ShardFormatError naming shard and offset, fast."""

from __future__ import annotations

import io
import os
import re
import threading
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardkit import ShardFormatError, read_shard
from shardkit.format.tario.reader import TarReader, iter_samples
from tests.helpers import hostile
from tests.helpers.hostile import Case
from tests.helpers.streams import OneWay

CASES = hostile.cases()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_file_names_shard_and_offset(case: Case, tmp_path: Path) -> None:
    path = tmp_path / f"{case.name}.tar"
    path.write_bytes(case.data)
    with pytest.raises(ShardFormatError) as info:
        list(read_shard(path))
    err = info.value
    assert err.url == str(path)
    assert err.offset == case.offset, str(err)
    assert re.search(case.match, str(err)), str(err)
    assert f"byte {case.offset}" in str(err) and str(path) in str(err)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_stream_names_offset(case: Case) -> None:
    with pytest.raises(ShardFormatError) as info:
        list(read_shard(OneWay(case.data), url="remote/shard.tar"))
    assert info.value.url == "remote/shard.tar"
    assert info.value.offset == case.offset, str(info.value)
    assert re.search(case.match, str(info.value)), str(info.value)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_structure_scan_names_the_same_offset(case: Case) -> None:
    """Passing over member data (verify --deep) finds the same problem at the same place."""
    reader = TarReader(OneWay(case.data), url="scan.tar", keep_data=False)
    with pytest.raises(ShardFormatError) as info:
        list(reader.samples())
    assert info.value.offset == case.offset, str(info.value)


def test_cases_cover_every_kind() -> None:
    names = {c.name for c in CASES}
    for kind in ("absolute", "dotdot", "symlink", "hardlink", "chardev", "blockdev", "fifo"):
        assert kind in names
    # each case is bad only where it says: the good samples before it parse
    for case in CASES:
        lead = case.data[: case.offset] + hostile.EOA
        assert len(list(read_shard(OneWay(lead)))) == 2


def _pipe_with(data: bytes) -> tuple[io.FileIO, threading.Thread]:
    r, w = os.pipe()

    def feed() -> None:
        with open(w, "wb", buffering=0) as f:
            f.write(data)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    return open(r, "rb", buffering=0), t


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "size_field",
    [hostile.octal(0o77777777777, 12), hostile.base256(1 << 80), hostile.base256(8 << 30)],
    ids=["octal-8GB", "base256-2^80", "base256-8GiB"],
)
def test_huge_claim_on_a_pipe_uses_little_memory(size_field: bytes) -> None:
    data = hostile.good(1) + hostile.header("big.bin", size_field=size_field) + b"q" * 10_000
    f, feeder = _pipe_with(data)
    tracemalloc.start()
    try:
        with f, pytest.raises(ShardFormatError) as info:
            list(iter_samples(f, url="pipe-shard", max_member=1 << 90))  # no limit
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    feeder.join()
    assert info.value.offset == len(hostile.good(1))
    assert "truncated" in str(info.value)
    assert peak < 4 << 20, f"peak {peak} bytes"


@pytest.mark.timeout(20)
def test_huge_pax_record_is_refused_before_reading() -> None:
    data = hostile.good(1) + hostile.pax(b"", size=1 << 40) + b"z" * 5000
    f, feeder = _pipe_with(data)
    tracemalloc.start()
    try:
        with f, pytest.raises(ShardFormatError, match="too large"):
            list(iter_samples(f, url="pipe-shard"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    feeder.join()
    assert peak < 4 << 20


@pytest.mark.timeout(60)
@given(st.binary(min_size=1, max_size=4096))
def test_random_bytes_raise_shard_format_error(data: bytes) -> None:
    try:
        samples = list(read_shard(OneWay(data), url="random.tar"))
    except ShardFormatError as err:
        assert err.url == "random.tar"
        assert err.offset is not None and 0 <= err.offset <= len(data)
    else:  # only an empty archive (a zero block, then zeros or the end) can parse
        assert data[:512] == b"\0" * 512 and not any(data[512:1024]) and samples == []


_VALID = hostile.good(3) + hostile.EOA
_PARSE_END = len(hostile.good(3))


@pytest.mark.timeout(60)
@given(st.integers(0, len(_VALID) - 1), st.integers(0, 255))
def test_a_changed_byte_never_escapes_as_another_error(pos: int, value: int) -> None:
    data = bytearray(_VALID)
    data[pos] = value
    try:
        list(read_shard(OneWay(bytes(data)), url="flipped.tar"))
    except ShardFormatError as err:
        assert err.offset is not None and 0 <= err.offset <= len(data)


@pytest.mark.timeout(60)
@given(st.integers(0, len(_VALID) - 1))
def test_every_truncation_is_caught(cut: int) -> None:
    """Down to the last byte of the end-of-archive marker's first zero block; a cut inside
    the second one leaves one zero block and the end, which tarfile and GNU tar take as
    the end too (and every sample is whole), so it reads."""
    if cut >= _PARSE_END + 512:
        assert len(list(read_shard(OneWay(_VALID[:cut]), url="cut.tar"))) == 3
        return
    with pytest.raises(ShardFormatError) as info:
        list(read_shard(OneWay(_VALID[:cut]), url="cut.tar"))
    # the error points at the member whose header or data was cut, never past the data
    assert info.value.offset is not None and info.value.offset <= cut
    assert info.value.offset % 512 == 0
