"""Recipe names in committed results that are not the recipe's name today.

A result names the recipe it measured as the recipe was then called; when a name moves to another
config (the plainly named one-GPU LoRA recipes became the fastest, the leaner ones took ``_lowmem``),
results measured before the move keep their words and are read through :func:`current`. The renames
and the day they took effect are data: ``lab/renamed_recipes.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

_RENAMES = json.loads(Path(__file__).with_name("renamed_recipes.json").read_text())
RENAMED_ON: str = _RENAMES["renamed_on"]  # results measured before it name the recipes by their earlier names
EARLIER_NAMES: dict[str, str] = _RENAMES["earlier_names"]


def current(name: str, measured_on: str) -> str:
    """The recipe's name today for ``name`` in a result dated ``measured_on`` (ISO date)."""
    if str(measured_on)[:10] < RENAMED_ON:
        return EARLIER_NAMES.get(name, name)
    return name
