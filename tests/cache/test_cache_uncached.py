"""A shard the node cache cannot hold is still verified piece by piece, against the real
Range server with a corrupt byte: no room under the limit, or a cache dir that cannot be
used."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from shardkit._types import ObjectRef
from shardkit.cache import make_opener
from shardkit.errors import ChecksumError
from shardkit.format.manifest.model import Manifest
from shardkit.io import load_manifest
from tests.helpers.servers import RangeServer

pytestmark = pytest.mark.integration

PIECE = 128_000


@pytest.fixture
def shard(make_shards: Callable[..., Manifest]) -> Manifest:
    return make_shards([40], tokens=8000, subdir="big", piece_size="128KB")


@pytest.fixture
def server(shard: Manifest) -> Iterator[RangeServer]:
    with RangeServer(str(shard.base)) as srv:
        yield srv


@pytest.fixture(params=["no room", "no cache dir"])
def open_range(
    request: pytest.FixtureRequest, shard: Manifest, server: RangeServer, tmp_path: Path
) -> Callable[[int, int], BinaryIO]:
    """Open ``[start, end)`` of the shard through a caching opener that cannot cache it."""
    if request.param == "no room":
        opener = make_opener(cache_dir=tmp_path / "cache", cache_limit=PIECE)
    else:
        (tmp_path / "file").write_bytes(b"")  # a cache dir that is a file: not usable
        opener = make_opener(cache_dir=tmp_path / "file" / "cache")
    m = load_manifest(server.url("manifest.json"), opener)
    e = m.shards[0]
    assert e.pieces is not None and e.pieces.size == PIECE
    url = m.resolve(e.url)
    return lambda start, end: opener.open(
        ObjectRef(url, e.size, e.checksum, e.pieces), start=start, end=end
    )


def _bytes(shard: Manifest) -> bytes:
    return (Path(str(shard.base)) / shard.shards[0].url).read_bytes()


def test_a_corrupt_piece_around_an_uncached_range_is_fetched_again(
    shard: Manifest, server: RangeServer, open_range: Callable[[int, int], BinaryIO]
) -> None:
    start, end = 3 * PIECE + 100, 5 * PIECE + 50
    server.add_fault("/data-*", "corrupt", at=3 * PIECE + 5)  # before the range, in its piece
    with open_range(start, end) as f:
        assert f.read() == _bytes(shard)[start:end]
    ranges = [r.range for r in server.requests("/data-*")]
    # whole pieces 3..5 in one request, then piece 3 again on its own
    assert ranges == [f"bytes={3 * PIECE}-{6 * PIECE - 1}", f"bytes={3 * PIECE}-{4 * PIECE - 1}"]


def test_a_piece_corrupt_twice_is_a_checksum_error_and_none_of_it_is_read(
    shard: Manifest, server: RangeServer, open_range: Callable[[int, int], BinaryIO]
) -> None:
    start, end = 3 * PIECE + 100, 5 * PIECE + 50
    server.add_fault("/data-*", "corrupt", at=4 * PIECE + 7, times=2)
    got = bytearray()
    with pytest.raises(ChecksumError) as info, open_range(start, end) as f:
        while chunk := f.read1(1000):  # what is buffered first: every byte handed out
            got += chunk
    assert f"piece 4 (bytes {4 * PIECE}..{5 * PIECE})" in str(info.value)
    assert info.value.url is not None and info.value.url.endswith(shard.shards[0].url)
    assert bytes(got) == _bytes(shard)[start : 4 * PIECE]  # piece 3's part, then nothing


def test_a_whole_uncached_read_is_verified_piece_by_piece(
    shard: Manifest, server: RangeServer, open_range: Callable[[int, int], BinaryIO]
) -> None:
    size = shard.shards[0].size
    server.add_fault("/data-*", "corrupt", at=size - 3)  # in the last piece
    with open_range(0, size) as f:
        assert f.read() == _bytes(shard)
    assert len(server.requests("/data-*")) == 2
