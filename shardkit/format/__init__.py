"""The shard format on disk: checksums, pieces, codecs, images, compression, the tar
reader and writer (``tario``), the manifest and its forms (``manifest``)."""
