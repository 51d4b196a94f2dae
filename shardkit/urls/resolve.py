"""Shard urls in manifests: resolving them safely against the manifest's base (the
safety rule, and its one exception for adopted data sets, are in :mod:`shardkit.urls`), the
real-path check of local shards, brace patterns."""

from __future__ import annotations

import os
import posixpath
import re
import stat
from urllib.parse import unquote, urlsplit

from shardkit.errors import ConfigError, ManifestError
from shardkit.urls.schemes import REMOTE_PREFIXES, is_absolute, local_path, url_scheme

__all__ = [
    "MAX_EXPANSION",
    "WithinBase",
    "check_within",
    "dirname",
    "expand_braces",
    "join",
    "names_host",
    "resolve_url",
]


def dirname(source: str) -> str:
    """The directory (or url "directory") that a manifest at ``source`` resolves from."""
    if "://" in source:
        parts = urlsplit(source)
        return parts._replace(path=posixpath.dirname(parts.path), query="", fragment="").geturl()
    return os.path.dirname(os.path.abspath(source))


def join(base: str, url: str) -> str:
    """``url`` relative to ``base`` (a directory path or url), normalised."""
    if "://" in base:
        parts = urlsplit(base)
        path = posixpath.normpath(posixpath.join(parts.path or "/", url))
        return parts._replace(path=path).geturl()
    return os.path.normpath(os.path.join(base, url))


def _refuse(url: str, full: str, base: str) -> ManifestError:
    return ManifestError(
        f"refusing url {url!r}: it resolves to {full!r}, outside the manifest's base "
        f"{base!r} (pass allow_unsafe_urls=True in code to allow it)",
        field="url",
    )


def resolve_url(
    base: str | None,
    url: str,
    *,
    allow_unsafe_urls: bool = False,
    origins: tuple[str, ...] = (),
) -> str:
    """Resolve a manifest's shard ``url`` against ``base`` (the manifest's directory).

    Refused unless ``allow_unsafe_urls``: ``pipe:`` urls (a manifest must never make
    shardkit run a command) and any url that resolves outside ``base`` (``../..``,
    ``file:///etc/...``, another host, a percent-encoded ``%2e%2e``), except a remote url
    under one of ``origins`` when ``base`` is a local directory (see the module
    docstring). Raises :class:`ManifestError`.
    """
    if url.startswith("pipe:"):
        if not allow_unsafe_urls:
            raise ManifestError(
                f"refusing url {url!r}: a manifest may not run commands "
                "(pass allow_unsafe_urls=True in code to allow it)",
                field="url",
            )
        return url
    if base is None:
        return url
    target = url
    if url.startswith("file://"):
        target = unquote(urlsplit(url).path)
    full = target if is_absolute(target) else join(base, target)
    if "://" not in base and "://" not in full:
        full = os.path.normpath(full)
    if allow_unsafe_urls:
        return full
    prefix = base.rstrip("/") + "/"
    if "://" not in base and full.startswith(REMOTE_PREFIXES):
        for origin in origins:
            if origin.startswith(REMOTE_PREFIXES) and _inside(full, origin):
                return full
    if not full.startswith(prefix):
        raise _refuse(url, full, base)
    if "://" in full:
        # a server decodes %2e%2e to '..': the decoded path must stay inside too
        path, base_path = unquote(urlsplit(full).path), unquote(urlsplit(base).path)
        if not posixpath.normpath(path).startswith(base_path.rstrip("/") + "/"):
            raise _refuse(url, full, base)
    return full


def names_host(origin: str) -> bool:
    """Whether a remote prefix names a host (or bucket): ``http://`` alone names none."""
    try:
        return bool(urlsplit(origin).hostname)
    except ValueError:
        return False


def _inside(full: str, origin: str) -> bool:
    """``full`` lies under the remote prefix ``origin``, also once a server decodes it."""
    if not names_host(origin):
        return False
    prefix = origin.rstrip("/") + "/"
    if not full.startswith(prefix):
        return False
    parts, root = urlsplit(full), urlsplit(prefix)
    path = posixpath.normpath(unquote(parts.path))
    return path.startswith(unquote(root.path).rstrip("/") + "/") and not parts.query


_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")
MAX_EXPANSION = 10_000_000  # a pattern naming more shards than this is a typo


def expand_braces(pattern: str) -> list[str]:
    """Expand ``data-{000000..000099}.tar`` into the list of names (zero padding kept)."""
    count = 1
    for lo, hi in _BRACE.findall(pattern):
        count *= max(int(hi) - int(lo) + 1, 1)
    if count > MAX_EXPANSION:
        raise ConfigError(f"brace pattern {pattern!r} names {count} items; too many")
    m = _BRACE.search(pattern)
    if m is None:
        if "{" in pattern or "}" in pattern:
            raise ConfigError(f"bad brace pattern {pattern!r}: use {{000000..000099}}")
        return [pattern]
    lo, hi = m.group(1), m.group(2)
    if int(hi) < int(lo):
        raise ConfigError(f"bad brace pattern {pattern!r}: {hi} < {lo}")
    width = len(lo) if lo.startswith("0") else 0
    head, tail = pattern[: m.start()], pattern[m.end() :]
    out: list[str] = []
    for i in range(int(lo), int(hi) + 1):
        out.extend(head + str(i).zfill(width) + rest for rest in expand_braces(tail))
    return out


def check_within(url: str, base: str | None) -> None:
    """Refuse a local ``url`` whose real path (every link followed) is outside ``base``.

    A manifest's urls are checked as text when it is loaded; a symbolic link in the shard
    directory can still point anywhere, so where a local shard or index is opened its real
    path is checked too (:class:`ManifestError`). Remote urls and a None base pass.
    """
    if base is None or "://" in base or url_scheme(url) != "file":
        return
    real = os.path.realpath(local_path(url))
    root = os.path.realpath(base)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise ManifestError(
            f"refusing {url!r}: its real path {real!r} (through a symbolic link) is outside "
            f"the manifest's base {root!r} (pass allow_unsafe_urls=True in code to allow it)",
            field="url",
        )


class WithinBase:
    """What :func:`check_within` checks, for the many shards of one base: the real path
    of the base and of each directory found once, then one ``lstat`` a shard (a shard
    that is a link, or anything unusual, gets the full check)."""

    def __init__(self, base: str | None) -> None:
        self.base = base
        self.local = base is not None and "://" not in base
        root = os.path.realpath(base) if base is not None and self.local else ""
        self._root = root.rstrip(os.sep) + os.sep
        self._dirs: dict[str, str] = {}

    def __call__(self, url: str) -> None:
        if not self.local or url_scheme(url) != "file":
            return
        path = local_path(url)
        head, name = os.path.split(path)
        try:
            link = stat.S_ISLNK(os.lstat(path).st_mode)
        except OSError:
            link = True  # missing: the full check says what it can, the open the rest
        real_dir = self._dirs.get(head)
        if real_dir is None:
            real_dir = self._dirs[head] = os.path.realpath(head)
        if link or name in ("", ".", "..") or not (real_dir + os.sep).startswith(self._root):
            check_within(url, self.base)
