"""The compact form of a remote manifest (http(s), s3): built once per node, keyed by content.

A local manifest keeps its form beside it; a remote one keeps it in the node's cache dir
(``cache_dir/manifest-cols/``), or without one in the user's cache dir
(``$XDG_CACHE_HOME/shardkit/manifest-cols/``, else ``~/.cache/...``), one file per
location: where the manifest lives in full (scheme, host and port or, for ``s3://``, the
endpoint, region and profile the client talks to, bucket, key), never the url's text alone,
so one ``s3://`` url on two stores has two forms. The form names the url, that location and
the SHA-256 and size of the manifest bytes it was built from, and it is used only while
those are the bytes the server gives:

- with a cache dir, a form younger than ``manifest_ttl`` is mapped as it is (the node's
  manifest copy follows the same rule: no request); an older one is checked under a lock
  by one process of the node against the bytes of the node's manifest copy
  (``opener.fetch_manifest``: one conditional request per node), and rebuilt when they
  differ, so a node still costs one manifest request however many processes it runs;
- without one, every process fetches the manifest as before (one request each) and
  maps the form when its digest matches, instead of parsing the JSON.

A damaged form (its checksum) is rebuilt, a form for another location never used.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

from shardkit._types import Opener
from shardkit.cache.locks import locked
from shardkit.errors import ManifestError
from shardkit.format.manifest.compact import Compact, map_compact, write_or_keep
from shardkit.format.manifest.model import Manifest

__all__ = ["form_dir", "open_remote_compact", "reopen_remote_compact"]

log = logging.getLogger(__name__)
_DIR = "manifest-cols"


def form_dir(cache_dir: str | None) -> str:
    """Where remote manifests' forms are kept: the node cache, else the user's cache dir."""
    if cache_dir is not None:
        return os.path.join(cache_dir, _DIR)
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "shardkit", _DIR)


def _form_path(location: str, cache_dir: str | None) -> str:
    name = hashlib.sha256(location.encode()).hexdigest()[:32]
    return os.path.join(form_dir(cache_dir), name + ".cols")


def _for_url(url: str, path: str, location: str | None = None) -> Any:
    def fits(header: dict[str, Any]) -> None:
        src = header.get("source") or {}
        if src.get("url") != url or (location is not None and src.get("location") != location):
            where = url if location is None else location
            raise ManifestError(f"compact form of another manifest, not {where}", path=path)

    return fits


def _mapped(url: str, location: str, path: str, ttl: float | None) -> Compact | None:
    """The form at ``path`` when it is ``location``'s, whole, and (with ``ttl``) fresh."""
    try:
        if ttl is not None and time.time() - os.stat(path).st_mtime >= ttl:
            return None
        return map_compact(path, _for_url(url, path, location))
    except FileNotFoundError:
        return None
    except (ManifestError, OSError, ValueError) as exc:
        log.warning("%s: building it again", exc)
        return None


def open_remote_compact(
    url: str, opener: Opener, *, location: str, cache_dir: str | None, ttl: float
) -> Compact | None:
    """The compact form of the remote manifest at ``url``, which lives at ``location``
    (see the module docstring); None where no directory for it can be written (the
    caller parses the JSON)."""
    path = _form_path(location, cache_dir)
    fresh_for = ttl if cache_dir is not None and ttl > 0 else None
    if fresh_for is not None:
        form = _mapped(url, location, path, fresh_for)
        if form is not None:
            return form
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as exc:
        log.info("%s: no compact form (%s)", url, exc)
        return None
    if not os.access(os.path.dirname(path), os.W_OK):
        return None
    with locked(path + ".lock"):
        if fresh_for is not None:  # another process of the node checked it meanwhile
            form = _mapped(url, location, path, fresh_for)
            if form is not None:
                return form
        data = opener.fetch_manifest(url)
        digest = hashlib.sha256(data).hexdigest()
        form = _mapped(url, location, path, None)
        src = (form.header.get("source") or {}) if form is not None else {}
        if form is not None and (src.get("sha256"), src.get("size")) == (digest, len(data)):
            os.utime(path)
            return form
        source = {"url": url, "location": location, "sha256": digest, "size": len(data)}
        manifest = Manifest.loads(data, source=url)
        del data
        return write_or_keep(manifest, path, source, _for_url(url, path, location))


def reopen_remote_compact(url: str, path: str) -> Compact:
    """The form a parent process opened, mapped again in a worker."""
    return map_compact(path, _for_url(url, path))
