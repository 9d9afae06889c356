"""Image conversations whose answers depend on the image: coloured shapes drawn with Pillow.

Each image is one shape (circle, square or triangle) in one colour (red, green, blue or yellow),
of random size and place on a light background; the question is the same for every image, so
only the image tells the answer (``a red circle``). :func:`write_conversations` writes the images
and a JSONL file cycling through every accepted record form (OpenAI ``image_url`` with a
``file://`` URL, OpenAI ``image`` with a relative path, LLaVA ``<image>`` with an ``images``
list), for building a VL dataset; :func:`held_out_examples` draws images no build has seen, as
Megatron-Bridge's Qwen-VL collate takes them, for scoring a model on them. Deterministic for a seed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

COLOURS = {"red": (220, 40, 40), "green": (40, 160, 60), "blue": (40, 80, 220), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square", "triangle")
QUESTION = "What is in the picture?"
FORMS = ("image_url", "image", "llava")
SIDES = (64, 112)  # image width and height are drawn from this range (pixels)


def answer(colour: str, shape: str) -> str:
    return f"a {colour} {shape}"


def draw(colour: str, shape: str, rng: random.Random) -> Any:
    """One ``colour`` ``shape`` on a light background, its size and place drawn from ``rng``."""
    from PIL import Image, ImageDraw

    width, height = rng.randint(*SIDES), rng.randint(*SIDES)
    grey = rng.randint(225, 255)
    image = Image.new("RGB", (width, height), (grey, grey, grey))
    side = rng.randint(int(0.4 * min(width, height)), int(0.8 * min(width, height)))
    x, y = rng.randint(0, width - side), rng.randint(0, height - side)
    pen, fill = ImageDraw.Draw(image), COLOURS[colour]
    if shape == "circle":
        pen.ellipse((x, y, x + side, y + side), fill=fill)
    elif shape == "square":
        pen.rectangle((x, y, x + side, y + side), fill=fill)
    else:
        pen.polygon([(x + side // 2, y), (x, y + side), (x + side, y + side)], fill=fill)
    return image


def _pairs(n: int, rng: random.Random) -> list[tuple[str, str]]:
    return [(rng.choice(list(COLOURS)), rng.choice(SHAPES)) for _ in range(n)]


def record(form: str, image: str, colour: str, shape: str) -> dict:
    """One conversation about ``image`` (a path or URL as the record writes it) in ``form``."""
    reply = answer(colour, shape)
    if form == "llava":
        return {
            "conversations": [{"from": "human", "value": f"<image>\n{QUESTION}"}, {"from": "gpt", "value": reply}],
            "images": [image],
        }
    part = (
        {"type": "image_url", "image_url": {"url": image}}
        if form == "image_url"
        else {"type": "image", "image": image}
    )
    return {
        "messages": [
            {"role": "user", "content": [part, {"type": "text", "text": QUESTION}]},
            {"role": "assistant", "content": reply},
        ]
    }


def write_conversations(folder: str | Path, n: int, *, seed: int = 0, forms: tuple[str, ...] = FORMS) -> Path:
    """``n`` shape images under ``folder/images/`` and ``folder/conversations.jsonl`` about them,
    record ``i`` in ``forms[i % len(forms)]``; returns the JSONL path."""
    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines = []
    for i, (colour, shape) in enumerate(_pairs(n, rng)):
        name = f"images/{i:06d}.png"
        draw(colour, shape, rng).save(folder / name)
        form = forms[i % len(forms)]
        where = (folder / name).resolve().as_uri() if form == "image_url" else name
        lines.append(json.dumps(record(form, where, colour, shape)))
    path = folder / "conversations.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def held_out_examples(n: int, *, seed: int = 10_000) -> list[dict]:
    """``n`` conversations about freshly drawn images (a seed apart from the training images'), in
    the form Megatron-Bridge's Qwen-VL collate takes: the image inline, the answer as the
    assistant's text; each with its ``colour`` and ``shape``."""
    rng = random.Random(seed)
    out = []
    for colour, shape in _pairs(n, rng):
        conversation = [
            {
                "role": "user",
                "content": [{"type": "image", "image": draw(colour, shape, rng)}, {"type": "text", "text": QUESTION}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": answer(colour, shape)}]},
        ]
        out.append({"conversation": conversation, "colour": colour, "shape": shape})
    return out
