"""Shard urls in manifests: resolving them safely against the manifest's base, brace patterns.

A manifest is data, and data must never make shardkit run a command or read outside the
data set: :func:`resolve_url` refuses ``pipe:`` urls and anything that lands outside the
manifest's base unless the caller allows it in code.

**Adopted data sets** (``shardkit manifest from-shards https://host/d/x-{0..9}.tar -o DIR``)
are the one exception, and it is narrow: such a manifest lists the shards by absolute url
and names the prefix they were adopted from in ``origins`` (``["https://host/d/"]``). A
manifest's origins are honoured only when the manifest itself is read from the local disk
(its base is a local directory: the user wrote it, or put it there) and only for remote
prefixes (``http(s)://``, ``s3://``, ``gs://``, ``az://``): never a local path, ``file://``
or ``pipe:``. A manifest read from a url (a base that is itself remote) has its origins
ignored, so what comes from elsewhere still cannot point outside its base;
``allow_unsafe_urls=True`` remains the only way to lift that, and only in code.

**Remote urls** (``s3://``, ``gs://``, ``az://``, ``hf://``, ``http(s)://``) are split by
one parser, :func:`parse_url`, for readers and writers alike: a url is either taken exactly
as the object key it names, or refused with a :class:`ConfigError` naming it (through
:func:`redact`, which strips credentials from any text).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from shardkit.errors import ConfigError, ManifestError, has_userinfo, redact

__all__ = [
    "HTTP_SCHEMES",
    "OBJECT_SCHEMES",
    "REMOTE_PREFIXES",
    "REMOTE_SCHEMES",
    "ObjectUrl",
    "WithinBase",
    "check_within",
    "dirname",
    "expand_braces",
    "is_absolute",
    "join",
    "local_path",
    "names_host",
    "parse_url",
    "redact",
    "resolve_url",
    "url_scheme",
]

REMOTE_PREFIXES = (
    "http://",
    "https://",
    "s3://",
    "gs://",
    "az://",
    "hf://",
)  # the urls an origin may name


def is_absolute(url: str) -> bool:
    """True for ``scheme://...``, ``/path`` and ``pipe:`` urls."""
    return "://" in url or url.startswith(("/", "pipe:"))


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


HTTP_SCHEMES = ("http", "https")
REMOTE_SCHEMES = (
    *HTTP_SCHEMES,
    "s3",
    "gs",
    "az",
    "hf",
)  # read over the network (and through the cache)
OBJECT_SCHEMES = ("s3", "gs", "az")  # object stores: a bucket (container) and a key


def url_scheme(url: str) -> str:
    """``"http"``, ``"s3"``, ``"gs"``, ``"az"``, ``"pipe"``, ``"file"`` (local paths included)."""
    if url.startswith("pipe:"):
        return "pipe"
    head, sep, _ = url.partition("://")
    if not sep:
        return "file"
    return head.lower()


def local_path(url: str) -> str:
    """The filesystem path of a local path or ``file://`` url."""
    if url.startswith("file://"):
        return unquote(urlsplit(url).path)
    return url


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


# -- the one parser of remote urls -------------------------------------------------------
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # s3, gs, az and the hub's first word
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(?::(\d{1,5}))?")
_CREDENTIALS = (
    "credentials do not belong in a url (they would reach manifests, logs and errors); "
    "give them through the environment (the store's SDK chain, or ~/.netrc for http)"
)


def _refused(url: str, why: str) -> ConfigError:
    return ConfigError(redact(f"refusing url {url!r}: {why}"))


@dataclass(frozen=True)
class ObjectUrl:
    """A remote url split into what it names: made by :func:`parse_url`, never by hand.

    Attributes:
        scheme: ``"s3"``, ``"gs"``, ``"az"``, ``"hf"``, ``"http"`` or ``"https"`` (lower case).
        host: ``http(s)``: the host and port as written (``"Example.org:8080"``); else
            ``""`` (an object store's endpoint is its client's, not the url's).
        bucket: ``s3``/``gs``/``az``: the bucket (container); ``hf``: the first word
            (``"datasets"``, or a model's organisation); ``http(s)``: ``""``.
        key: the object key (or a prefix: ``""`` or ending in ``/``) exactly as written,
            without the ``/`` that follows the bucket or host; ``http(s)``: the path.
        query: ``http(s)``: the query string as written (a presigned url's); else ``""``.
    """

    scheme: str
    host: str
    bucket: str
    key: str
    query: str = ""

    @property
    def url(self) -> str:
        """The url again, spelled once (``s3://bucket/key``); equal to what was parsed up
        to the scheme's case."""
        where = self.host if self.scheme in HTTP_SCHEMES else self.bucket
        query = f"?{self.query}" if self.query else ""
        return f"{self.scheme}://{where}/{self.key}{query}"

    @property
    def is_prefix(self) -> bool:
        """Whether it names a folder-like prefix (``""`` or ending in ``/``), not an object."""
        return not self.key or self.key.endswith("/")

    def join(self, name: str) -> ObjectUrl:
        """The url of ``name`` (a relative key such as ``"data-000000.tar"``) under this
        prefix (a ``/`` is put between them when the key does not end in one); checked as
        any url is (:class:`ConfigError` for ``..``, ``//``, ``#``, ...)."""
        if self.query:
            raise _refused(self.url, "a url with a query is not a prefix to join names to")
        sep = "" if self.is_prefix else "/"
        return parse_url(f"{self.url}{sep}{name}")

    def location(self) -> str:
        """``http(s)``: one canonical spelling of where it is (scheme and host in lower
        case, the port spelled out); what a node's copies are named by. Object stores add
        their client's endpoint to this (see their sources)."""
        if self.scheme not in HTTP_SCHEMES:
            return self.url
        m = _HOST.fullmatch(self.host)
        assert m is not None  # checked by parse_url
        port = m.group(2) or ("443" if self.scheme == "https" else "80")
        query = f"?{self.query}" if self.query else ""
        return f"{self.scheme}://{m.group(1).lower()}:{int(port)}/{self.key}{query}"

    def __str__(self) -> str:
        return redact(self.url)


def _check_key(url: str, key: str) -> None:
    """Refuse a key (or http path) that names another object than its text says."""
    segments = key.split("/")
    for i, seg in enumerate(segments):
        if seg == "" and i < len(segments) - 1:
            raise _refused(url, "an empty path segment ('//') names no key; remove it")
        if unquote(seg) in (".", ".."):
            raise _refused(url, f"the path segment {seg!r} would name another key; remove it")


def parse_url(url: str, *, need_key: bool = False) -> ObjectUrl:
    """Split a remote url into its :class:`ObjectUrl`, or refuse it (:class:`ConfigError`).

    ``s3://bucket/key``, ``gs://bucket/key``, ``az://container/key``, ``hf://...`` and
    ``http(s)://host[:port]/path[?query]``. The rule: a url is taken exactly as the key it
    names, or refused; never quietly read as another place. Refused:

    - credentials in the url (``s3://KEY:SECRET@b/``, ``http://user:pw@host/``): they would
      reach manifests, logs and errors; give them through the environment (the SDKs'
      chains; ``~/.netrc`` for http);
    - ``#`` anywhere, and ``?`` in an object-store or hub url (a client drops what follows
      them: ``s3://b/exp#2/`` would name ``exp``);
    - ``.`` and ``..`` segments (also percent-encoded) and empty segments (``//``), save
      one trailing ``/`` (a prefix);
    - control characters, a backslash in an http(s) url, a bucket or host that is not one.

    Args:
        url: the url.
        need_key: refuse a url that names no object (an empty key or a prefix ending in
            ``/``): a read needs one.
    """
    m = _SCHEME.match(url)
    if m is None:
        raise _refused(url, "not a url of the form scheme://...")
    scheme = m.group(1).lower()
    if scheme not in REMOTE_SCHEMES:
        raise _refused(url, f"unsupported scheme {scheme!r}; use one of {REMOTE_SCHEMES}")
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise _refused(url, "it holds a control character")
    if "#" in url:
        raise _refused(url, "'#' would cut the url there; percent-encode it as %23")
    rest = url[m.end() :]
    query = ""
    if scheme in HTTP_SCHEMES:
        rest, asks, query = rest.partition("?")  # the query: all after the first '?'
        if asks and ("/" not in rest or not query):
            raise _refused(url, "a '?' needs a path before it and a query after it")
    authority, slash, path = rest.partition("/")
    if scheme in HTTP_SCHEMES:
        if "\\" in url:
            raise _refused(url, "a backslash in an http(s) url is read as '/' by some servers")
    elif "?" in url:
        raise _refused(url, f"'?' would cut a {scheme}:// url there; percent-encode it as %3F")
    if scheme in HTTP_SCHEMES:
        host = _HOST.fullmatch(authority)
        ok = host is not None and (host.group(2) is None or int(host.group(2)) <= 65535)
    else:
        ok = _BUCKET.fullmatch(authority) is not None
    # a secret holding '/' (user:pa/ss@host) ends the authority early: refused too, at the
    # cost of a url whose first path segment holds '@' after a port (host:80/a@b)
    looks = has_userinfo(url) and "@" in path.split("/")[0]
    if not ok or looks:
        if "@" in authority or has_userinfo(url):
            raise _refused(url, _CREDENTIALS)
        what = "host[:port]" if scheme in HTTP_SCHEMES else "bucket name"
        raise _refused(url, f"no {what} follows {scheme}://")
    bucket = "" if scheme in HTTP_SCHEMES else authority
    authority = authority if scheme in HTTP_SCHEMES else ""
    if slash:
        _check_key(url, path)
    if need_key and (not path or path.endswith("/")):
        raise _refused(url, "it names no object (a key is needed, not a prefix)")
    return ObjectUrl(scheme, authority, bucket, path, query)
