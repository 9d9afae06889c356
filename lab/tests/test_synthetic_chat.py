"""The generated real-format conversations the GPU evidence trains on: stable text, and every one
goes through the row builder (reasoning, tool calls, tool results, list content) with nothing
skipped and the tool call supervised."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bridge_recipes.data.synthetic_chat import conversations_jsonl

TOKENIZER = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "qwen35_chat_tokenizer"


def test_text_is_stable_for_a_seed():
    text = conversations_jsonl(600, seed=0)
    # The source hash recorded in lab/evidence/sft_real_format/sft_real_format_manifest.json.
    manifest = json.loads(
        (TOKENIZER.parents[2] / "lab/evidence/sft_real_format/sft_real_format_manifest.json").read_text()
    )
    assert hashlib.sha256(text.encode()).hexdigest() == manifest["source_sha256"]
    assert conversations_jsonl(600, seed=1) != text


def test_evidence_rows_are_the_committed_evidence_rows(tmp_path):
    """build_evidence_rows rebuilds the rows the SFT real-format evidence trained on, byte for byte."""
    from bridge_recipes.data.synthetic_chat import build_evidence_rows

    committed = json.loads(
        (TOKENIZER.parents[2] / "lab/evidence/sft_real_format/sft_real_format_manifest.json").read_text()
    )
    m = build_evidence_rows(tmp_path / "rows", TOKENIZER)
    assert (tmp_path / "chat.jsonl").is_file() and m["source_sha256"] == committed["source_sha256"]
    assert (m["rows"], m["rows_sha256"], m["packing"]) == (committed["rows"], committed["rows_sha256"], "boundaries")
