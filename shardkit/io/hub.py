"""``hf://`` urls: files of Hugging Face Hub repositories, read through their resolve urls.

``hf://datasets/ORG/NAME/PATH`` (also ``hf://datasets/ORG/NAME@REVISION/PATH``, a revision
with a slash quoted as the Hub does: ``@refs%2Fpr%2F3``; ``models/``
and ``spaces/`` repositories, and ``hf://ORG/NAME/...`` for a model, as ``huggingface_hub``
spells them) is read as ``{HF_ENDPOINT}/datasets/ORG/NAME/resolve/REVISION/PATH`` over HTTP,
with the same ranged requests, retries, deadlines and resume as any ``https://`` url
(:class:`~shardkit.io.http.HttpFetcher`). The endpoint comes from ``HF_ENDPOINT`` (default
``https://huggingface.co``), the token from ``HF_TOKEN``, else the login ``huggingface_hub``
stored (``$HF_TOKEN_PATH``, else ``$HF_HOME/token``, else ``~/.cache/huggingface/token``),
read once per process when its session is made. The token is sent to the endpoint's host
only: a redirect to a CDN host drops it (``requests`` strips Authorization across hosts).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import quote, unquote

import requests

from shardkit.errors import ConfigError
from shardkit.io.http import HttpFetcher
from shardkit.io.retry import Gate
from shardkit.urls import parse_url

__all__ = ["HubFetcher", "hub_token", "resolve_hub_url"]

_KINDS = {"datasets": "datasets/", "models": "", "spaces": "spaces/"}


def resolve_hub_url(url: str, endpoint: str | None = None) -> str:
    """The https resolve url of ``hf://...`` (see the module docstring)."""
    where = parse_url(url)
    if where.scheme != "hf":
        raise ConfigError(f"not an hf:// url: {where}")
    words = [where.bucket, *where.key.split("/")]
    kind = words[0] if words[0] in _KINDS else "models"
    rest = words[1:] if words[0] in _KINDS else words
    if len(rest) < 3 or not all(rest[:2]) or not rest[-1]:
        raise ConfigError(
            f"{url!r}: an hf:// url names a repository and a file: "
            "hf://datasets/ORG/NAME[@REVISION]/PATH"
        )
    org, name, path = rest[0], rest[1], "/".join(rest[2:])
    name, _, revision = name.partition("@")
    base = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    rev = quote(unquote(revision) or "main", safe="")
    return f"{base}/{_KINDS[kind]}{org}/{name}/resolve/{rev}/{quote(path)}"


def hub_token() -> str | None:
    """``HF_TOKEN``, else the token ``huggingface-cli login`` stored, else None."""
    token = os.environ.get("HF_TOKEN")
    if token:
        return token.strip()
    path = os.environ.get("HF_TOKEN_PATH")
    if not path:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
        )
        path = os.path.join(home, "token")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


class HubFetcher(HttpFetcher):
    """Ranged reads of ``hf://`` urls through their resolve urls (module docstring)."""

    def _make_session(self) -> requests.Session:
        s = super()._make_session()
        token = hub_token()
        if token:
            s.headers["Authorization"] = f"Bearer {token}"
        return s

    def location(self, url: str) -> str:
        return parse_url(resolve_hub_url(url)).location()

    def stream(
        self, url: str, start: int = 0, end: int | None = None, *, gate: Gate | None = None
    ) -> Iterator[bytes]:
        return super().stream(resolve_hub_url(url), start, end, gate=gate)

    def get(self, url: str, *, etag: str | None = None) -> tuple[bytes | None, str | None]:
        return super().get(resolve_hub_url(url), etag=etag)
