"""The keys an override may name, per section, without importing Megatron-Bridge.

``keys.json`` lists, for each section of the ConfigContainer, every field of every config
class that section can hold: the classes the section's annotation names and their subclasses, and
the classes of every recipe built with every ``--dataset`` kind. A misspelt field (``train.trian_iters``)
is then answered before Megatron is imported, in a fraction of a second; a key this
catalogue holds still goes through the full check on the built config. Sections whose value is a
mapping take any key.

    python -m bridge_recipes.config.keys_generate --write   # after upgrading Megatron-Bridge
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

CATALOGUE = Path(__file__).with_name("keys.json")
OPEN = "*"  # a section (or a mapping-valued one) that takes any key


@lru_cache(maxsize=1)
def catalogue() -> dict[str, list[str]]:
    """Section -> its field names (``["*"]`` for a section that takes any key); empty when missing."""
    try:
        return json.loads(CATALOGUE.read_text())
    except (OSError, ValueError):
        return {}


def unknown_field(key: str) -> str | None:
    """What to say of ``section.field[...]`` when no config class of its section has that field (the
    nearest fields, or the section); None when it may be valid (or the catalogue cannot tell)."""
    section, dot, rest = key.partition(".")
    fields = catalogue().get(section)
    if not dot or not fields or OPEN in fields:
        return None
    name = rest.split(".", 1)[0]
    if name in fields:
        return None
    elsewhere = [f"{s}.{name}" for s, names in catalogue().items() if name in names]
    if elsewhere:
        return f"Did you mean {' or '.join(elsewhere[:3])}?"
    near = difflib.get_close_matches(name, fields, n=3, cutoff=0.6)
    if near:
        return f"Nearest valid keys: {', '.join(f'{section}.{n}' for n in near)}."
    return f"No config of section {section!r} has a field {name!r}."
