"""Bytes from somewhere: the one seam every shard, index and manifest read goes through.

``open_url(url, start=, end=)`` returns a binary stream positioned at byte ``start`` of
``url`` that ends at ``end`` (exclusive) or at the end of the object. Local paths and
``file://`` urls are served here; remote schemes are dispatched to their modules.
``pipe:CMD`` runs a command and is refused unless the caller passes ``allow_pipe=True``
in code (a manifest can never turn it on).
"""

from __future__ import annotations

from shardkit.io.local import LocalOpener, open_local
from shardkit.io.opener import Opener, read_range, url_scheme

__all__ = ["LocalOpener", "Opener", "open_local", "read_range", "url_scheme"]
