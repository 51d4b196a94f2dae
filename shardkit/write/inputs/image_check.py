"""Image fields checked as a build reads them (``check_images``): ``header`` (the default)
has Pillow read the header and checks the file ends as its format says (a JPEG's end
marker, a PNG's IEND chunk), which finds truncated files and text named ``.jpg`` cheaply;
``decode`` decodes every image whole; ``off`` trusts them."""

from __future__ import annotations

import io
import re

from shardkit.format.images import IMAGE_EXTS

__all__ = ["CHECK_IMAGES", "image_problem"]

CHECK_IMAGES = ("header", "decode", "off")
_BUFFER = re.compile(r"(?:image file )?<_io\.BytesIO object at 0x[0-9a-fA-F]+>")
_ENDS = {"jpg": b"\xff\xd9", "jpeg": b"\xff\xd9", "png": b"IEND\xaeB`\x82"}


def image_problem(field: str, data: bytes, mode: str) -> str | None:
    """Why the image field ``field`` holding ``data`` is bad, or None (also for a field
    that is no image, and with ``mode="off"``)."""
    ext = field.rsplit(".", 1)[-1].lower()
    if mode == "off" or ext not in IMAGE_EXTS:
        return None
    if not data:
        return f"the {ext} image is empty (0 bytes)"
    from PIL import Image  # Pillow: only when an image is checked

    try:
        with Image.open(io.BytesIO(data)) as im:
            if mode == "decode":
                im.load()
            elif not im.size[0] or not im.size[1]:
                return "the image has no pixels"
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for bad files
        said = _BUFFER.sub("it", str(exc))  # Pillow names our buffer: <_io.BytesIO object at ..>
        return (
            f"not a readable {ext} image ({type(exc).__name__}: {said}); "
            f"its {len(data)} bytes start {data[:8]!r}"
        )
    end = _ENDS.get(ext)
    if end is not None and end not in data[-64:]:
        return f"the {ext} image is truncated (no end marker)"
    return None
