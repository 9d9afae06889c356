"""Image conversations as users hold them, read into one form (docs/sft_data.md, VL section).

Accepted records (one JSON object a line):

- OpenAI style: ``{"messages": [...]}`` whose ``content`` is a string or a list of parts:
  ``{"type": "text", "text": ...}``, ``{"type": "image_url", "image_url": {"url": "file:///x.png"}}``
  (``image_url`` may also be the URL string itself) and ``{"type": "image", "image": "x.png"}``;
- LLaVA style: ``<image>`` placeholders in the text, the images in the record's ``images`` list
  (or one ``image``) in placeholder order; the turns under ``messages`` or ``conversations``, as
  ``role`` / ``content`` or LLaVA's ``from`` (``human``, ``gpt``, ``system``) / ``value``.

An image is a local path (relative to the JSONL file's folder, or absolute), a ``file:`` URL or
a ``data:image/...;base64,`` URL; ``http(s)`` URLs are not fetched. Every turn comes out as a
list of parts with ``{"type": "image"}`` where an image goes, the images in that order beside
it: the form Megatron-Bridge's Energon ChatML samples carry (``conversation`` JSON and ``imgs``).
A record that cannot be used raises :class:`MalformedConversation` with a reason the build
counts; a missing, unreadable or oversized image skips its conversation the same way.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from bridge_recipes.chat.errors import MalformedConversation
from bridge_recipes.chat.message_text import assistant_image_problem

MESSAGES_KEYS = ("messages", "conversations")
IMAGES_KEYS = ("images", "image")
IMAGE_PLACEHOLDER = "<image>"
ROLES = ("system", "user", "assistant")
LLAVA_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant"}
SUPERVISED_ROLE = "assistant"
# qwen-vl-utils (Megatron-Bridge's Qwen-VL collate) refuses images more elongated than this.
MAX_ASPECT_RATIO = 200
DEFAULT_MAX_IMAGE_BYTES = 64 * 2**20
DEFAULT_MAX_IMAGE_PIXELS = 64 * 2**20  # 8,192 x 8,192: a photograph fits, a decompression bomb does not


@dataclass(frozen=True)
class ImageRef:
    """Where one image of a conversation comes from: a file, or the bytes of a data URL."""

    source: str  # as the record writes it
    path: Path | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class Image:
    """One image read and checked: its file bytes (stored as they are) and its size."""

    data: bytes
    width: int
    height: int


@dataclass(frozen=True)
class VlConversation:
    """Turns as lists of parts (``{"type": "image"}`` where an image goes) and the images in order."""

    messages: list[dict]
    images: list[ImageRef]


def parse_record(record: dict, index: int, base: Path) -> VlConversation:
    """The turns and images of ``record`` (image paths relative to ``base``)."""
    key = next((k for k in MESSAGES_KEYS if k in record), None)
    if key is None:
        raise MalformedConversation(index, "missing_messages_key", f"record has neither {' nor '.join(MESSAGES_KEYS)}")
    turns = record[key]
    if not isinstance(turns, list):
        raise MalformedConversation(index, "messages_not_a_list", f"{key} is {type(turns).__name__}, not a list")
    if not turns:
        raise MalformedConversation(index, "empty_conversation", f"{key} is an empty list")
    listed = _listed_images(record, index)
    messages: list[dict] = []
    images: list[ImageRef] = []
    placeholders = 0
    for j, turn in enumerate(turns):
        role, content = _role_and_content(turn, j, index)
        parts: list[dict] = []
        for part in [content] if isinstance(content, str) else _parts(content, j, index):
            if isinstance(part, str):
                pieces = part.split(IMAGE_PLACEHOLDER)
                for k, piece in enumerate(pieces):
                    if k:
                        parts.append({"type": "image"})
                        if placeholders < len(listed):
                            images.append(_ref(listed[placeholders], base, index))
                        placeholders += 1
                    if piece.strip():
                        parts.append({"type": "text", "text": piece})
            else:
                parts.append({"type": "image"})
                images.append(_ref(part["source"], base, index))
        if role == SUPERVISED_ROLE and any(p["type"] == "image" for p in parts):
            raise assistant_image_problem(index, j)  # a model writes text: an image is no target
        if role == SUPERVISED_ROLE and not any(p["type"] == "text" and p["text"].strip() for p in parts):
            raise MalformedConversation(
                index, "empty_assistant_reply", f"message {j} is an assistant turn with no text"
            )
        messages.append({"role": role, "content": parts})
    if placeholders != len(listed):
        nulls = [k for k in IMAGES_KEYS if k in record and record[k] is None]
        if nulls and not listed:
            raise MalformedConversation(
                index,
                "image_null",
                f"{nulls[0]} is null, and the text holds {placeholders} {IMAGE_PLACEHOLDER}; give the image path(s)",
            )
        raise MalformedConversation(
            index,
            "image_count_mismatch",
            f"{placeholders} {IMAGE_PLACEHOLDER} placeholder(s) for {len(listed)} image(s) in the images list",
        )
    if not any(m["role"] == SUPERVISED_ROLE for m in messages):
        raise MalformedConversation(index, "no_assistant_turn", "conversation has no assistant turn")
    return VlConversation(messages, images)


def _listed_images(record: dict, index: int) -> list[str]:
    key = next((k for k in IMAGES_KEYS if k in record and record[k] is not None), None)
    if key is None:
        return []
    value = record[key]
    listed = [value] if isinstance(value, str) else value
    if isinstance(listed, list) and None in listed:
        at = listed.index(None)
        raise MalformedConversation(
            index, "image_null", f"{key}[{at}] is null; give the image's path (or drop it and its {IMAGE_PLACEHOLDER})"
        )
    if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
        raise MalformedConversation(index, "bad_image_part", f"{key} must be a path or a list of paths")
    return listed


def _role_and_content(turn: Any, j: int, index: int) -> tuple[str, Any]:
    if not isinstance(turn, dict):
        raise MalformedConversation(index, "message_not_an_object", f"message {j} is {type(turn).__name__}")
    if "from" in turn and "role" not in turn:
        role, content = LLAVA_ROLES.get(turn["from"], turn["from"]), turn.get("value")
    else:
        role, content = turn.get("role"), turn.get("content")
    if role is None or content is None:
        raise MalformedConversation(index, "missing_role_or_content", f"message {j} has no role or no content")
    if role not in ROLES:
        raise MalformedConversation(
            index, "unknown_role", f"message {j} has role {role!r} (expected one of {', '.join(ROLES)})"
        )
    if not isinstance(content, str | list):
        raise MalformedConversation(
            index, "bad_content", f"message {j} content is {type(content).__name__}, not text or a list of parts"
        )
    return role, content


def _parts(content: list, j: int, index: int) -> list[str | dict]:
    """Text parts as strings (their placeholders still in them) and image parts as ``{"source": ...}``."""
    out: list[str | dict] = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if part is None or kind in ("image", "image_url") and _image_value(part) is None:
            what = f"part {k} is null (no text, no image)" if part is None else f"part {k} ({kind}) has a null {kind}"
            raise MalformedConversation(
                index, "image_null", f"message {j}: {what}; give the image's path, or drop the part"
            )
        if kind == "text" and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise MalformedConversation(index, "bad_image_part", f"message {j}: image_url part without a url")
            out.append({"source": url})
        elif kind == "image" and isinstance(part.get("image"), str):
            out.append({"source": part["image"]})
        else:
            shown = kind if kind is not None else type(part).__name__
            raise MalformedConversation(
                index,
                "unsupported_part",
                f"message {j} has a {shown!r} part; parts are text, image_url and image (a path)",
            )
    return out


def _image_value(part: dict) -> Any:
    """What an image or image_url part names (its url, for an image_url given as an object)."""
    value = part.get(part["type"])
    return value.get("url") if part["type"] == "image_url" and isinstance(value, dict) else value


def _ref(source: str, base: Path, index: int) -> ImageRef:
    """Where ``source`` points: a path (relative to ``base``), a file: URL or a data: URL."""
    if source.startswith("data:"):
        header, _, payload = source.partition(",")
        if not header.endswith(";base64") or not payload:
            raise MalformedConversation(
                index, "image_unreadable", "a data: URL image must be base64 (data:...;base64,)"
            )
        try:
            return ImageRef(source[:40], data=base64.b64decode(payload, validate=True))
        except (binascii.Error, ValueError):
            raise MalformedConversation(index, "image_unreadable", "a data: URL image is not valid base64") from None
    scheme = urlparse(source).scheme.lower()
    if scheme in ("http", "https", "ftp", "s3", "gs"):
        raise MalformedConversation(
            index, "image_remote", f"image {source} is a remote URL; download it and give the local path"
        )
    path = Path(unquote(urlparse(source).path)) if scheme == "file" else Path(source)
    path = path.expanduser()
    return ImageRef(source, path=path if path.is_absolute() else base / path)


def load_image(ref: ImageRef, index: int, *, max_bytes: int, max_pixels: int) -> Image:
    """The image ``ref`` points at, read whole and decoded once to prove it decodes; reasons:
    ``image_missing``, ``image_unreadable``, ``image_oversized`` (bytes or pixels over the limits,
    checked before decoding) and ``image_aspect_ratio``."""
    from PIL import Image as PILImage

    if ref.data is not None:
        data = ref.data
    else:
        path = ref.path if ref.path is not None else Path(ref.source)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise MalformedConversation(index, "image_missing", f"image {ref.source} not found ({path})") from None
        except OSError as e:
            raise MalformedConversation(index, "image_unreadable", f"image {path}: {e.strerror}") from None
        if not path.is_file():
            raise MalformedConversation(index, "image_missing", f"image {path} is not a file")
        if size > max_bytes:
            raise MalformedConversation(
                index, "image_oversized", f"image {path} is {size:,} bytes, over --max-image-bytes {max_bytes:,}"
            )
        try:
            data = path.read_bytes()
        except OSError as e:
            raise MalformedConversation(index, "image_unreadable", f"image {path}: {e.strerror}") from None
    if len(data) > max_bytes:
        raise MalformedConversation(
            index,
            "image_oversized",
            f"image {ref.source} is {len(data):,} bytes, over --max-image-bytes {max_bytes:,}",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(data)) as img:
                width, height = img.size
                if width * height > max_pixels:
                    raise MalformedConversation(
                        index,
                        "image_oversized",
                        f"image {ref.source} is {width} x {height} pixels, over --max-image-pixels {max_pixels:,}",
                    )
                img.load()
    except MalformedConversation:
        raise
    except PILImage.DecompressionBombError as e:
        raise MalformedConversation(index, "image_oversized", f"image {ref.source}: {e}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:  # what PIL raises on a file it cannot decode
        raise MalformedConversation(index, "image_unreadable", f"image {ref.source} does not decode ({e})") from None
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise MalformedConversation(
            index,
            "image_aspect_ratio",
            f"image {ref.source} is {width} x {height}: more than {MAX_ASPECT_RATIO}:1, which the Qwen-VL "
            "image pipeline refuses",
        )
    return Image(data, width, height)


def relative_base(jsonl: str | os.PathLike) -> Path:
    """The folder relative image paths of ``jsonl`` are read from: the file's own folder."""
    return Path(jsonl).expanduser().resolve().parent
