"""Images in and out of shards: encode PIL images and uint8 arrays by field extension,
and re-encode image files (resize, change format) while building.

Pillow is optional (``pip install 'shardkit[image]'``) and imported only when an image
is encoded; a missing Pillow is a :class:`ConfigError` saying what to install.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.errors import ConfigError

__all__ = [
    "IMAGE_EXTS",
    "REENCODE_FORMATS",
    "ImageOptions",
    "encode_image",
    "is_image_value",
    "reencode_image",
]

IMAGE_EXTS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "webp", "gif", "tif", "tiff"}
)
REENCODE_FORMATS = ("jpg", "png", "webp")
_PIL_FORMAT = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WEBP",
    "bmp": "BMP",
    "tif": "TIFF",
    "tiff": "TIFF",
    "ppm": "PPM",
    "pgm": "PPM",
    "pbm": "PPM",
    "gif": "GIF",
}
_NO_ALPHA = frozenset({"JPEG", "PPM", "BMP"})


@dataclass(frozen=True)
class ImageOptions:
    """How a build re-encodes image files.

    Args:
        maxside: shrink images whose longer side exceeds this (aspect kept); None: keep.
        reencode: store every image field in this format (``jpg``, ``png``, ``webp``);
            None: keep each file's own format (re-encoded only when it was resized).
        quality: JPEG/WebP quality (1-95).
    """

    maxside: int | None = None
    reencode: str | None = None
    quality: int = 90


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ConfigError("encoding images needs Pillow: pip install 'shardkit[image]'") from None
    return Image


def is_image_value(value: Any) -> bool:
    """Whether ``value`` is something :func:`encode_image` takes (not bytes)."""
    if isinstance(value, np.ndarray):
        return True
    return type(value).__module__.startswith("PIL.")


def _to_pil(value: Any) -> Any:
    image = _pil()
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8:
            raise TypeError(f"an image array must be uint8, got {value.dtype}")
        if value.ndim == 3 and value.shape[2] == 1:
            value = value[:, :, 0]
        if value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (3, 4)):
            raise TypeError(f"an image array must be HxW, HxWx3 or HxWx4, got {value.shape}")
        return image.fromarray(np.ascontiguousarray(value))
    if not isinstance(value, image.Image):
        raise TypeError(f"not an image: {type(value).__name__}")
    return value


def _save(img: Any, ext: str, quality: int) -> bytes:
    fmt = _PIL_FORMAT.get(ext)
    if fmt is None:
        raise ValueError(f"no image encoder for .{ext}")
    if fmt in _NO_ALPHA and img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    out = io.BytesIO()
    opts: dict[str, Any] = {}
    if fmt in ("JPEG", "WEBP"):
        opts["quality"] = quality
    img.save(out, format=fmt, **opts)
    return out.getvalue()


def encode_image(value: Any, ext: str, *, quality: int = 90) -> bytes:
    """Encode a PIL image or a uint8 array (HxW, HxWx3, HxWx4) as ``ext`` (jpg, png...).

    Raises ``TypeError``/``ValueError`` for a value that is not an image (the writer turns
    them into a :class:`WriterError` naming the sample and field).
    """
    return _save(_to_pil(value), ext.lower(), quality)


def reencode_image(data: bytes, ext: str, opts: ImageOptions) -> bytes:
    """Re-encode the image file ``data`` (of extension ``ext``) as ``opts`` asks.

    EXIF orientation is applied first: it does not survive the re-encode.
    """
    image = _pil()
    from PIL import ImageOps

    with image.open(io.BytesIO(data)) as img:
        img.load()
        out = ImageOps.exif_transpose(img)
    if opts.maxside is not None and max(out.size) > opts.maxside:
        out.thumbnail((opts.maxside, opts.maxside), image.Resampling.LANCZOS)
    return _save(out, (opts.reencode or ext).lower(), opts.quality)
