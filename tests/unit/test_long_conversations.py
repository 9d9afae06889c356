"""Conversations longer than a row: skipped, split at turn boundaries or truncated (--long), and what the
build reports of them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bridge_recipes.chat.chat_template import TemplateRenderer
from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data.inspect_rows import inspect_rows, row_conversations
from bridge_recipes.data.integrity import RowsIntegrityError, check_rows
from bridge_recipes.data.long_conversations import TurnCutter, row_tokens_keeping
from bridge_recipes.data.sft_rows import build_sft_rows

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
ROW = 512
SYSTEM = {"role": "system", "content": "You plan trips for travellers who like trains."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "timetable",
            "description": "train times",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def turn(k: int, words: int = 6) -> list[dict]:
    return [
        {"role": "user", "content": f"Question {k}: " + "which train " * words},
        {"role": "assistant", "content": f"Answer {k}: " + "take the early one " * words},
    ]


def tool_turn(k: int) -> list[dict]:
    call = {"type": "function", "function": {"name": "timetable", "arguments": {"city": f"city{k}"}}}
    return [
        {"role": "user", "content": f"When does train {k} leave?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "departures " * 10},
        {"role": "assistant", "content": f"Train {k} leaves at nine."},
    ]


def long_conversation(turns: int = 12) -> dict:
    return {"messages": [SYSTEM] + [m for k in range(turns) for m in turn(k)]}


def short_conversation(i: int) -> dict:
    return {"messages": [SYSTEM, *turn(i, words=2)]}


@pytest.fixture(scope="module")
def renderer() -> TemplateRenderer:
    return TemplateRenderer(TOKENIZER)


@pytest.fixture(scope="module")
def cutter(renderer) -> TurnCutter:
    b = renderer.backend
    return TurnCutter(lambda text: b.encode(text, add_special_tokens=False).ids, b.token_to_id)


def test_split_pieces_fit_begin_with_the_system_prompt_and_supervise_only_their_turns(renderer, cutter):
    ids, mask = renderer.render(long_conversation()["messages"])
    assert len(ids) > 3 * ROW
    dropped = Counter()
    pieces, head = cutter.split(ids, mask, ROW, dropped)
    assert len(pieces) >= 3 and not dropped
    starts = cutter.turn_starts(ids)
    assert head == starts[0] > 0
    rest_ids, rest_mask = [], []
    for k, (p_ids, p_mask) in enumerate(pieces):
        assert len(p_ids) <= ROW
        assert p_ids[:head].tolist() == ids[:head].tolist()  # the system prompt, every piece
        assert k == 0 or not p_mask[:head].any()  # supervised in the first piece only
        rest_ids += p_ids[head:].tolist()
        rest_mask += p_mask[head:].tolist()
    # the pieces' turns are the conversation's, in order, with the one rendering's loss mask
    assert rest_ids == ids[head:].tolist() and rest_mask == mask[head:].tolist()


def test_a_tool_result_stays_with_its_call(renderer, cutter):
    messages = [SYSTEM] + [m for k in range(8) for m in tool_turn(k)]
    ids, mask = renderer.render(messages, TOOLS)
    pieces, head = cutter.split(ids, mask, ROW, Counter())
    assert len(pieces) >= 2
    call = renderer.backend.token_to_id("<tool_call>")
    for p_ids, _ in pieces:
        body = p_ids[head:]
        text = renderer.backend.decode(body.tolist(), skip_special_tokens=False)
        assert text.startswith("<|im_start|>user\nWhen does train")  # a turn, never a tool result
        assert text.count("<tool_response>") == int((body == call).sum())


def test_a_turn_longer_than_the_row_is_dropped_and_counted(renderer, cutter):
    messages = [SYSTEM, *turn(0), *turn(1, words=200), *turn(2)]
    ids, mask = renderer.render(messages)
    dropped = Counter()
    pieces, head = cutter.split(ids, mask, ROW, dropped)
    starts = cutter.turn_starts(ids).tolist() + [len(ids)]
    assert dropped == {"turn_longer_than_row": starts[2] - starts[1]}
    assert sum(len(p) - head for p, _ in pieces) + head + dropped["turn_longer_than_row"] == len(ids)


def test_the_suggested_row_keeps_99_percent_of_the_tokens_whole():
    lengths = np.array([1000] * 99 + [50_000])  # the long one holds a third of the tokens
    assert row_tokens_keeping(lengths) == 50_176  # the next multiple of 1024
    assert row_tokens_keeping(np.array([1000] * 200 + [1500])) == 1024  # 1500 is under 1% of them
    assert row_tokens_keeping(lengths, limit=32_768) is None


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("long")
    return _jsonl(tmp / "in.jsonl", [short_conversation(i) for i in range(30)] + [long_conversation()] * 3)


@pytest.mark.parametrize("mode", ["skip", "split", "truncate"])
def test_each_mode_accounts_for_every_token_and_the_rows_check(source, tmp_path, mode):
    # the long conversations hold most of the tokens here: allowed, to see where each token goes
    kw = {"max_dropped_share": 1.0}
    m = build_sft_rows(source, TOKENIZER, tmp_path / "out", row_tokens=ROW, long=mode, progress=False, **kw)
    lc = m["long_conversations"]
    assert (lc["mode"], lc["longer_than_row"], lc["conversations_measured"]) == (mode, 3, 33)
    t = lc["tokens"]
    assert t["kept"] + sum(t["dropped"].values()) == t["of_conversations"]
    # every token kept is in the rows once, and the system prompt again in each later piece
    assert m["stream_tokens"] == t["kept"] + t["system_prompt_repeated"]
    assert m["conversations"]["used"] == (30 if mode == "skip" else 33)
    assert m["segments"] == 30 + lc["pieces"]
    assert check_rows(tmp_path / "out").manifest["segments"] == m["segments"]
    if mode == "skip":
        assert m["conversations"]["skipped"] == {"longer_than_row": 3} and lc["pieces"] == 0
        assert t["dropped"] == {"longer_than_row": 3 * lc["longest_conversation"]}
    if mode == "truncate":
        assert lc["pieces"] == 3 and set(t["dropped"]) == {"truncated"}
    assert lc["row_tokens_keeping_99_percent"] >= lc["longest_conversation"] - 1024


def test_split_rows_hold_the_pieces_whole(source, tmp_path, renderer, cutter):
    build_sft_rows(source, TOKENIZER, tmp_path / "out", row_tokens=ROW, long="split", progress=False)
    loaded = check_rows(tmp_path / "out")
    eos = loaded.manifest["eos_token_id"]
    ids, mask = renderer.render(long_conversation()["messages"])
    pieces, _ = cutter.split(ids, mask, ROW, Counter())
    segments = [
        tuple(s.tolist())
        for r in range(len(loaded.ids))
        for s, _ in row_conversations(loaded.ids[r], loaded.mask[r], loaded.cu[r], "boundaries", eos)
    ]
    for p_ids, _ in pieces:
        assert segments.count(tuple(p_ids.tolist())) == 3  # once for each of the three copies
    report = inspect_rows(tmp_path / "out", rows=[0])
    assert f"split into {3 * len(pieces)} pieces" in report


def test_a_wrong_piece_count_fails_the_rows_check(source, tmp_path):
    build_sft_rows(source, TOKENIZER, tmp_path / "out", row_tokens=ROW, long="split", progress=False)
    path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["segments"] += 1
    path.write_text(json.dumps(manifest))
    with pytest.raises(RowsIntegrityError, match="conversations and pieces"):
        check_rows(tmp_path / "out")


def test_rows_of_short_conversations_are_the_same_in_every_mode(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", [short_conversation(i) for i in range(30)])
    hashes = {
        build_sft_rows(src, TOKENIZER, tmp_path / mode, row_tokens=ROW, long=mode, progress=False)["rows_sha256"]
        for mode in ("skip", "split", "truncate")
    }
    assert len(hashes) == 1


def test_long_modes_other_than_skip_are_refused_for_eos_joined_rows(source, tmp_path):
    with pytest.raises(SftRowsError, match="--long split applies to boundaries and one_per_row"):
        build_sft_rows(source, TOKENIZER, tmp_path / "o", row_tokens=ROW, long="split", packing="eos_joined")
    with pytest.raises(SftRowsError, match="--long 'cut' is not one of skip, split, truncate"):
        build_sft_rows(source, TOKENIZER, tmp_path / "o", row_tokens=ROW, long="cut")


def test_the_build_command_reports_the_long_conversations(source, tmp_path):
    def build(mode: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(REPO / "scripts" / "build_sft_rows.py"), "--input", str(source)]
        cmd += ["--tokenizer", str(TOKENIZER), "--out", str(tmp_path / mode), "--row-tokens", str(ROW)]
        cmd += ["--max-dropped-share", "1"]  # most of the tokens are in the long ones here
        return subprocess.run([*cmd, "--long", mode, "--no-progress"], capture_output=True, text=True, cwd=REPO)

    skipped, split = build("skip"), build("split")
    assert skipped.returncode == split.returncode == 0, skipped.stderr + split.stderr
    assert re.search(r"\b3 of 33 longer\b.*\b512-token row\b", skipped.stdout), skipped.stdout
    assert "--long split" in skipped.stdout and "--long truncate" in skipped.stdout  # the two ways to keep them
    keep = json.loads((tmp_path / "skip" / "manifest.json").read_text())["long_conversations"]
    assert f"--row-tokens {keep['row_tokens_keeping_99_percent']} would hold" in skipped.stdout
    assert "split into" in split.stdout and "--long truncate" not in split.stdout
    bad = build("cut")
    assert bad.returncode == 2 and "invalid choice: 'cut'" in bad.stderr
