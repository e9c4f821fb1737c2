"""Decode an input image (a ``data:`` URL or fetched bytes) to an RGB PIL image.

The pixel count is checked from the header before the image is decoded (a small file can hold a
huge image), and only common still-image formats are read.
"""

from __future__ import annotations

import base64
import binascii
import io

from omni_ray.inputs.errors import InputError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
FIELD = "image_url.url"


def data_url_bytes(url: str) -> bytes:
    """The payload of a ``data:image/...;base64,...`` URL."""
    header, sep, payload = url.partition(",")
    if not sep or not header.lower().startswith("data:"):
        raise InputError("expected a data: URL", FIELD, "invalid_image")
    mime = header[5:].split(";")[0].strip().lower()
    if mime and not mime.startswith("image/"):
        raise InputError(f"the data URL holds {mime!r}, not an image", FIELD, "invalid_image")
    if not header.lower().endswith(";base64"):
        raise InputError("the image data URL must be base64 (';base64,')", FIELD, "invalid_image")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InputError("the image data URL is not valid base64", FIELD, "invalid_image") from None


def decode_image(data: bytes, *, max_pixels: int):
    """Image bytes -> RGB ``PIL.Image`` (first frame of an animation)."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise InputError(f"cannot decode the image (supported: {', '.join(FORMATS)})", FIELD,
                         "invalid_image") from None
    except Exception as e:
        raise InputError(f"cannot decode the image: {type(e).__name__}", FIELD,
                         "invalid_image") from None
    w, h = img.size
    if w * h > max_pixels:
        raise InputError(f"the image is {w}x{h} = {w * h} pixels, over limits.max_image_pixels="
                         f"{max_pixels}", FIELD, "image_too_large")
    if w < 1 or h < 1:
        raise InputError("the image is empty", FIELD, "invalid_image")
    try:
        img.load()
        return img.convert("RGB")
    except Exception as e:  # truncated or corrupt pixel data
        raise InputError(f"cannot decode the image: {type(e).__name__}", FIELD,
                         "invalid_image") from None

