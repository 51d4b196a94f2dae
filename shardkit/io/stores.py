"""Writing objects to object stores (``s3://``, ``gs://``, ``az://``): what a writer needs.

An :class:`ObjectStore` puts small objects whole (indexes, manifests, journal entries) and
streams big ones up as they are written (:meth:`ObjectStore.upload`): S3 multipart uploads,
GCS resumable uploads, Azure block blobs. An upload keeps at most one part in memory
(``part_size``, 8 MiB by default), never a whole shard, and the object appears only when
:meth:`Upload.complete` is called: a writer that dies leaves no partial object. What a
dead writer leaves behind is named by the store:

- S3: an unfinished multipart upload is billed until aborted; :meth:`abort_stale` aborts
  those under a prefix older than a grace time (a writer calls it on start), and a bucket
  lifecycle rule (``AbortIncompleteMultipartUpload``) is the belt to these braces;
- GCS: an unfinished resumable session holds no object and expires after a week;
- Azure: uncommitted blocks are dropped by the service after a week.

The interface is in :mod:`shardkit.io.store_base`, the stores in :mod:`shardkit.io.store_s3`,
:mod:`shardkit.io.store_gs` and :mod:`shardkit.io.store_az`. Clients come from the same
places the readers' do (:mod:`shardkit.io.s3`,
:mod:`shardkit.io.blobs`). Every write request is retried by shardkit's own loop, under
the policy and deadline of reads (:meth:`ObjectStore.again`): an S3 part is sent again
whole under its number, a GCS chunk from where the session says the store has the bytes
to, an Azure block again under its id; a commit (S3's complete, Azure's block list) is
idempotent, and a complete whose first answer was lost finds the object made. The object
appears only at its commit, so a write that fails after its retries leaves none.
"""

from __future__ import annotations

from shardkit.errors import ConfigError
from shardkit.io.store_az import AzStore
from shardkit.io.store_base import DEFAULT_PART_SIZE, ObjectStore
from shardkit.io.store_gs import GsStore
from shardkit.io.store_s3 import S3Store
from shardkit.urls import OBJECT_SCHEMES, parse_url

__all__ = ["open_store"]


def open_store(
    url: str, *, endpoint_url: str | None = None, part_size: int | None = None
) -> tuple[ObjectStore, str]:
    """The store of an object-store url and the key prefix inside it (no leading ``/``),
    as :func:`shardkit.urls.parse_url` splits it (a url it refuses is a ConfigError)."""
    where = parse_url(url)
    if where.scheme not in OBJECT_SCHEMES:
        raise ConfigError(f"not an s3://, gs:// or az:// url: {where}")
    size = part_size or DEFAULT_PART_SIZE
    store: ObjectStore
    if where.scheme == "s3":
        store = S3Store(where.bucket, endpoint_url=endpoint_url, part_size=size)
    elif where.scheme == "gs":
        store = GsStore(where.bucket, part_size=size)
    else:
        store = AzStore(where.bucket, part_size=size)
    return store, where.key
