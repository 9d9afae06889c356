"""Every recipe's built config, byte for byte, against the committed fingerprints.

A refactor of the library must leave what each recipe builds unchanged: the config file text
(:func:`bridge_recipes.config.files.to_text`) of every recipe as the runner builds it, and of each
text recipe on packed rows with conversation boundaries (where the rows per micro batch a recipe
declares become one packed sequence), hashed (:mod:`bridge_recipes.config.fingerprint`, the definition a
result file and the measured status use too) and compared with ``recipe_configs.json``. A change that is
meant rewrites the file: ``python tests/unit/test_recipe_configs.py --write`` (``--show NAME [rows]``
prints one config's text).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from bridge_recipes.config.builder import build
from bridge_recipes.config.fingerprint import boundaries_rows, config_text, config_texts, digest
from bridge_recipes.config.fingerprint import fingerprints as fingerprints_of
from bridge_recipes.recipes import registry

FINGERPRINTS = Path(__file__).with_name("recipe_configs.json")


def fingerprints() -> dict[str, dict[str, str]]:
    return fingerprints_of(sorted(registry.discover()))


@pytest.fixture(scope="module")
def current() -> dict[str, dict[str, str]]:
    return fingerprints()


def test_every_recipe_builds_the_committed_config(current):
    committed = json.loads(FINGERPRINTS.read_text())
    assert sorted(current) == sorted(committed), "recipes added or removed: run this file with --write"
    changed = [f"{n} ({k})" for n in current for k in current[n] if committed[n].get(k) != current[n][k]]
    assert not changed, f"configs changed: {', '.join(changed)}; if meant, run this file with --write"


def test_a_changed_field_changes_the_fingerprint():
    name = next(n for n in sorted(registry.discover()) if "peft_1gpu" in n)
    plain = config_text(build(name), name)
    changed = config_text(build(name, overrides=["train.train_iters=7"]), name)
    assert digest(plain) != digest(changed)
    assert fingerprints_of([name])[name]["recipe"] == digest(plain)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        FINGERPRINTS.write_text(json.dumps(fingerprints(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {FINGERPRINTS}")
    elif sys.argv[1:2] == ["--show"] and len(sys.argv) >= 3:
        with tempfile.TemporaryDirectory() as tmp:
            rows = boundaries_rows(Path(tmp) / "rows")
            print(config_texts(sys.argv[2], rows)[sys.argv[3] if len(sys.argv) > 3 else "recipe"])
    else:
        sys.exit("usage: python tests/unit/test_recipe_configs.py --write | --show NAME [recipe|rows]")
