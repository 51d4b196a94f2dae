"""A lookup parses its one sample without setting up the tar reader where the sample is the
plain case (sample_parse._plain_sample); whatever that takes, the tar reader reads the same way,
and whatever it is in doubt about goes to the tar reader (which names the error)."""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardkit.errors import ShardkitError
from shardkit.format.manifest.model import Manifest
from shardkit.format.tario.index import parse_index
from shardkit.format.tario.reader import TarReader
from shardkit.read.sample_parse import _Held, _plain_sample

MakeShards = Callable[..., Manifest]


def _by_tar_reader(data: bytes, max_member: int = 1 << 30) -> Any:
    """The one sample ``data`` holds as the tar reader reads it, or its error's type."""
    try:
        reader = TarReader(_Held(data), url="s.tar", start=0, end=len(data),  # type: ignore[arg-type]
                           size=len(data), max_member=max_member)  # fmt: skip
        found = list(reader.samples())
    except ShardkitError as exc:
        return type(exc)
    return found[0][1] if len(found) == 1 and not reader.skipped_members else "not one sample"


def _tar(members: list[tuple[str, bytes]], **kwargs: Any) -> bytes:
    """A tar of ``members`` as tarfile writes it, without its end-of-archive marker."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", **kwargs) as tar:
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        end = tar.offset
    return buf.getvalue()[:end]


CASES = {
    "plain": [("a/k1.json", b"{}"), ("a/k1.bin", b"x" * 700)],
    "one member": [("k1.txt", b"hello")],
    "empty member": [("k1.txt", b""), ("k1.cls", b"3")],
    "two keys": [("k1.txt", b"a"), ("k2.txt", b"b")],
    "field twice": [("k1.txt", b"a"), ("k1.txt", b"b")],
    "no dot": [("k1", b"a"), ("k1.txt", b"b")],
    "dot first": [(".k1.txt", b"a")],
    "long name": [("d/" + "n" * 120 + ".txt", b"a")],
    "unicode name": [("dé/k1.txt", b"a")],
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_the_plain_path_takes_only_what_the_tar_reader_reads_the_same(case: str, fmt: int) -> None:
    try:
        data = _tar(CASES[case], format=fmt)
    except ValueError:
        return  # a name ustar cannot hold
    got = _plain_sample(data, 1 << 30)
    assert got is None or got == _by_tar_reader(data)
    if case == "plain" and fmt == tarfile.USTAR_FORMAT:
        assert got == {"__key__": "a/k1", "json": b"{}", "bin": b"x" * 700}
    if case in ("two keys", "field twice", "no dot", "long name"):
        assert got is None


def test_a_member_over_the_limit_goes_to_the_tar_reader() -> None:
    data = _tar(CASES["plain"])
    assert _plain_sample(data, 699) is None
    assert _by_tar_reader(data, 699) is not None  # the tar reader names the error


def test_every_byte_changed_in_a_written_sample_is_read_as_the_tar_reader_reads_it(
    make_shards: MakeShards,
) -> None:
    m = make_shards([3], tokens=40)
    base = Path(str(m.base))
    offsets = parse_index((base / ".index" / f"{m.shards[0].url}.idx").read_bytes()).offsets
    raw = (base / m.shards[0].url).read_bytes()
    sample = raw[int(offsets[1]) : int(offsets[2])]
    assert _plain_sample(sample, 1 << 30) == _by_tar_reader(sample)
    rng = random.Random(5)
    for at in range(len(sample)):
        bad = bytearray(sample)
        bad[at] ^= 1 << rng.randrange(8)
        got = _plain_sample(bytes(bad), 1 << 30)
        assert got is None or got == _by_tar_reader(bytes(bad)), at
    for cut in range(0, len(sample), 100):
        got = _plain_sample(sample[:cut], 1 << 30)
        assert got is None or got == _by_tar_reader(sample[:cut]), cut
