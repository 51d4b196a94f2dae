"""A tar conformance corpus, written by the tests themselves: GNU tar in every format (with
sparse files), bsdtar, pzstd, Python's tarfile, and hand-made headers for what no tool
here writes (signed checksums, a one-block end, ``X``/``V``/``A`` headers).

Where bsdtar or pzstd is missing (``scripts/setup.sh`` installs them), the same layout is
written with Python instead, so a test never silently skips: :func:`pzstd` writes pzstd's
layout (a skippable frame before each zstd frame) itself, :func:`bsdtar` falls back to
tarfile's pax output. GNU tar is part of every Debian system.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardkit.format.tario.names import normal_name, split_key
from tests.helpers.hostile import EOA, header, member, pad, pax, pax_record, with_fields

Files = list[tuple[str, bytes]]


def sparse_bytes(size: int, chunks: list[tuple[int, bytes]]) -> bytes:
    """A file of ``size`` zero bytes with each ``(offset, data)`` chunk written in."""
    out = bytearray(size)
    for off, data in chunks:
        out[off : off + len(data)] = data
    return bytes(out)


def write_sparse(path: Path, size: int, chunks: list[tuple[int, bytes]]) -> bytes:
    """A sparse file on disk (holes where no chunk is); its bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, data in chunks:
            f.seek(off)
            f.write(data)
    return sparse_bytes(size, chunks)


def source_tree(root: Path, *, long_names: bool = True) -> dict[str, bytes]:
    """A folder of sample files (two sparse ones, one with 60 data chunks); its files."""
    files = {
        "a/s0001.txt": b"first sample",
        "a/s0001.json": b'{"id": 1}',
        "a/s0002.txt": b"",
        "b.bin": bytes(range(256)) * 13,
        "\u043a\u043b\u044e\u0447/k.txt": "\u0442\u0435\u043a\u0441\u0442".encode(),
    }
    if long_names:
        files["deep/" + "n" * 120 + ".txt"] = b"a long name"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    files["sp/holes.bin"] = write_sparse(
        root / "sp/holes.bin", 86016, [(4096, b"A" * 8192), (40960, b"B" * 12000)]
    )
    many = [(i * 16384, bytes([65 + i % 26]) * 700) for i in range(60)]
    files["sp/many.bin"] = write_sparse(root / "sp/many.bin", 60 * 16384 + 5, many)
    return files


def gnu_tar(src: Path, out: Path, *args: str, names: list[str] | None = None) -> bytes:
    """``tar -cf out ARGS -C src NAMES`` (all of ``src`` as ``.`` without names)."""
    cmd = ["tar", "--sort=name", *args, "-cf", str(out), "-C", str(src), *(names or ["."])]
    subprocess.run(cmd, check=True, capture_output=True)
    return out.read_bytes()


def bsdtar(src: Path, out: Path, fmt: str) -> bytes:
    """bsdtar's ``--format=pax|ustar`` archive of ``src`` (sparse files read as sparse);
    without bsdtar, tarfile's archive of the same files in that format."""
    if shutil.which("bsdtar"):
        cmd = ["bsdtar", f"--format={fmt}", "--read-sparse", "-cf", str(out), "-C", str(src), "."]
        subprocess.run(cmd, check=True, capture_output=True)
        return out.read_bytes()
    form = tarfile.PAX_FORMAT if fmt == "pax" else tarfile.USTAR_FORMAT
    with tarfile.open(out, "w", format=form) as tf:
        tf.add(str(src), arcname=".")
    return out.read_bytes()


def pzstd(data: bytes, out: Path) -> bytes:
    """``data`` compressed by pzstd into ``out``: frames of it, each after a skippable
    frame holding its size (pzstd's layout); written with Python without pzstd."""
    raw = out.with_suffix("")
    raw.write_bytes(data)
    if shutil.which("pzstd"):
        cmd = ["pzstd", "-q", "-f", "-p", "2", str(raw), "-o", str(out)]
        subprocess.run(cmd, check=True, capture_output=True)
        return out.read_bytes()
    return pzstd_layout(data, out)


def pzstd_layout(data: bytes, out: Path, frame: int = 1 << 16) -> bytes:
    """pzstd's layout written with Python: ``frame``-byte pieces of ``data``, each a zstd
    frame after a skippable frame holding that frame's size."""
    import zstandard

    z = zstandard.ZstdCompressor(level=3)
    parts = []
    for at in range(0, max(len(data), 1), frame):
        packed = z.compress(data[at : at + frame])
        parts.append(struct.pack("<III", 0x184D2A50, 4, len(packed)) + packed)
    out.write_bytes(b"".join(parts))
    return out.read_bytes()


def tarfile_bytes(files: Files, fmt: int) -> bytes:
    """Python's tarfile writing ``files`` in format ``fmt``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def signed_checksums(data: bytes) -> bytes:
    """``data`` (a tar) with every header's checksum the signed-byte sum (old writers)."""
    out = bytearray(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        offsets = [m.offset for m in tf]
    for at in offsets:
        hdr = bytearray(out[at : at + 512])
        hdr[148:156] = b" " * 8
        signed = sum(b - 256 if b > 127 else b for b in hdr)
        hdr[148:156] = b"%06o\0 " % signed
        out[at : at + 512] = hdr
    return bytes(out)


def one_block_end(data: bytes) -> bytes:
    """``data`` (a tar) ending after the first zero block of its end-of-archive marker."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.getmembers()
        end = tf.offset
    return data[: end + 512]


def retyped(data: bytes, old: bytes, new: bytes) -> bytes:
    """``data`` (a tar) with every member's first header of type ``old`` made ``new``."""
    out = bytearray(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        offsets = [m.offset for m in tf]
    for at in offsets:
        if out[at + 156 : at + 157] == old:
            out[at : at + 512] = with_fields(bytes(out[at : at + 512]), {156: new})
    return bytes(out)


def tarfile_files(data: bytes) -> Files:
    """Every regular member as Python's tarfile reads it (sparse ones expanded), named in
    the normal form; what a conforming reader must give."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        out = []
        for m in tf:
            if m.isreg():
                f = tf.extractfile(m)
                assert f is not None
                out.append((normal_name(m.name), f.read()))
        return out


def as_samples(files: Files) -> list[dict[str, object]]:
    """``files`` grouped into samples as the WebDataset convention groups members."""
    out: list[dict[str, object]] = []
    for name, data in files:
        split = split_key(name)
        if split is None:
            continue
        key, field = split
        if not out or out[-1]["__key__"] != key:
            out.append({"__key__": key})
        out[-1][field] = data
    return out


SPECIAL_KINDS = {"symbolic link": 1, "FIFO": 1, "character device": 1, "type 'Q'": 1}


def special_members_tar(path: Path, nsamples: int = 10) -> int:
    """A foreign shard at ``path``: ``nsamples`` samples (``s000.json`` + ``s000.txt``, ...)
    with a symbolic link (in sample 2), a FIFO (4) and a character device (6) written by
    tarfile, and a hand-made member of the unknown type ``Q`` with 700 bytes of data (8)
    between their members. Returns the offset of the first special member's header (the
    link's), where a strict reader must refuse the shard."""
    buf = io.BytesIO()
    special = {
        2: ("lnk", tarfile.SYMTYPE),
        4: ("fifo", tarfile.FIFOTYPE),
        6: ("dev", tarfile.CHRTYPE),
    }
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(nsamples):
            key = f"s{i:03d}"
            _add(tf, f"{key}.json", b'{"i": %d}' % i)
            if i in special:
                ext, kind = special[i]
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.type = kind
                info.linkname = "s001.json" if kind == tarfile.SYMTYPE else ""
                info.devmajor, info.devminor = (1, 3) if kind == tarfile.CHRTYPE else (0, 0)
                tf.addfile(info)
            _add(tf, f"{key}.txt", f"text {i}".encode() * (i + 1))
    data = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        offsets = {m.name: m.offset for m in tf}
    at = offsets["s008.txt"]
    unknown = header("s008.q", 700, typeflag=b"Q") + pad(b"q" * 700)
    path.write_bytes(data[:at] + unknown + data[at:])
    return offsets["s002.lnk"]


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def plain_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample without reader metadata (``__url__``...), its fields as ``bytes``."""
    return {
        k: v if isinstance(v, str) else bytes(v)
        for k, v in sample.items()
        if k not in ("__url__", "__local_path__")
    }


def sorted_samples(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Samples comparable across readers: plain, sorted by key."""
    return sorted((plain_sample(s) for s in samples), key=lambda s: str(s["__key__"]))


def webdataset_samples(path: Path) -> list[dict[str, Any]]:
    """What webdataset reads from the shard at ``path``: its own tarfile-based reader, the
    two stages ``WebDataset`` runs on a shard (members, then grouped by key), on a file we
    close (``WebDataset`` 1.0 leaves its file open, and the ``gc.collect()`` that closed it
    cost ~0.7 s a call)."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    with open(path, "rb") as f:
        members = ({**m, "__url__": str(path)} for m in tar_file_iterator(f))
        return [plain_sample(s) for s in group_by_keys(members)]


def listed_files(tool: str, path: Path) -> list[str]:
    """The regular members ``tool`` (``tar``: GNU tar, or ``bsdtar``) lists in the tar at
    ``path``, named in the normal form (``-tv``: lines starting ``-``, or ``C`` for GNU tar's
    contiguous files; no spaces in names)."""
    cmd = [tool, "-tvf", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    return [normal_name(line.split()[-1]) for line in out.splitlines() if line[:1] in "-C"]


def long_header(text: str, typeflag: bytes = b"L") -> bytes:
    """A GNU long-name (``L``) or long-link (``K``) header carrying ``text``."""
    data = text.encode() + b"\0"
    return header("././@LongLink", len(data), typeflag=typeflag) + pad(data)


def pax_header(*records: tuple[str, str], typeflag: bytes = b"x") -> bytes:
    """A pax header of ``(keyword, value)`` records, in order."""
    return pax(b"".join(pax_record(k, v) for k, v in records), typeflag=typeflag)


@dataclass(frozen=True)
class Layout:
    """A hand-made tar whose extended headers readers may apply differently: ``refused`` is
    None when tarfile, webdataset and GNU tar read it alike (and shardkit must too), else
    what shardkit's refusal says (they disagree, or the ``policy`` refuses the member)."""

    name: str
    data: bytes
    refused: str | None = None
    policy: str = "strict"


HIDDEN = member("h.txt", b"hidden member")  # what a reader that skips too little hands out
_TAIL = member("a.txt", b"after") + EOA


def _sized(typeflag: bytes, **kw: Any) -> bytes:
    """A pax ``size`` of one member's worth over a ``typeflag`` header, then that member."""
    return pax_header(("size", str(len(HIDDEN)))) + header("t", 0, typeflag=typeflag, **kw) + HIDDEN


def extended_layouts() -> list[Layout]:
    """Extended headers stacked and applied to members a reader skips, in the layouts
    where readers agree and where they do not (``tests/format/test_conformance.py``)."""
    file = member("u.txt", b"data")
    pax_size = f"pax size of {len(HIDDEN)} bytes"
    no_data = f"tarfile reads 0 bytes of data after its header, GNU tar {len(HIDDEN)}"
    out = [Layout(f"pax size on type {t.decode()}", _sized(t) + _TAIL) for t in (b"V", b"A", b"D")]
    out += [
        Layout("pax size on an unknown type, lenient", _sized(b"Q") + _TAIL, policy="lenient"),
        Layout("pax size on an unknown type", _sized(b"Q") + _TAIL, "type 'Q'"),
        Layout("pax size on a directory", _sized(b"5") + _TAIL, pax_size, "lenient"),
        Layout("pax size on a directory, strict", _sized(b"5") + _TAIL, pax_size),
        Layout("pax size on a hard link", _sized(b"1", linkname=b"a.txt") + _TAIL, no_data),
        Layout(
            "pax size on a symbolic link",
            _sized(b"2", linkname=b"a.txt") + _TAIL,
            no_data,
            "lenient",
        ),
        Layout("pax size on a FIFO", _sized(b"6") + _TAIL, no_data, "lenient"),
        Layout(
            "pax size before a global header",
            pax_header(("size", str(len(HIDDEN))))
            + pax_header(("comment", "c"), typeflag=b"g")
            + header("t.txt", 0)
            + HIDDEN
            + _TAIL,
        ),
        Layout(
            "pax size then a long name",
            pax_header(("size", "1024"))
            + long_header("l.txt")
            + header("u.txt", 0)
            + HIDDEN
            + _TAIL,
        ),
        Layout(
            "a long name then a pax size",
            long_header("l.txt")
            + pax_header(("size", "1024"))
            + header("u.txt", 0)
            + HIDDEN
            + _TAIL,
        ),
        Layout(
            "pax path then a long name",
            pax_header(("path", "p.txt")) + long_header("l.txt") + file + _TAIL,
        ),
        Layout(
            "a long name then the same pax path",
            long_header("p.txt") + pax_header(("path", "p.txt")) + file + _TAIL,
        ),
        Layout(
            "a long name then a pax path",
            long_header("l.txt") + pax_header(("path", "p.txt")) + file + _TAIL,
            "'l.txt' as tarfile applies its extended headers and 'p.txt' as GNU tar",
        ),
        Layout(
            "two long names",
            long_header("l1.txt") + long_header("l2.txt") + file + _TAIL,
            "'l1.txt' as tarfile .* and 'l2.txt' as GNU tar",
        ),
        Layout(
            "two pax headers",
            pax_header(("size", "1024"))
            + pax_header(("mtime", "5"))
            + header("u.txt", 0)
            + HIDDEN
            + _TAIL,
            "tarfile reads 1024 bytes of data after its header, GNU tar 0",
        ),
        Layout(
            "a long name on an old-style directory header",  # the sample loop's fast path
            long_header("p.txt") + header("d/", len(HIDDEN), typeflag=b"\0") + HIDDEN + _TAIL,
            f"tarfile reads 0 bytes of data after its header, GNU tar {len(HIDDEN)}",
            "lenient",
        ),
        Layout(
            "a long link then a pax linkpath on a symbolic link",
            long_header("k1", b"K")
            + pax_header(("linkpath", "k2"))
            + header("s.txt", typeflag=b"2", linkname=b"k0")
            + _TAIL,
            policy="lenient",
        ),
        Layout(
            "a pax linkpath then a long link on a file",
            pax_header(("linkpath", "k2")) + long_header("k1", b"K") + file + _TAIL,
        ),
        Layout(
            "a pax path ending in a slash on a file",
            pax_header(("path", "q.txt/")) + file + _TAIL,
            "'q.txt' as tarfile .* and 'q.txt/' as GNU tar",
        ),
        Layout(
            "a sparse name then a pax path",
            pax_header(("GNU.sparse.name", "s.txt"), ("path", "p.txt")) + file + _TAIL,
            "'p.txt' as tarfile .* and 's.txt' as GNU tar",
        ),
    ]
    return out
