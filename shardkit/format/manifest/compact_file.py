"""The compact form's file: a checked header and aligned arrays, read into private memory.

Layout: ``MAGIC`` (8 bytes), header length (u64 LE), the SHA-256 of the header's bytes
(32 bytes), the header (JSON, padded with spaces), then the arrays, each at a 64-byte
aligned offset the header gives. The header holds ``arrays_sha256``, a SHA-256 over every
array but the piece digests (those are hashed in blocks whose hashes are an array, see
:mod:`shardkit.format.manifest.compact_pieces`), so one checksum in the fixed prelude
vouches for the header and, through it, for the arrays: a flipped bit anywhere - a url
pattern, the origins, a flag, a count - is found on open, and the form is rebuilt.

A form is read, never mapped: the arrays a reader checks on open are copied into its own
memory as they are hashed (so what is used is exactly what was checked), and the piece
digests are read by block with ``pread`` from the descriptor opened with it, each block
checked against its hash before a row of it is used. A form cut or rewritten in place
under a running job (``cp`` over it, a truncation) can therefore neither kill a reader
with SIGBUS nor change what it already holds; a piece block read after the change does not
match its hash and is a named :class:`ManifestError`, never another manifest's digests.
A form that cannot be written (a full disk) lives in memory the same way (:class:`FormFile`
over bytes).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from shardkit.errors import ManifestError

__all__ = ["FORMAT", "LAZY", "MAGIC", "PRELUDE", "VERSION", "FormFile", "encode_form"]

MAGIC = b"SKCOLS\x00\x01"
FORMAT = "shardkit-columns"
VERSION = 3  # 2: piece checksums; 3: the header's checksum in the prelude
_HEAD = struct.Struct("<8sQ32s")
PRELUDE = _HEAD.size
ALIGN = 64
LAZY = "pieces.digests"  # the one array the open does not hash

ReadAt = Callable[[int, int], bytes]  # (offset, length) -> bytes


def encode_form(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> list[bytes | memoryview]:
    """The bytes of a form with ``header`` (completed with the arrays' layout and
    checksum) and ``arrays``, as parts to write one after the other (no copy)."""
    blobs: list[bytes | memoryview] = []
    layout: dict[str, Any] = {}
    offset = 0
    h = hashlib.sha256()
    for name, arr in arrays.items():
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
        layout[name] = [offset, arr.dtype.str, list(arr.shape)]
        pad = b"\0" * (-len(raw) % ALIGN)
        if name != LAZY:
            h.update(raw)
            h.update(pad)
        blobs += [raw, pad]
        offset += len(raw) + len(pad)
    header = {**header, "format": FORMAT, "version": VERSION, "arrays": layout}
    header["arrays_sha256"] = h.hexdigest()
    text = json.dumps(header, sort_keys=True).encode()
    text += b" " * (-(len(text) + PRELUDE) % ALIGN)
    return [_HEAD.pack(MAGIC, len(text), hashlib.sha256(text).digest()), text, *blobs]


class FormFile:
    """One opened form: its checked header, its checked arrays (private copies) and the
    piece digests read by block. ``source`` is a path or the form's bytes."""

    def __init__(self, source: str | bytes, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        if isinstance(source, bytes):
            self._size = len(source)
            data = source
            self._read_at: ReadAt = lambda off, n: data[off : off + n]
        else:
            self._fd = fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
            self._size = os.fstat(fd).st_size
            self._read_at = lambda off, n: os.pread(fd, n, off)
        self.header, self.start = self._read_header()

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read_header(self) -> tuple[dict[str, Any], int]:
        head = self._read_at(0, PRELUDE)
        if len(head) < PRELUDE:
            raise ManifestError("compact form is truncated", path=self.path)
        magic, n, want = _HEAD.unpack(head)
        if magic != MAGIC or PRELUDE + n > self._size:
            raise ManifestError(
                "not a shardkit compact manifest (or of another version)", path=self.path
            )
        text = self._read_at(PRELUDE, n)
        if hashlib.sha256(text).digest() != want:
            raise ManifestError("compact form's header does not match its checksum", path=self.path)
        try:
            header = json.loads(text)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ManifestError(
                f"compact form's header is not JSON: {exc}", path=self.path
            ) from None
        if not isinstance(header, dict) or (header.get("format"), header.get("version")) != (
            FORMAT,
            VERSION,
        ):
            raise ManifestError("compact form of another format or version", path=self.path)
        return header, PRELUDE + n

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array but the piece digests, read into private memory and checked
        against ``arrays_sha256``; ManifestError where they do not match."""
        try:
            layout = self.header["arrays"]
            h = hashlib.sha256()
            out: dict[str, np.ndarray] = {}
            for name, (offset, dtype, shape) in sorted(layout.items(), key=lambda kv: kv[1][0]):
                if name == LAZY:
                    continue
                dt = np.dtype(dtype)
                count = int(np.prod(shape)) if shape else 1
                n = count * dt.itemsize if shape else 0
                raw = self._read_at(self.start + offset, n + (-n % ALIGN))
                h.update(raw)
                out[name] = np.frombuffer(raw, dtype=dt, count=count).reshape(shape)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise ManifestError(
                f"compact form's header is damaged: {exc!r}", path=self.path
            ) from None
        if h.hexdigest() != self.header.get("arrays_sha256"):
            raise ManifestError("compact form's arrays do not match their checksum", path=self.path)
        return out

    def lazy_rows(self, width: int) -> tuple[list[int], Callable[[int, int], bytes]]:
        """The piece digests' shape and a reader of their rows ``[lo, hi)`` (``width``
        bytes each), unchecked: the caller checks each block against its hash."""
        try:
            offset, _, shape = self.header["arrays"][LAZY]
            offset = int(offset)
        except (KeyError, ValueError, TypeError) as exc:
            raise ManifestError(f"compact form lacks piece array {exc}", path=self.path) from None

        def rows(lo: int, hi: int) -> bytes:
            want = (hi - lo) * width
            got = self._read_at(self.start + offset + lo * width, want)
            if len(got) != want:
                raise ManifestError(
                    "compact form was cut under this reader: delete it and it is built again",
                    path=self.path,
                )
            return got

        return list(shape), rows
