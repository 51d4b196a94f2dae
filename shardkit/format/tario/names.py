"""Member names: which are safe (one rule for reader and writer), their normal form, and
key/field splitting.

A shard's member names become sample keys, and people write samples back to disk by key,
so a name that is absolute (``/etc/x``, ``C:x``), climbs out (``a/../../x``), or holds a
backslash or NUL is hostile. The writer refuses to write any key the reader would refuse.

The reader hands names out in a normal form: ``.`` parts and empty parts dropped, so
``./a/b.txt`` (what ``tar -C dir -cf s.tar .`` writes), ``a/./b.txt`` and ``a//b.txt`` are
all ``a/b.txt``. The writer takes a key with a leading ``./`` and writes it without (the
key the reader gives back); it refuses other ``.`` or empty parts. The reader keeps name bytes
that are not UTF-8 as surrogate escapes, as Python's tarfile (and so webdataset) reads
them; the writer writes UTF-8 names only, so such a key must be renamed to be written.
"""

from __future__ import annotations

import re

__all__ = [
    "PLAIN_NAME",
    "fast_name",
    "key_problem",
    "name_problem",
    "normal_key",
    "normal_name",
    "split_key",
]


def _is_drive(name: str) -> bool:
    return len(name) >= 2 and name[1] == ":" and name[0].isascii() and name[0].isalpha()


def name_problem(name: str) -> str | None:
    """Why a member ``name`` is unsafe to hand out, or None when it is fine."""
    if not name:
        return "has an empty name"
    if name.startswith("/") or _is_drive(name):
        return "has an absolute path"
    if "\0" in name:
        return "has a NUL in its name"
    if "\\" in name:
        return "has a backslash in its name"
    if ".." in name.split("/"):
        return "escapes its directory ('..')"
    return None


def normal_name(name: str) -> str:
    """``name`` without ``.`` parts and empty parts (``./a//b.txt`` -> ``a/b.txt``); a name
    that ends with ``/`` keeps it (a directory). Absolute names are left as they are."""
    if name.startswith("/") or not ("./" in name or "//" in name or name.endswith("/.")):
        return name
    parts = [p for p in name.split("/") if p not in ("", ".")]
    tail = "/" if name.endswith("/") or name.endswith("/.") else ""
    return "/".join(parts) + tail if parts else name


# a name the fast paths take as it is: parts that are not empty and do not start with a
# dot, no backslash or NUL, no drive ("x:") in front and no "/" at the end
PLAIN_NAME = re.compile(rb"(?!.:)[^/\\\0.][^/\\\0]*(?:/[^/\\\0.][^/\\\0]*)*", re.DOTALL)


def fast_name(raw: bytes) -> str | None:
    """The name a fast path may hand out as it is, or None when in doubt.

    Not None only for a UTF-8 name that :func:`name_problem` passes and
    :func:`normal_name` leaves as it is, and that is not a directory: one regular
    expression (parts that neither are empty nor start with a dot, no backslash, NUL,
    drive or trailing ``/``) rules out everything else, which the general path looks at.
    """
    if PLAIN_NAME.fullmatch(raw) is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def normal_key(key: str) -> str:
    """``key`` without leading ``./`` parts: the key the reader gives back for it."""
    while key.startswith("./"):
        key = key[2:].lstrip("/")
    return key


def key_problem(key: str) -> str | None:
    """Why ``key`` would not round-trip through a tar member name, or None.

    Give it in its normal form (:func:`normal_key`); other ``.`` and empty parts are
    refused, as their member name would come back without them.
    """
    problem = name_problem(key)
    if problem is not None:
        return problem
    if key.endswith("/"):
        return "ends with '/'"
    parts = key.split("/")
    if any(p in ("", ".") for p in parts):
        return "has an empty or '.' path part"
    if "." in parts[-1]:
        return "has a '.' in its last part; readers split keys at the first dot"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8, read as surrogate escapes
        return "is not valid UTF-8; a shard's names are written as UTF-8"
    return None


def split_key(name: str) -> tuple[str, str] | None:
    """Split ``dir/abc.tokens.npy`` into ``("dir/abc", "tokens.npy")``; None without a dot."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1:
        return None
    return name[:dot], name[dot + 1 :]
