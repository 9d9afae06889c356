"""scripts/inspect_rows.py: rows decoded with the supervised spans marked and their statistics,
checked against the rows themselves; bad input exits 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bridge_recipes.data.inspect_rows import CLOSE, OPEN, inspect_rows, row_stats
from bridge_recipes.data.integrity import check_rows
from bridge_recipes.data.sft_rows import build_sft_rows

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
CONVERSATIONS = [
    {"messages": [{"role": "user", "content": f"question {i}?"}, {"role": "assistant", "content": f"answer {i}."}]}
    for i in range(6)
]


@pytest.fixture(scope="module", params=["one_per_row", "boundaries"])
def rows(request, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp(request.param)
    src = tmp / "c.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    build_sft_rows(
        src, TOKENIZER, tmp / "rows", row_tokens=256, packing=request.param, val_fraction=0.3, progress=False
    )
    return tmp / "rows"


def test_supervised_spans_are_the_masked_tokens_and_the_counts_add_up(rows):
    loaded = check_rows(rows)
    text = inspect_rows(rows, [0])
    body = text[text.index("=== row 0") :]
    marked = [part.split(CLOSE)[0] for part in body.split(OPEN)[1:]]
    assert marked and all("answer" in m or "</think>" in m for m in marked)
    assert not any("question" in m for m in marked)  # user turns are not supervised
    m = loaded.manifest
    padding = sum(
        row_stats(loaded.ids[r], loaded.mask[r], None if loaded.cu is None else loaded.cu[r], m["packing"], 0).padding
        for r in range(len(loaded.ids))
    )
    assert padding == m["padding_tokens"]
    stats = row_stats(loaded.ids[0], loaded.mask[0], None if loaded.cu is None else loaded.cu[0], m["packing"], 0)
    assert stats.supervised == int(loaded.mask[0].sum())
    assert f"{stats.supervised} supervised" in text and f"{stats.padding} padding" in text


def test_conversations_per_row_follow_the_packing(rows):
    loaded = check_rows(rows)
    m = loaded.manifest
    counts = [
        row_stats(
            loaded.ids[r], loaded.mask[r], None if loaded.cu is None else loaded.cu[r], m["packing"], 0
        ).conversations
        for r in range(len(loaded.ids))
    ]
    assert sum(counts) == m["conversations"]["used"]


def test_the_validation_split_and_bad_rows_through_the_script(rows):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "scripts/inspect_rows.py"), str(rows)]
    p = subprocess.run([*cmd, "--split", "val"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and f"{rows / 'val'}:" in p.stdout, p.stderr
    p = subprocess.run([*cmd, "--row", "99"], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "--row 99" in p.stderr and "Traceback" not in p.stderr


def test_eos_joined_rows_have_no_padding():
    ids = np.array([5, 6, 0, 7, 8, 0, 9, 0])
    stats = row_stats(ids, np.zeros(8, dtype=np.uint8), None, "eos_joined", 0)
    assert (stats.padding, stats.conversations) == (0, 4)
