"""Builders of hostile and broken tar streams, from raw header bytes.

Every case says where a reader must report the problem: ``offset`` is the start of the
header block at fault (for a member named by a pax header, the pax header's start), of a
partial header, or where an end-of-archive marker was expected.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BLOCK = 512
EOA = b"\0" * (2 * BLOCK)


def octal(value: int, width: int) -> bytes:
    """A NUL-terminated zero-padded octal header field."""
    return b"%0*o\0" % (width - 1, value)


def base256(value: int, width: int = 12) -> bytes:
    """A GNU base-256 number field (two's complement, top bit set)."""
    raw = (value % (1 << (8 * width - 1))).to_bytes(width, "big", signed=False)
    return bytes([raw[0] | 0x80]) + raw[1:] if value >= 0 else b"\xff" + raw[1:]


def header(
    name: str | bytes,
    size: int = 0,
    *,
    typeflag: bytes = b"0",
    size_field: bytes | None = None,
    linkname: bytes = b"",
    prefix: bytes = b"",
    magic: bytes = b"ustar\x0000",
    checksum_delta: int = 0,
) -> bytes:
    """One 512-byte header block; ``checksum_delta`` != 0 stores a wrong checksum."""
    raw = name.encode() if isinstance(name, str) else name
    hdr = bytearray(BLOCK)
    hdr[0 : len(raw)] = raw[:100]
    hdr[100:108] = octal(0o644, 8)
    hdr[108:116] = octal(0, 8)
    hdr[116:124] = octal(0, 8)
    hdr[124:136] = size_field if size_field is not None else octal(size, 12)
    hdr[136:148] = octal(0, 12)
    hdr[148:156] = b" " * 8
    hdr[156:157] = typeflag
    hdr[157 : 157 + len(linkname)] = linkname
    hdr[257:265] = magic
    hdr[345 : 345 + len(prefix)] = prefix
    hdr[148:156] = b"%06o\0 " % (sum(hdr) + checksum_delta)
    return bytes(hdr)


def with_fields(hdr: bytes, fields: dict[int, bytes]) -> bytes:
    """Header block ``hdr`` with ``fields`` (offset -> bytes) written in, checksum redone."""
    out = bytearray(hdr)
    for at, value in fields.items():
        out[at : at + len(value)] = value
    out[148:156] = b" " * 8
    out[148:156] = b"%06o\0 " % sum(out)
    return bytes(out)


def old_gnu_sparse(name: str, entries: list[tuple[int, int]], realsize: int, data: bytes) -> bytes:
    """A type ``S`` member (up to four map entries in the header) storing ``data``."""
    fields = {257: b"ustar  \0", 483: octal(realsize, 12)}
    for i, (off, n) in enumerate(entries):
        fields[386 + 24 * i] = octal(off, 12)
        fields[398 + 24 * i] = octal(n, 12)
    return with_fields(header(name, len(data), typeflag=b"S"), fields) + pad(data)


def pad(data: bytes) -> bytes:
    """``data`` padded with NULs to a whole number of blocks."""
    return data + b"\0" * ((-len(data)) % BLOCK)


def member(name: str | bytes, data: bytes, **kwargs: object) -> bytes:
    """A regular file member: header, data, padding."""
    return header(name, len(data), **kwargs) + pad(data)  # type: ignore[arg-type]


def pax_record(key: str, value: bytes | str) -> bytes:
    """One ``"%d key=value\\n"`` record with its correct length."""
    v = value.encode() if isinstance(value, str) else value
    body = b" " + key.encode() + b"=" + v + b"\n"
    n = len(body) + 1
    while len(str(n).encode() + body) != n:
        n = len(str(n).encode() + body)
    return str(n).encode() + body


def pax(body: bytes, *, typeflag: bytes = b"x", size: int | None = None) -> bytes:
    """A pax extended header (``x``, or global ``g``) carrying ``body``."""
    return header("PaxHeaders/x", len(body) if size is None else size, typeflag=typeflag) + pad(
        body
    )


def good(n: int = 1) -> bytes:
    """``n`` well-formed two-field samples (4 blocks each), no end marker."""
    return b"".join(
        member(f"s{i:04d}.txt", b"text %d" % i) + member(f"s{i:04d}.cls", b"%d" % i)
        for i in range(n)
    )


@dataclass(frozen=True)
class Case:
    """A broken tar: its ``data``, the ``offset`` a reader must name, a message fragment."""

    name: str
    data: bytes
    offset: int
    match: str


def _after_good(name: str, bad: bytes, match: str, *, tail: bytes = EOA) -> Case:
    lead = good(2)
    return Case(name, lead + bad + tail, len(lead), match)


def cases() -> list[Case]:
    """Every kind of hostile or broken member the reader must refuse."""
    out = [
        _after_good("absolute", member("/etc/passwd.txt", b"x"), "absolute"),
        _after_good("dotdot", member("a/../../x.txt", b"x"), "escapes"),
        _after_good("drive", member("C:x.txt", b"x"), "absolute"),
        _after_good("backslash", member("a\\b.txt", b"x"), "backslash"),
        _after_good("symlink", header("l.txt", typeflag=b"2", linkname=b"/etc/x"), "symbolic"),
        _after_good("hardlink", header("h.txt", typeflag=b"1", linkname=b"s0000.txt"), "hard"),
        _after_good("chardev", header("c.txt", typeflag=b"3"), "character device"),
        _after_good("blockdev", header("b.txt", typeflag=b"4"), "block device"),
        _after_good("fifo", header("f.txt", typeflag=b"6"), "FIFO"),
        _after_good(
            "sparse-chunk-past-size",
            old_gnu_sparse("s.txt", [(100, 10)], 50, b"x" * 10),
            "bad sparse map",
        ),
        _after_good(
            "sparse-map-covers-less",
            old_gnu_sparse("s.txt", [(0, 10)], 50, b"x" * 600),
            "bad sparse map",
        ),
        _after_good(
            "sparse-overlap",
            old_gnu_sparse("s.txt", [(0, 10), (5, 10)], 50, b"x" * 20),
            "bad sparse map",
        ),
        _after_good(
            "sparse-unknown-version",
            pax(pax_record("GNU.sparse.major", "2") + pax_record("GNU.sparse.minor", "0"))
            + member("a.txt", b"a"),
            "unknown GNU sparse format",
        ),
        _after_good(
            "sparse-10-map-runs-past-member",
            pax(pax_record("GNU.sparse.major", "1") + pax_record("GNU.sparse.minor", "0"))
            + member("a.txt", b"2\n0\n"),
            "bad sparse map",
        ),
        _after_good("unknown-type", header("q.txt", 3, typeflag=b"Q") + pad(b"qqq"), "type 'Q'"),
        _after_good("old-style-dir-with-data", member("d/", b"hidden"), "disagree"),
        _after_good(
            "symlink-with-data", header("l.txt", 600, typeflag=b"2") + b"z" * 1024, "disagree"
        ),
        _after_good(
            "pax-global-path",
            pax(pax_record("path", "every.txt"), typeflag=b"g") + member("a.txt", b"a"),
            "global",
        ),
        _after_good(
            "huge-octal",
            header("big.bin", size_field=octal(0o77777777777, 12)) + b"x" * 9000,
            "claims|truncated|largest-member",
            tail=b"",
        ),
        _after_good(
            "huge-base256",
            header("big.bin", size_field=base256(1 << 80)) + b"x" * 9000,
            "claims|truncated|largest-member",
            tail=b"",
        ),
        _after_good("negative-base256", header("n.bin", size_field=base256(-5)), "size field"),
        _after_good("negative-octal", header("n.bin", size_field=b"-0000000001\0"), "size field"),
        _after_good("underscore-size", header("n.bin", size_field=b"0000000_001\0"), "size field"),
        _after_good("bad-checksum", member("x.txt", b"x", checksum_delta=1), "checksum"),
        _after_good("garbage-header", b"\x7f" * BLOCK, "checksum"),
        _after_good(
            "truncated-member", header("t.bin", 5000) + b"y" * 3000, "claims|truncated", tail=b""
        ),
        _after_good("truncated-padding", header("t.bin", 100) + b"y" * 100, "padding", tail=b""),
        _after_good("truncated-header", header("t.txt", 1)[:300], "partial tar header", tail=b""),
        _after_good("missing-eoa", b"", "end-of-archive", tail=b""),
        _after_good("lone-zero-block-then-junk", b"\0" * BLOCK + b"j" * BLOCK, "one zero block"),
        _after_good(
            "pax-size-unicode-digits",
            pax(pax_record("size", "\u00b2")) + member("a.txt", b"a"),
            "pax size",
        ),
        _after_good(
            "pax-size-arabic-digits",
            pax(pax_record("size", "\u0661\u0662")) + member("a.txt", b"a"),
            "pax size",
        ),
        _after_good("pax-huge", pax(b"", size=2 << 20) + b"z" * 4096, "too large"),
        _after_good("pax-no-length", pax(b"abc path=x\n") + member("a.txt", b"a"), "malformed"),
        _after_good("pax-long-length", pax(b"99 path=x\n") + member("a.txt", b"a"), "malformed"),
        _after_good("pax-short-length", pax(b"3 path=x\n") + member("a.txt", b"a"), "malformed"),
        _after_good("pax-no-newline", pax(b"10 path=xy") + member("a.txt", b"a"), "malformed"),
        _after_good("pax-no-equals", pax(b"9 pathxy\n") + member("a.txt", b"a"), "malformed"),
        _after_good(
            "pax-global-malformed", pax(b"abc", typeflag=b"g") + member("a.txt", b"a"), "malformed"
        ),
        _after_good(
            "pax-bad-size",
            pax(pax_record("size", "-5")) + member("a.txt", b"a"),
            "pax size",
        ),
        _after_good(
            "pax-absolute-path",
            pax(pax_record("path", "/etc/shadow.txt")) + member("a.txt", b"a"),
            "absolute",
        ),
        _after_good(
            "pax-nul-path",
            pax(pax_record("path", b"a\0b.txt")) + member("a.txt", b"a"),
            "NUL",
        ),
        _after_good("eoa-after-pax", pax(pax_record("path", "p.txt")), "extended header"),
        _after_good("eof-after-pax", pax(pax_record("path", "p.txt")), "extended header", tail=b""),
        _after_good(
            "gnu-longname-dotdot",
            header("././@LongLink", 12, typeflag=b"L") + pad(b"../../x.txt\0") + member("y", b"y"),
            "escapes",
        ),
    ]
    # a pax size past the end: offset is the pax header that carries the claim
    lead = good(2)
    out.append(
        Case(
            "pax-size-past-end",
            lead + pax(pax_record("size", str(1 << 40))) + member("a.txt", b"a") + EOA,
            len(lead),
            "claims|truncated|largest-member",
        )
    )
    return out


# -- whole hostile data sets, for every entry point ---------------------------------------
def zstd_bomb(path: str | os.PathLike[str], size: int = 2 << 30, name: str = "bomb.bin") -> int:
    """A ``.tar.zst`` of one ``size``-byte member of zeros (~65 KB for 2 GiB); its size."""
    import zstandard

    with open(path, "wb") as f:
        z = zstandard.ZstdCompressor(level=1).stream_writer(f)
        z.write(header(name, size))
        zeros = bytes(8 << 20)
        left = size
        while left:
            n = min(left, len(zeros))
            z.write(zeros[:n])
            left -= n
        z.write(b"\0" * ((-size) % BLOCK))
        z.write(EOA)
        z.close()
    return os.path.getsize(path)


def one_shard_set(directory: Path, name: str, data: bytes, nsamples: int = 1) -> Path:
    """``directory`` with the shard ``name`` holding ``data`` and a manifest that lists it
    truthfully (size, checksum, ``nsamples``): every entry point reaches the tar parser."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)
    entry = {
        "url": name,
        "size": len(data),
        "nsamples": nsamples,
        "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
    }
    doc = {"format": "shardkit.manifest", "version": 1, "shards": [entry]}
    path = directory / "manifest.json"
    path.write_text(json.dumps(doc))
    return path


# ru_maxrss of a process keeps the high-water mark of the process it was forked from
# across exec (Linux carries the old mm's peak over): a big pytest process would be
# measured, not the child. VmHWM is the child's own memory's peak.
_PEAK = (
    "import atexit, resource, sys\n"
    "def _hwm():\n"
    "    try:\n"
    "        with open('/proc/self/status') as f:\n"
    "            return next(int(l.split()[1]) for l in f if l.startswith('VmHWM:'))\n"
    "    except (OSError, StopIteration):\n"
    "        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "def _peak():\n"
    "    me = _hwm()\n"
    "    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "    sys.stderr.write(f'\\nPEAK_KB {max(me, kids)}\\n')\n"
    "atexit.register(_peak)\n"
)


def run_measured(code: str, timeout: float = 120) -> tuple[int, str, int]:
    """Run ``code`` in a fresh interpreter: ``(exit code, stderr without the peak line,
    peak RSS in bytes of it or of any child it waited for, DataLoader workers included)``."""
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK + code],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    head, _, peak = proc.stderr.rpartition("\nPEAK_KB ")
    return proc.returncode, head.strip(), int(peak.strip() or 0) * 1024


def run_cli_measured(*args: str | os.PathLike[str], timeout: float = 120) -> tuple[int, str, int]:
    """The ``shardkit`` CLI in a fresh process, measured as :func:`run_measured`."""
    argv = [str(a) for a in args]
    return run_measured(f"from shardkit.cli import main\nmain({argv!r})\n", timeout)
