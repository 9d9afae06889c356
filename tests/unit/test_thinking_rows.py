"""Thinking mode as the data needs it: a thinking chat template (Qwen3.5/3.6) is recognized, the empty think
block before a reply without reasoning stays out of the loss unless --train-empty-think, reasoning and
non-reasoning conversations are counted, a mostly non-reasoning build is warned, and inspect_rows marks it.

The tokenizer is the committed offline folder tests/fixtures/qwen35_chat_tokenizer (a Qwen3.5-style chat
template: a <think> block before each reply after the last user query, ``<think>\\n`` as generation prompt).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bridge_recipes.chat.chat_template import TemplateRenderer, empty_think_block
from bridge_recipes.chat.conversations import SftRowsError
from bridge_recipes.chat.message_text import ends_with_reasoning
from bridge_recipes.data.conversation_rendering import MIN_REASONING_SHARE
from bridge_recipes.data.inspect_rows import CLOSE, OPEN, UNTRAINED_CLOSE, UNTRAINED_OPEN, inspect_rows
from bridge_recipes.data.integrity import check_rows
from bridge_recipes.data.sft_rows import build_sft_rows

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"
EMPTY = "<think>\n\n</think>\n\n"  # what the Qwen3.5/3.6 templates write before a reply without reasoning
PLAIN = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello there."}]
REASONED = [
    {"role": "user", "content": "Hi?"},
    {"role": "assistant", "content": "Hello there.", "reasoning_content": "They greet me."},
]


@pytest.fixture(scope="module")
def renderer() -> TemplateRenderer:
    return TemplateRenderer(TOKENIZER)


@pytest.fixture(scope="module")
def trains_it() -> TemplateRenderer:
    return TemplateRenderer(TOKENIZER, train_empty_think=True)


def runs(r: TemplateRenderer, ids: np.ndarray, mask: np.ndarray) -> list[tuple[int, str]]:
    """(mask value, decoded text) of each run of equal mask values."""
    edges = [0, *(np.flatnonzero(np.diff(mask.astype(int))) + 1).tolist(), len(mask)]
    return [
        (int(mask[a]), r.backend.decode(ids[a:b].tolist(), skip_special_tokens=False))
        for a, b in zip(edges, edges[1:])
    ]


def supervised(r: TemplateRenderer, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    return [text for m, text in runs(r, ids, mask) if m]


def test_the_thinking_template_is_recognized_from_its_text_and_a_rendering(renderer):
    assert renderer.empty_think == EMPTY
    chatml = "<|im_start|>user\nQuestion?<|im_end|>\n<|im_start|>assistant\nAnswer.<|im_end|>\n"
    with_block = chatml.replace("assistant\n", "assistant\n" + EMPTY)
    # a template whose text writes no think tags is none, whatever it renders
    assert empty_think_block("{{ messages }}", lambda probe: with_block) is None
    # one that names the tags but writes no block before a reply (only in its generation prompt) is none
    assert empty_think_block("... '<think>\\n\\n</think>\\n\\n' ...", lambda probe: chatml) is None
    # a block with text in it is reasoning, not an empty block
    assert (
        empty_think_block(
            "<think></think>", lambda probe: chatml.replace("assistant\n", "assistant\n<think>\nx\n</think>\n\n")
        )
        is None
    )
    assert empty_think_block("<think></think>", lambda probe: with_block) == EMPTY


def test_a_template_without_think_blocks_masks_as_before(tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(TOKENIZER, folder)
    template = (folder / "chat_template.jinja").read_text()
    plain = template.replace("{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}", "")
    assert plain != template
    (folder / "chat_template.jinja").write_text(plain)
    r = TemplateRenderer(folder)
    assert r.empty_think is None
    done = r.rendered(PLAIN)
    assert supervised(r, done.ids, done.mask) == ["Hello there.<|im_end|>"] and done.empty_thinks == 0


def test_a_reply_without_reasoning_trains_its_answer_not_the_empty_block(renderer):
    done = renderer.rendered(PLAIN)
    assert (done.reasoning, done.empty_thinks) == (False, 1)
    assert runs(renderer, done.ids, done.mask) == [
        (0, "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n" + EMPTY),  # the whole block has mask 0
        (1, "Hello there.<|im_end|>"),
        (0, "\n"),
    ]
    think_ids = [renderer.backend.token_to_id(t) for t in ("<think>", "</think>")]
    assert not done.mask[np.isin(done.ids, think_ids)].any()


def test_train_empty_think_supervises_the_block_after_the_generation_prompt(renderer, trains_it):
    done = trains_it.rendered(PLAIN)
    assert supervised(trains_it, done.ids, done.mask) == ["\n</think>\n\nHello there.<|im_end|>"]
    assert done.empty_thinks == 1
    assert (done.ids == renderer.rendered(PLAIN).ids).all()  # the same tokens, another mask


def test_a_reasoning_reply_is_trained_as_before_with_either_setting(renderer, trains_it):
    expected = ["They greet me.\n</think>\n\nHello there.<|im_end|>"]
    for r in (renderer, trains_it):
        done = r.rendered(REASONED)
        assert (done.reasoning, done.empty_thinks) == (True, 0)
        assert supervised(r, done.ids, done.mask) == expected
    # what makes a reasoning conversation: its last reply's reasoning, given either way, with text in it
    assert ends_with_reasoning(
        [PLAIN[0], {"role": "assistant", "content": "<think>\nThey greet me.\n</think>\n\nHi."}]
    )
    assert not ends_with_reasoning([PLAIN[0], {"role": "assistant", "content": "<think>\n\n</think>\n\nHi."}])
    assert not ends_with_reasoning([PLAIN[0], {**PLAIN[1], "reasoning_content": " \n"}])
    assert not ends_with_reasoning([*REASONED, *PLAIN])  # an earlier reply's reasoning does not count


def test_only_replies_the_template_gives_a_block_lose_it(renderer):
    """Replies before the last user query get no think block from the template; after it, each reply without
    reasoning gets an empty one, masked, while a reply with reasoning keeps its block trained."""
    conv = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {
            "role": "assistant",
            "content": "calling",
            "reasoning_content": "need the tool",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
        },
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "It is 42."},
    ]
    done = renderer.rendered(conv)
    got = supervised(renderer, done.ids, done.mask)
    assert (
        got[0] == "a1<|im_end|>" and got[1].startswith("need the tool\n</think>") and got[2] == "It is 42.<|im_end|>"
    )
    assert (done.reasoning, done.empty_thinks) == (False, 1)  # the last reply has none: a non-reasoning one


def _source(path: Path, total: int, reasoning: int) -> Path:
    records = []
    for i in range(total):
        reply = {"role": "assistant", "content": f"answer {i}."}
        if i < reasoning:
            reply["reasoning_content"] = f"thinking about {i}"
        records.append({"messages": [{"role": "user", "content": f"question {i}?"}, reply]})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _build(tmp_path: Path, name: str, total: int = 20, reasoning: int = 4, **options) -> dict:
    src = _source(tmp_path / f"{name}.jsonl", total, reasoning)
    return build_sft_rows(src, TOKENIZER, tmp_path / name, row_tokens=256, progress=False, **options)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_manifest_counts_and_records_the_choice(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        m = _build(tmp_path, "default", val_fraction=0.25)
    c = m["conversations"]
    v = json.loads((tmp_path / "default" / "val" / "manifest.json").read_text())["conversations"]
    assert (c["used"], v["used"]) == (15, 5) and c["with_reasoning"] + v["with_reasoning"] == 4
    for split in (c, v):  # each reply without reasoning opens with an empty think block
        assert (
            split["without_reasoning"] == split["replies_with_empty_think"] == split["used"] - split["with_reasoning"]
        )
    assert m["thinking"] == {"template": True, "empty_think_block": EMPTY, "empty_think_trained": False}
    assert "not the empty think block" in m["loss_on"]
    trained = _build(tmp_path, "trained", val_fraction=0.25, train_empty_think=True)
    assert trained["thinking"]["empty_think_trained"] is True
    # the choice is in the rows themselves: their hash, and the supervised tokens of the empty blocks
    assert trained["rows_sha256"] != m["rows_sha256"]
    assert trained["supervised_tokens"] > m["supervised_tokens"]
    loaded = check_rows(tmp_path / "default")
    assert int(loaded.mask.sum()) == m["supervised_tokens"]


def test_a_build_in_worker_processes_masks_alike(tmp_path):
    one = _build(tmp_path, "one", total=40, reasoning=10)
    two = _build(tmp_path, "two", total=40, reasoning=10, workers=2)
    assert one["rows_sha256"] == two["rows_sha256"]
    assert one["conversations"]["with_reasoning"] == two["conversations"]["with_reasoning"] == 10


def test_a_mostly_non_reasoning_build_is_warned_with_the_share(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        _build(tmp_path, "few", total=20, reasoning=4)
    warned = [w for w in _warnings(caplog) if "thinking template" in w]
    assert len(warned) == 1 and "20.0%" in warned[0] and f"{MIN_REASONING_SHARE:.0%}" in warned[0]
    assert "--train-empty-think" in warned[0] and "enable_thinking=false" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _build(tmp_path, "many", total=20, reasoning=16)  # 80% carry reasoning
    assert not [w for w in _warnings(caplog) if "thinking template" in w]


def test_chatml_rows_write_no_think_block_and_refuse_the_option(tmp_path, caplog):
    src = _source(tmp_path / "c.jsonl", 10, 0)
    with pytest.raises(SftRowsError, match="--train-empty-think"):
        build_sft_rows(src, TOKENIZER / "tokenizer.json", tmp_path / "x", chat_format="chatml", train_empty_think=True)
    with caplog.at_level(logging.WARNING):
        m = build_sft_rows(
            src, TOKENIZER / "tokenizer.json", tmp_path / "c", chat_format="chatml", row_tokens=256, progress=False
        )
    assert m["thinking"]["template"] is False and m["conversations"]["without_reasoning"] == 10
    assert not [w for w in _warnings(caplog) if "thinking template" in w]


def _script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_the_build_summary_counts_and_warns_and_the_option_exits_2_on_chatml(tmp_path):
    src = _source(tmp_path / "c.jsonl", 20, 4)
    build = ["scripts/build_sft_rows.py", "--input", str(src), "--row-tokens", "256", "--no-progress"]
    p = _script(*build, "--tokenizer", str(TOKENIZER), "--out", str(tmp_path / "rows"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    counts = next(line for line in lines if line.startswith("thinking template:"))
    assert "4 of 20 conversations (20.0%)" in counts and "16 without" in counts
    assert any(line.strip().startswith("warning:") and "20.0%" in line for line in lines)
    bad = _script(
        *build,
        "--tokenizer",
        str(TOKENIZER / "tokenizer.json"),
        "--chat-format",
        "chatml",
        "--train-empty-think",
        "--out",
        str(tmp_path / "bad"),
    )
    assert bad.returncode == 2 and "--train-empty-think" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_inspect_marks_the_untrained_empty_block_and_the_trained_one(tmp_path):
    _build(tmp_path, "default", packing="one_per_row")
    _build(tmp_path, "trained", packing="one_per_row", train_empty_think=True)
    text = inspect_rows(tmp_path / "default", list(range(20)))
    marked = f"{UNTRAINED_OPEN}{EMPTY}{UNTRAINED_CLOSE}{OPEN}answer"
    assert marked in text and "4 of 20 conversations" in text
    assert text.count(marked) == text.count("1 empty think block(s) not trained") == 16  # one per reply without
    assert f"{OPEN}thinking about" in text  # reasoning rows keep their block trained, unmarked
    trained = inspect_rows(tmp_path / "trained", list(range(20)))
    assert UNTRAINED_OPEN + "<think>" not in trained and f"{OPEN}\n</think>\n\nanswer" in trained
    assert "--train-empty-think" in trained.split("\n=== row")[0]
    p = _script("scripts/inspect_rows.py", str(tmp_path / "default"), "--row", "0")
    assert p.returncode == 0 and "thinking template:" in p.stdout, p.stderr
    assert CLOSE in p.stdout


def test_the_runs_data_line_says_what_thinking_rows_train(tmp_path):
    from bridge_recipes.config.datasets import describe
    from bridge_recipes.data.packed_rows import PackedSFTRowsConfig

    _build(tmp_path, "default")
    cfg = SimpleNamespace(dataset=PackedSFTRowsConfig(path=str(tmp_path / "default"), seq_length=256))
    line = describe(cfg)
    assert "thinking template: 20% with reasoning" in line and "empty think blocks not trained" in line
