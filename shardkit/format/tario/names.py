"""Member names: which are safe (one rule for reader and writer), and key/field splitting.

A shard's member names become sample keys, and people write samples back to disk by key,
so a name that is absolute (``/etc/x``, ``C:x``), climbs out (``a/../../x``), or holds a
backslash or NUL is hostile. The writer refuses to write any key the reader would refuse.
"""

from __future__ import annotations

__all__ = ["key_problem", "name_problem", "split_key"]


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
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # bytes that were not UTF-8, kept as surrogates
            return "has a name that is not valid UTF-8"
    return None


def key_problem(key: str) -> str | None:
    """Why ``key`` would not round-trip through a tar member name, or None."""
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
    return None


def split_key(name: str) -> tuple[str, str] | None:
    """Split ``dir/abc.tokens.npy`` into ``("dir/abc", "tokens.npy")``; None without a dot."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1:
        return None
    return name[:dot], name[dot + 1 :]
