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

from shardkit.urls.objects import ObjectUrl, parse_url
from shardkit.urls.resolve import (
    WithinBase,
    check_within,
    dirname,
    expand_braces,
    join,
    names_host,
    resolve_url,
)
from shardkit.urls.schemes import (
    HTTP_SCHEMES,
    OBJECT_SCHEMES,
    REMOTE_PREFIXES,
    REMOTE_SCHEMES,
    is_absolute,
    local_path,
    url_scheme,
)

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
    "resolve_url",
    "url_scheme",
]
