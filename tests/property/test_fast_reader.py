"""The sample loop's fast paths give exactly what the general path gives, on any bytes.

The reference groups :meth:`TarReader.members` (the general path, which names every error)
into samples; the fast loop must yield the same samples at the same offsets and fail with
the same error at the same byte, for tars as ``tarfile`` writes them (pax per member, as
``webdataset.ShardWriter`` does; GNU long names) and for any damage to them.
"""

from __future__ import annotations

import functools
import io
import tarfile
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardkit.errors import ShardFormatError
from shardkit.format.tario import buffer
from shardkit.format.tario.headers import (
    checksum_ok,
    octal_field,
    plain_header,
    plain_member,
    sum_matches,
)
from shardkit.format.tario.names import fast_name, name_problem, normal_name
from shardkit.format.tario.reader import TarReader

Outcome = tuple[list[tuple[int, dict[str, object]]], tuple[str, int | None] | None]


def _general(
    data: bytes, keep: bool = True, limit: int = 1 << 30, size: int | None = None
) -> Outcome:
    out: list[tuple[int, dict[str, object]]] = []
    reader = TarReader(io.BytesIO(data), url="s.tar", keep_data=keep, max_member=limit, size=size)
    current: dict[str, object] = {}
    start = 0
    try:
        for name, value in reader.members():
            slash = name.rfind("/")
            dot = name.find(".", slash + 1)
            if dot <= slash + 1:
                continue
            key, field = name[:dot], name[dot + 1 :]
            if current.get("__key__") != key:
                if current:
                    out.append((start, current))
                current, start = {"__key__": key}, reader.member_offset
            if field in current:
                raise ShardFormatError(
                    f"sample {key!r} has field {field!r} twice",
                    url="s.tar",
                    offset=reader.member_offset,
                )
            current[field] = value
    except ShardFormatError as exc:
        return out, (str(exc), exc.offset)
    if current:
        out.append((start, current))
    return out, None


def _fast(data: bytes, keep: bool = True, limit: int = 1 << 30) -> Outcome:
    return _samples(TarReader(io.BytesIO(data), url="s.tar", keep_data=keep, max_member=limit))


def _samples(reader: TarReader) -> Outcome:
    out: list[tuple[int, dict[str, object]]] = []
    try:
        for item in reader.samples():
            out.append(item)
    except ShardFormatError as exc:
        return out, (str(exc), exc.offset)
    return out, None


def _tar(names: list[str], sizes: list[int], fmt: int, mtime: float) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = sizes[i % len(sizes)]
            info.mtime = mtime  # a float, as webdataset gives: one pax record per member
            info.uname = info.gname = "bigdata"
            tf.addfile(info, io.BytesIO(bytes([i % 251]) * info.size))
    return buf.getvalue()


_part = st.text(alphabet="abcxyz0189_-é", min_size=1, max_size=90)
_names = st.lists(
    st.tuples(
        st.sampled_from(["", "./", "x//"]),  # names the general path normalises
        st.lists(_part, min_size=1, max_size=3),
        st.sampled_from(["json", "npy", "a.b"]),
    ),
    min_size=1,
    max_size=6,
).map(lambda xs: [lead + "/".join(parts) + "." + ext for lead, parts, ext in xs])
_formats = st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])


def _safe_tar(names: list[str], sizes: list[int], fmt: int, mtime: float) -> bytes:
    try:
        return _tar(names, sizes, fmt, mtime)
    except ValueError:  # a name ustar cannot hold
        return b""


_tars = st.builds(
    _safe_tar,
    _names,
    st.lists(st.integers(0, 1500), min_size=1, max_size=3),
    _formats,
    st.sampled_from([1700000000.25, 1700000000.0]),
).filter(bool)


@given(data=_tars, keep=st.booleans(), limit=st.sampled_from([1 << 30, 1000]))
def test_fast_loop_equals_general_path(data: bytes, keep: bool, limit: int) -> None:
    assert _fast(data, keep, limit) == _general(data, keep, limit)


@given(data=_tars, pos=st.integers(0, 1 << 16), value=st.integers(0, 255))
def test_a_changed_byte_fails_alike(data: bytes, pos: int, value: int) -> None:
    damaged = bytearray(data)
    damaged[pos % len(data)] = value
    assert _fast(bytes(damaged)) == _general(bytes(damaged))


@given(data=_tars, cut=st.integers(0, 1 << 16))
def test_a_truncation_fails_alike(data: bytes, cut: int) -> None:
    short = data[: cut % len(data)]
    assert _fast(short) == _general(short)


_RECORD = st.sampled_from(
    [
        b"mtime=1700000000.5",
        b"atime=1",
        b"path=a/b.json",
        b"path=../x.json",
        b"path=/abs.json",
        b"path=a\\b.json",
        b"path=",
        b"size=3",
        b"size=\xd9\xa3",  # ARABIC-INDIC DIGIT THREE, a digit to str.isdigit
        b"size=99999999999999999999",
        b"hdrcharset=BINARY",
        b"GNU.sparse.size=5",
        b"comment=x=y",
        b"=v",
    ]
)


def _pax_member(records: list[bytes], name: bytes, payload: bytes) -> bytes:
    body = b""
    for r in records:
        n = len(r) + 3
        n = len(r) + 2 + len(str(n))  # "%d %s\n" counts its own digits
        body += str(n).encode() + b" " + r + b"\n"
    return _header(b"././@PaxHeader", len(body), b"x") + _pad(body) + _member(name, payload)


def _header(name: bytes, size: int, typeflag: bytes) -> bytes:
    info = tarfile.TarInfo(name.decode())
    info.size = size
    info.type = typeflag
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def _member(name: bytes, payload: bytes) -> bytes:
    return _header(name, len(payload), b"0") + _pad(payload)


@given(records=st.lists(_RECORD, max_size=4), payload=st.binary(max_size=600))
def test_hand_made_pax_records_fail_or_pass_alike(records: list[bytes], payload: bytes) -> None:
    data = _pax_member(records, b"k.bin", payload) + _member(b"k.txt", b"t") + b"\0" * 1024
    assert _fast(data) == _general(data)


def _counted(calls: list[int], general: Any) -> Any:
    calls.append(1)
    return general()


def test_tarfile_pax_and_gnu_members_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [f"dir/s{i:04d}.{ext}" for i in range(50) for ext in ("json", "tokens.npy")]
    names.append("d/" + "long" * 40 + ".json")  # a pax path / a GNU long name
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        reader = TarReader(io.BytesIO(_tar(names, [100, 4000], fmt, 1700000000.5)))
        calls = []
        general = reader.general.next_member
        counted = functools.partial(_counted, calls, general)
        monkeypatch.setattr(reader.general, "next_member", counted)
        assert len(list(reader.samples())) == 51
        assert len(calls) == 1  # only the end-of-archive marker


def test_a_size_with_digits_8_or_9_is_a_format_error() -> None:
    data = bytearray(_member(b"k.bin", b"x" * 10) + b"\0" * 1024)
    data[124:136] = b"00000000019\0"
    with pytest.raises(ShardFormatError, match=r"bad header checksum|bad size"):
        list(TarReader(io.BytesIO(bytes(data))).samples())


def _sized(data: bytes, *, direct: bool, keep: bool = True, general: bool = False) -> Outcome:
    """The fast loop (or, ``general``, the general path) over a seekable stream of known
    size, with small buffered reads (so that members run past the buffer) and members read
    directly (or never so)."""
    names = ("_CHUNK", "_UNBUFFERED", "_SHORT_GAP", "_AFTER_UNBUFFERED")
    saved = [getattr(buffer, name) for name in names]
    small = (1024, 1 if direct else 1 << 40, 2048, 512)
    for name, value in zip(names, small, strict=True):
        setattr(buffer, name, value)
    try:
        if general:
            return _general(data, keep=keep, size=len(data))
        return _samples(TarReader(io.BytesIO(data), url="s.tar", size=len(data), keep_data=keep))
    finally:
        for name, value in zip(names, saved, strict=True):
            setattr(buffer, name, value)


@given(data=_tars, pos=st.integers(0, 1 << 16), value=st.integers(-1, 255), cut=st.integers(1))
def test_direct_reads_give_what_buffered_reads_give(
    data: bytes, pos: int, value: int, cut: int
) -> None:
    damaged = bytearray(data)
    if value >= 0:  # -1: undamaged
        damaged[pos % len(data)] = value
    for case in (bytes(damaged), data[: cut % (len(data) + 1)]):
        fast = _sized(case, direct=True)
        assert fast == _sized(case, direct=False)
        # members past the buffer take the fast loop too: as the general path reads them
        assert fast == _sized(case, direct=True, general=True)


def test_large_members_are_read_directly_and_whole() -> None:
    payloads = [bytes([i]) * (70_000 + 513 * i) for i in range(16)]
    names = [f"s{i // 2:03d}.{'bin' if i % 2 else 'jpg'}" for i in range(16)]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, payload in zip(names, payloads, strict=True):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(payload), 1700000000.5
            tf.addfile(info, io.BytesIO(payload))
    data = buf.getvalue()
    reads: list[int] = []

    class _Spy(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            out = super().read(n)
            reads.append(len(out))
            return out

    got = [s for _, s in TarReader(_Spy(data), size=len(data)).samples()]
    assert [s[f] for s in got for f in ("jpg", "bin")] == payloads
    first, *direct = [n for n in reads if n >= 70_000]
    assert first == 512 << 10  # the first buffered read holds the first members whole
    assert len(direct) >= 8
    assert direct == [len(p) for p in payloads[-len(direct) :]]  # the rest: one read each


@given(raw=st.binary(max_size=12) | st.text(alphabet="a./\\:\0é", max_size=12).map(str.encode))
def test_a_name_the_fast_paths_take_is_one_the_general_path_takes_as_it_is(raw: bytes) -> None:
    name = fast_name(raw)
    if name is not None:
        assert name_problem(name) is None and normal_name(name) == name
        assert not name.endswith("/") and name.encode() == raw


_field = st.sampled_from(
    [b"00000000012\0", b"00000000012 ", b"0000000001\0\0", b"00000000019\0", b"00000000012\n"]
)


@given(
    base=st.just(_tar(["a/k.json"], [3], tarfile.USTAR_FORMAT, 0.0)[:512]),
    size=_field,
    typeflag=st.sampled_from([b"0", b"\0", b"5", b"x"]),
    pos=st.integers(0, 511),
    value=st.integers(-1, 255),
)
def test_plain_header_is_the_field_and_checksum_rules(
    base: bytes, size: bytes, typeflag: bytes, pos: int, value: int
) -> None:
    hdr = bytearray(base)
    hdr[124:136], hdr[156:157] = size, typeflag
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    if value >= 0:
        hdr[pos] = value
    block = bytes(hdr)
    chkf = block[148:156]
    rule = (
        block[156:157] in (b"0", b"\0")
        and octal_field(block[124:136], 11)
        and octal_field(chkf, 6)
        and sum_matches(block, chkf)
    )
    got = plain_header(block, 0)
    assert (got is not None) == rule
    if got is not None:
        assert checksum_ok(block) and got[1] == int(block[124:135], 8)


_header_names = (
    st.binary(max_size=101)
    | st.text(alphabet="ab./\\:\0é", max_size=101).map(str.encode)
    | st.text(alphabet="ab", min_size=98, max_size=101).map(str.encode)  # a full field
)


@given(
    base=st.just(_tar(["a/k.json"], [3], tarfile.USTAR_FORMAT, 0.0)[:512]),
    name=_header_names,
    size=_field,
    typeflag=st.sampled_from([b"0", b"\0", b"5"]),
    pos=st.integers(0, 511),
    value=st.integers(-1, 255),
    damage_first=st.booleans(),
)
@settings(max_examples=400)  # cheap (a header a example); rare shapes need the draws
@example(  # a name filling its field: the mode's digits follow it, not a NUL
    base=_tar(["a/k.json"], [3], tarfile.USTAR_FORMAT, 0.0)[:512],
    name=b"a" * 100,
    size=b"00000000012\0",
    typeflag=b"0",
    pos=0,
    value=-1,
    damage_first=True,
)
def test_plain_member_is_plain_header_then_fast_name(
    base: bytes, name: bytes, size: bytes, typeflag: bytes, pos: int, value: int, damage_first: bool
) -> None:
    """The fused fast path takes a header exactly when the two checks it replaces do
    (no ustar prefix, a name ``fast_name`` takes, shorter than its field), and gives the
    same name and size."""
    hdr = bytearray(base)
    hdr[0:100] = name[:100].ljust(100, b"\0")
    hdr[124:136], hdr[156:157] = size, typeflag
    if value >= 0 and damage_first:  # a changed field under a right checksum
        hdr[pos] = value
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    if value >= 0 and not damage_first:  # damage after the checksum: the sum may be wrong
        hdr[pos] = value
    block = b"\xff" * 7 + bytes(hdr) + b"\xff"  # not at offset 0, bytes on both sides
    plain = plain_header(block, 7)
    want = None
    if plain is not None and not plain[2] and len(plain[0]) < 100:  # a full name field:
        text = fast_name(plain[0])  # no NUL ends it, it is left to the general path
        want = None if text is None else (text, plain[1])
    assert plain_member(block, 7) == want
