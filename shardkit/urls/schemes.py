"""What kind of url a string is: its scheme, the schemes read over the network, a local path."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

__all__ = [
    "HTTP_SCHEMES",
    "OBJECT_SCHEMES",
    "REMOTE_PREFIXES",
    "REMOTE_SCHEMES",
    "is_absolute",
    "local_path",
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
