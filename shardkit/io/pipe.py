"""``pipe:CMD``: the bytes a shell command writes to its stdout, as in WebDataset.

A command runs only when the code that built the opener passed ``allow_pipe=True``: a
manifest can never turn it on (:func:`shardkit.format.manifest.model.resolve_url` refuses ``pipe:``
shard urls too). A command that exits non-zero is a :class:`FetchError` at the end of the
stream, naming the command and its exit status.
"""

from __future__ import annotations

import io
import subprocess
from typing import IO, BinaryIO

from shardkit.errors import ConfigError, FetchError

__all__ = ["check_pipe_allowed", "open_pipe"]


def check_pipe_allowed(url: str, allow_pipe: bool) -> None:
    """Refuse ``pipe:`` unless the caller allowed it in code."""
    if not allow_pipe:
        raise ConfigError(
            f"refusing {url!r}: pipe: urls run a shell command; give "
            "io=IoConfig(allow_pipe=True) in code to allow them"
        )


class _PipeRaw(io.RawIOBase):
    """The bytes ``[start, end)`` of a command's stdout."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], start: int, end: int | None):
        self._url = url
        self._proc = proc
        self._out: IO[bytes] = proc.stdout  # type: ignore[assignment]
        self._remaining = None if end is None else end - start
        self._skip = start

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        while self._skip:
            got = self._out.read(min(self._skip, 1 << 20))
            if not got:
                break
            self._skip -= len(got)
        view = memoryview(b)
        if self._remaining is not None:
            if self._remaining <= 0:
                return 0
            view = view[: self._remaining]
        n = self._out.readinto(view)  # type: ignore[attr-defined]
        if not n:
            self._check_exit()
            return 0
        if self._remaining is not None:
            self._remaining -= n
        return int(n)

    def _check_exit(self) -> None:
        rc = self._proc.wait()
        if rc != 0:
            raise FetchError(f"command exited with status {rc}", url=self._url)

    def close(self) -> None:
        if not self.closed:
            if self._proc.poll() is None:
                self._proc.kill()
            self._out.close()
            self._proc.wait()
        super().close()


def open_pipe(url: str, *, start: int = 0, end: int | None = None) -> BinaryIO:
    """Run the command of ``pipe:CMD`` and stream ``[start, end)`` of its stdout."""
    cmd = url[len("pipe:") :]
    if not cmd.strip():
        raise ConfigError(f"empty command in {url!r}")
    proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE)  # noqa: S602 - opt-in
    return io.BufferedReader(_PipeRaw(url, proc, start, end), buffer_size=1 << 20)
