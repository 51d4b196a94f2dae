"""PerProcess: a resource one process owns (a session, a client, threads, open files).

It is made at first use in each process and made again after a fork; a pickled copy (a
data set sent to a spawned DataLoader worker) carries only how to make it. The one
spelling of the "per process, dropped on pickle" rule for io, the cache and the stages.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["PerProcess"]

T = TypeVar("T")


class PerProcess(Generic[T]):
    """``make()``'s value, one per process.

    Args:
        make: makes the resource (picklable when its holder is: a function, a
            ``functools.partial``, a bound method of a picklable object).
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._pid = 0

    def get(self) -> T:
        """This process's resource, made now if this process has none yet."""
        pid = os.getpid()
        if self._value is None or self._pid != pid:
            self._value = self._make()
            self._pid = pid
        return self._value

    def peek(self) -> T | None:
        """This process's resource if it was made, else None (nothing is made)."""
        return self._value if self._pid == os.getpid() else None

    def __getstate__(self) -> dict[str, Any]:
        return {"_make": self._make, "_value": None, "_pid": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
