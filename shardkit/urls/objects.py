"""The one parser of remote urls (``s3://``, ``gs://``, ``az://``, ``hf://``, ``http(s)://``),
for readers and writers alike: a url is either taken exactly as the object key it names, or
refused with a :class:`ConfigError` naming it (through :func:`redact`, which strips
credentials from any text)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from shardkit.errors import ConfigError, has_userinfo, redact
from shardkit.urls.schemes import HTTP_SCHEMES, REMOTE_SCHEMES

__all__ = ["ObjectUrl", "parse_url"]

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
