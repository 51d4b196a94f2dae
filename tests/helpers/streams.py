"""Streams as the network gives them: no seek, no file descriptor."""

from __future__ import annotations

import io


class OneWay(io.RawIOBase):
    """A non-seekable stream without a file descriptor (like a socket or a decompressor)."""

    def __init__(self, data: bytes) -> None:
        self._src = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        return self._src.readinto(b)
