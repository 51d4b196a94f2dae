"""What ``shardkit verify`` reports: each :class:`Problem` with one shard, and the
:class:`VerifyReport` of a whole manifest (the CLI prints it, ``--json`` writes its dict)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardkit.errors import redact

__all__ = ["Problem", "VerifyReport"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one shard.

    ``kind`` is one of ``missing``, ``unreadable``, ``url``, ``size``, ``checksum``,
    ``pieces``, ``format``, ``nsamples``, ``index`` (or ``manifest``: the CLI could not read
    it, ``url`` the manifest's); ``offset`` is a byte offset in the
    shard (``format`` problems, the first byte of a ``pieces`` problem) when known.
    """

    url: str
    kind: str
    message: str
    expected: int | str | None = None
    found: int | str | None = None
    offset: int | None = None

    def __post_init__(self) -> None:  # a presigned or user:secret@ url's secret: never said
        object.__setattr__(self, "url", redact(self.url))
        object.__setattr__(self, "message", redact(self.message))

    def __str__(self) -> str:
        text = f"{self.url}: {self.kind}: {self.message}"
        if self.expected is not None or self.found is not None:
            text += f" (expected {self.expected}, found {self.found})"
        return text


@dataclass
class VerifyReport:
    """What :func:`verify` found: ``problems`` (errors) and ``warnings`` (extra files,
    members skipped).

    ``incomplete`` says why the manifest does not hold its whole data set (a build that
    did not finish, a merge of only some parts); such a report is not ok either.
    ``skipped_members`` maps a shard's url to the members a lenient parse passed over by
    kind (``{"symbolic link": 1, "FIFO": 2}``; deep levels only).
    """

    manifest: str
    level: str
    shards: int
    bytes: int
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    incomplete: str | None = None
    skipped_members: dict[str, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.manifest = redact(self.manifest)

    @property
    def ok(self) -> bool:
        """True when the manifest is complete and no shard has a problem (not warnings)."""
        return not self.problems and self.incomplete is None

    @property
    def bad_shards(self) -> list[str]:
        """The urls of the shards with problems, in manifest order, once each."""
        return list(dict.fromkeys(p.url for p in self.problems))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of the report."""
        return {
            "manifest": self.manifest,
            "level": self.level,
            "ok": self.ok,
            "shards": self.shards,
            "bytes": self.bytes,
            "bad_shards": self.bad_shards,
            "problems": [asdict(p) for p in self.problems],
            "warnings": list(self.warnings),
            "incomplete": self.incomplete,
            "skipped_members": {
                url: sum(kinds.values()) for url, kinds in self.skipped_members.items()
            },
            "seconds": round(self.seconds, 3),
        }
