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


def test_long_chats_are_multi_turn_and_some_outgrow_a_row(tmp_path):
    """The long-conversation rows: several exchanges per chat, about one chat in ten longer than an
    8,192-token row, and those kept as pieces (none skipped) when the rows are built."""
    from bridge_recipes.data.synthetic_chat import build_long_split_rows, long_conversations_jsonl

    chats = [json.loads(line) for line in long_conversations_jsonl(200, seed=0).splitlines()]
    assert long_conversations_jsonl(200, seed=0) == "\n".join(map(json.dumps, chats)) + "\n"
    words = [sum(len(m["content"].split()) for m in c["messages"][1:]) for c in chats]
    roles = [m["role"] for m in chats[0]["messages"]]
    assert roles[0] == "system" and roles[1:] == ["user", "assistant"] * ((len(roles) - 1) // 2)
    assert max(len(c["messages"]) for c in chats) >= 9
    over = sum(w * 4 > 8192 for w in words)  # about four tokens a word with the fixture tokenizer
    assert 0.03 * len(chats) <= over <= 0.25 * len(chats)
    manifest = build_long_split_rows(tmp_path / "rows", TOKENIZER, row_tokens=2048)
    long = manifest["long_conversations"]
    assert long["mode"] == "split" and long["longer_than_row"] > 0 and long["pieces"] > long["longer_than_row"]
    assert long["tokens"]["dropped"] == {} and manifest["conversations"]["skipped_total"] == 0
