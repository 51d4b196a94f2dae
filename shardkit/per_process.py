"""PerProcess: a resource one process owns (a session, a client, threads, open files).

It is made at first use in each process and made again after a fork; a pickled copy (a
data set sent to a spawned DataLoader worker) carries only how to make it. The one
spelling of the "per process, dropped on pickle" rule for io, the cache and the stages.

A fork is told by :func:`fork_generation`, a count bumped in every forked child
(``os.register_at_fork``), not by ``os.getpid()``: glibc does not cache the pid, so each
call is a system call, and a decoder asks for its tables once a sample.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["PerProcess", "fork_generation"]

T = TypeVar("T")

_generation = [1]  # this process's fork generation: bumped in every forked child


def _forked() -> None:
    _generation[0] += 1


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere a process is never forked
    os.register_at_fork(after_in_child=_forked)


def fork_generation() -> int:
    """A number that differs in every forked child from its parent's (compare it with
    the one a resource was made under to tell a fork, without a system call)."""
    return _generation[0]


class PerProcess(Generic[T]):
    """``make()``'s value, one per process.

    Args:
        make: makes the resource (picklable when its holder is: a function, a
            ``functools.partial``, a bound method of a picklable object).
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._made_in = 0  # the fork generation it was made in (0: not made)

    def get(self) -> T:
        """This process's resource, made now if this process has none yet."""
        gen = _generation[0]
        if self._value is None or self._made_in != gen:
            self._value = self._make()
            self._made_in = gen
        return self._value

    def peek(self) -> T | None:
        """This process's resource if it was made, else None (nothing is made)."""
        return self._value if self._made_in == _generation[0] else None

    def __getstate__(self) -> dict[str, Any]:
        return {"_make": self._make, "_value": None, "_made_in": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
