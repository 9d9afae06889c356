"""Every recipe's built config, byte for byte, against the committed fingerprints.

A refactor of the library must leave what each recipe builds unchanged: the config file text
(:func:`bridge_recipes.config_files.to_text`) of every recipe as the runner builds it, and of each
text recipe on packed rows with conversation boundaries (where the rows per micro batch a recipe
declares become one packed sequence), hashed and compared with ``recipe_configs.json``. A change that is meant
rewrites the file: ``python tests/unit/test_recipe_configs.py --write`` (``--show NAME [rows]``
prints one config's text).
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import pytest

from bridge_recipes import config_files, registry
from bridge_recipes.builder import build
from bridge_recipes.models.qwen35 import is_vlm

FINGERPRINTS = Path(__file__).with_name("recipe_configs.json")
ROWS = "/rows-with-boundaries"  # the rows path as it appears in the fingerprinted text


def _rows_folder(tmp: Path) -> Path:
    """A rows folder whose manifest says ``boundaries``: all the build reads of the rows."""
    from bridge_recipes.data.sft_rows import build_sft_rows

    src = tmp / "c.jsonl"
    convs = [
        {"messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": "a"}]} for i in range(4)
    ]
    src.write_text("".join(json.dumps(c) + "\n" for c in convs))
    tokenizer = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"
    build_sft_rows(src, tokenizer, tmp / "rows", row_tokens=64, packing="boundaries", progress=False)
    return tmp / "rows"


def config_texts(name: str, rows: Path) -> dict[str, str]:
    """The config texts of recipe ``name``: as built (``recipe``) and, for a text recipe, on packed
    rows with boundaries (``rows``); the working folder, where the default save folders lie, as ``.``."""
    texts = {"recipe": _text(build(name), name)}
    if not is_vlm(build(name)):
        texts["rows"] = _text(build(name, dataset="sft-rows", overrides=[f"dataset.path={rows}"]), name)
    return {k: t.replace(str(rows), ROWS).replace(str(Path.cwd()), ".") for k, t in texts.items()}


def _text(cfg, name: str) -> str:
    return config_files.to_text(cfg, name)


def fingerprints() -> dict[str, dict[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = _rows_folder(Path(tmp))
        return {
            name: {k: hashlib.sha256(t.encode()).hexdigest() for k, t in config_texts(name, rows).items()}
            for name in sorted(registry.discover())
        }


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
    plain = config_files.to_text(build(name), name)
    changed = config_files.to_text(build(name, overrides=["train.train_iters=7"]), name)
    assert hashlib.sha256(plain.encode()).digest() != hashlib.sha256(changed.encode()).digest()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        FINGERPRINTS.write_text(json.dumps(fingerprints(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {FINGERPRINTS}")
    elif sys.argv[1:2] == ["--show"] and len(sys.argv) >= 3:
        with tempfile.TemporaryDirectory() as tmp:
            print(config_texts(sys.argv[2], _rows_folder(Path(tmp)))[sys.argv[3] if len(sys.argv) > 3 else "recipe"])
    else:
        sys.exit("usage: python tests/unit/test_recipe_configs.py --write | --show NAME [recipe|rows]")
