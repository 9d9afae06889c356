"""The generated real-format conversations the GPU evidence trains on: stable text, and every one
goes through the row builder (reasoning, tool calls, tool results, list content) with nothing
skipped and the tool call supervised."""

from __future__ import annotations

import json
from pathlib import Path

from bridge_recipes.data.synthetic_chat import conversations_jsonl

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"


def test_shapes_of_the_two_kinds():
    tool, chat = (json.loads(line) for line in conversations_jsonl(2).splitlines()[::-1])
    roles = [m["role"] for m in tool["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"] and tool["tools"]
    call = tool["messages"][2]
    assert call["content"] is None and call["reasoning_content"] and call["tool_calls"]
    assert isinstance(chat["messages"][0]["content"], list)
    assert all(m.get("reasoning_content") for m in chat["messages"] if m["role"] == "assistant")


def test_every_conversation_builds_and_the_tool_call_is_supervised(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from bridge_recipes.data.sft_rows import build_sft_rows

    src = tmp_path / "chat.jsonl"
    src.write_text(conversations_jsonl(20, seed=0))
    manifest = build_sft_rows(src, TOKENIZER, tmp_path / "rows", row_tokens=1024, progress=False)
    assert manifest["conversations"]["skipped_total"] == 0
    assert manifest["conversations"]["used"] == 20
    table = pq.read_table(tmp_path / "rows" / "rows.parquet").to_pydict()
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    supervised = "".join(
        tok.decode([t for t, m in zip(ids, mask) if m]) for ids, mask in zip(table["input_ids"], table["loss_mask"])
    )
    unsupervised = "".join(
        tok.decode([t for t, m in zip(ids, mask) if not m])
        for ids, mask in zip(table["input_ids"], table["loss_mask"])
    )
    assert "get_weather" in supervised  # the assistant's tool call is trained on
    assert "temperature" in unsupervised and "temperature" not in supervised  # the tool result is not
    assert np.mean([m for mask in table["loss_mask"] for m in mask]) > 0.3
