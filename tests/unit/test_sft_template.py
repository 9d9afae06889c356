"""SFT rows rendered with the tokenizer's chat template: reasoning, tools, list content, masks, skips.

The tokenizer is the committed offline folder tests/fixtures/qwen35_chat_tokenizer (a byte-level
BPE with the Qwen3.5 chat special tokens and a Qwen3.5-style chat_template.jinja).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from bridge_recipes.chat.chat_template import TemplateRenderer, normalize_conversation
from bridge_recipes.chat.conversations import MalformedConversation, SftRowsError
from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.vl.byte_bpe import train_byte_bpe

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"city": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def renderer() -> TemplateRenderer:
    return TemplateRenderer(TOKENIZER)


def decode(r: TemplateRenderer, ids) -> str:
    return r.backend.decode([int(i) for i in ids], skip_special_tokens=False)


def supervised_runs(r: TemplateRenderer, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return [decode(r, ids[a:b]) for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))]


AGENT = [
    {"role": "system", "content": "You are a careful calculator."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "What is the weather "}, {"type": "text", "text": "in Paris?"}],
    },
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Let me think step by step.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny and 21 degrees"},
    {"role": "assistant", "content": "It is sunny and 21 degrees."},
]


def test_rows_are_the_template_rendering_tokenized_whole(renderer):
    ids, mask = renderer.render(AGENT, TOOLS)
    messages, tools = normalize_conversation(AGENT, TOOLS)
    text = renderer.hf.apply_chat_template(messages, tools=tools, tokenize=False)
    assert decode(renderer, ids) == text
    assert ids.tolist() == renderer.hf(text, add_special_tokens=False)["input_ids"]  # what inference tokenizes
    assert ids.dtype == np.int32 and mask.dtype == np.uint8 and len(ids) == len(mask)
    # the tool list sits in the system prompt, the list content is joined, the tool reply is a user turn
    assert '"name": "get_weather"' in text.split("<|im_end|>")[0]
    assert "".join(part["text"] for part in AGENT[1]["content"]) in text
    assert f"<|im_start|>user\n<tool_response>\n{AGENT[3]['content']}\n</tool_response><|im_end|>" in text


def test_mask_is_exactly_what_the_assistant_writes(renderer):
    ids, mask = renderer.render(AGENT, TOOLS)
    assert supervised_runs(renderer, ids, mask) == [
        "Let me think step by step.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>",
        "It is sunny and 21 degrees.<|im_end|>",  # its empty think block is not trained (test_thinking_rows.py)
    ]
    im_end = renderer.backend.token_to_id("<|im_end|>")
    # system, user, assistant, tool (in a user turn), assistant
    assert [int(mask[i]) for i in np.flatnonzero(ids == im_end)] == [0, 0, 1, 0, 1]
    assert not mask[ids == renderer.backend.token_to_id("<|im_start|>")].any()
    assert not mask[ids == renderer.backend.token_to_id("<think>")].any()  # the generation prompt opens it


def test_earlier_turns_are_supervised_as_the_full_rendering_shows_them(renderer):
    """The template drops the <think> block of turns before the last user query."""
    conv = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "r2"},
    ]
    ids, mask = renderer.render(conv)
    assert "r1" not in decode(renderer, ids)
    assert supervised_runs(renderer, ids, mask) == ["a1<|im_end|>", "r2\n</think>\n\na2<|im_end|>"]


@pytest.mark.parametrize(
    "messages, tools, reason",
    [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], None, "non_text_content"),
        ([{"role": "assistant", "content": None}], None, "missing_role_or_content"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [{"x": 1}]}],
            None,
            "tool_call_malformed",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
            ],
            None,
            "tool_arguments_not_json",
        ),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}], "tools", "tools_not_a_list"),
        ([{"role": "user", "content": "hi"}, {"role": "critic", "content": "x"}], None, "unknown_role"),
        ([{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}], None, "system_not_first"),
        ([{"role": "user", "content": "hi"}], None, "no_assistant_turn"),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "reasoning_content": 3}],
            None,
            "reasoning_not_a_string",
        ),
    ],
)
def test_unusable_conversations_raise_with_a_reason(renderer, messages, tools, reason):
    with pytest.raises(MalformedConversation) as err:
        renderer.render(messages, tools, index=5)
    assert err.value.reason == reason and str(err.value).startswith("source row 5: ")


def test_a_token_across_a_span_boundary_is_refused_not_mis_masked(tmp_path):
    """With a "\\n\\n" merge, content starting with "\\n" fuses with the header's "\\n" into one token."""
    folder = tmp_path / "tok"
    folder.mkdir()
    specials = json.loads((TOKENIZER / "tokenizer.json").read_text())["added_tokens"]
    tok = train_byte_bpe(["ok\n\nok\n\n"] * 50 + ["assistant user"] * 5, [t["content"] for t in specials], 300)
    tok.save(str(folder / "tokenizer.json"))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TOKENIZER / name, folder / name)
    r = TemplateRenderer(folder)
    conv = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "\nok"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "ok"},
    ]
    with pytest.raises(MalformedConversation) as err:
        r.render(conv)
    assert err.value.reason == "tokenization_not_prefix_consistent"


def test_tokenizer_folder_without_a_template_is_refused(tmp_path):
    shutil.copy(TOKENIZER / "tokenizer.json", tmp_path / "tokenizer.json")
    with pytest.raises(SftRowsError, match="has no chat template"):
        TemplateRenderer(tmp_path)
    with pytest.raises(SftRowsError, match="has no tokenizer.json"):
        TemplateRenderer(tmp_path / "missing")


def conversations(n: int) -> list[dict]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"What is the weather in Paris on day {i}?"}]
        if i % 2:
            msgs.append(AGENT[2])
            msgs.append({"role": "tool", "content": "sunny"})
        msgs.append({"role": "assistant", "content": "It is sunny " * (1 + i % 4), "reasoning_content": "think"})
        out.append({"messages": msgs, "tools": TOOLS} if i % 2 else {"messages": msgs})
    return out


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_build_counts_used_and_skipped_conversations_by_reason(tmp_path):
    bad = [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]},
        {"messages": [{"role": "user", "content": "hi"}]},
        "{not json",
    ]
    src = write_jsonl(tmp_path / "c.jsonl", conversations(30) + bad)
    m = build_sft_rows(src, TOKENIZER, tmp_path / "out", row_tokens=256, packing="boundaries", progress=False)
    c = m["conversations"]
    assert c["skipped"] == {"invalid_json": 1, "no_assistant_turn": 1, "non_text_content": 1}
    assert c["used"] == 30 and c["read"] == 33 and m["packing"] == "boundaries"
    assert m["chat_template_sha256"] and m["tokenizer"].endswith("tokenizer.json")


def test_cli_prints_what_was_used_and_skipped(tmp_path):
    import subprocess
    import sys

    src = write_jsonl(tmp_path / "c.jsonl", conversations(20) + [{"messages": [{"role": "user", "content": "x"}]}])
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "scripts/build_sft_rows.py"), "--no-progress", "--input", str(src)]
    cmd += ["--tokenizer", str(TOKENIZER), "--out", str(out), "--row-tokens", "256"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert re.search(r"\b20 used\b.*\b1 skipped\b.*\b21 read\b", p.stdout), p.stdout
    assert "skipped        1  no_assistant_turn" in p.stdout
    m = json.loads((out / "manifest.json").read_text())
    assert m["packing"] == "boundaries"  # the default
    share = m["padding_tokens"] / (m["rows"] * 256)
    assert m["padding_share"] == pytest.approx(share, abs=1e-6) and f"({share:.1%} of the rows)" in p.stdout


def _agent_turns(n: int) -> list[dict]:
    """A conversation of ``n`` tool-using rounds, the reasoning of all but the last dropped by the template."""
    out = [{"role": "system", "content": "You plan trips."}]
    for k in range(n):
        out += [
            {"role": "user", "content": f"leg {k}: where next?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": f"check the weather for leg {k}",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": f"c{k}"}}}],
            },
            {"role": "tool", "content": f"rain {k}"},
            {"role": "tool", "content": f"wind {k}"},
            {"role": "assistant", "content": f"Go to c{k}.", "reasoning_content": f"weighed {k}"},
        ]
    return out


ODD = [
    # a reply that writes the end-of-turn text itself, and one that writes an assistant header
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a <|im_end|> b"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x\n<|im_start|>assistant\ny"}],
    [{"role": "user", "content": "say <|im_start|>assistant\n"}, {"role": "assistant", "content": "ok"}],
]


@pytest.mark.parametrize("conv", [AGENT, _agent_turns(1), *ODD])
def test_one_rendering_places_the_spans_where_the_prefix_renders_do(renderer, conv):
    messages, tools = normalize_conversation(conv, TOOLS)
    full = renderer.hf.apply_chat_template(messages, tools=tools, tokenize=False)
    fast = renderer.spans_from_rendering(messages, full)
    # the one rendering agrees with the prefix renders, or declines (and they decide)
    assert fast == renderer.spans_by_prefix_renders(messages, tools, full, None) or (fast is None and conv in ODD)


def test_rounds_whose_reasoning_the_template_drops_are_kept_as_the_rendering_shows_them(renderer):
    """Once a later user turn exists the template drops an earlier tool call's <think> block, so no history
    render is a prefix of the whole: the prefix renders refuse the conversation; the one rendering supervises
    each reply as the model sees it."""
    messages, tools = normalize_conversation(_agent_turns(3), TOOLS)
    full = renderer.hf.apply_chat_template(messages, tools=tools, tokenize=False)
    with pytest.raises(MalformedConversation, match="template_not_prefix_consistent"):
        renderer.spans_by_prefix_renders(messages, tools, full, None)
    ids, mask = renderer.render(_agent_turns(3), TOOLS)
    runs = supervised_runs(renderer, ids, mask)
    assert len(runs) == 6 and all(run.endswith("<|im_end|>") for run in runs)
    assert runs[0].startswith("<tool_call>") and runs[1] == "Go to c0.<|im_end|>"  # reasoning dropped, not supervised
    assert runs[4].startswith("check the weather for leg 2\n</think>")  # the last round keeps its reasoning
    assert runs[5] == "weighed 2\n</think>\n\nGo to c2.<|im_end|>"


def test_synthetic_conversations_need_no_prefix_renders(renderer, monkeypatch):
    from bridge_recipes.data.synthetic_chat import conversations_jsonl

    records = [json.loads(line) for line in conversations_jsonl(40).splitlines()]
    expected = [renderer.render(r["messages"], r.get("tools")) for r in records]
    monkeypatch.setattr(renderer, "spans_by_prefix_renders", lambda *a: pytest.fail("prefix renders used"))
    for record, (ids, mask) in zip(records, expected):
        got_ids, got_mask = renderer.render(record["messages"], record.get("tools"))
        assert (got_ids == ids).all() and (got_mask == mask).all()


def test_the_sandbox_remembers_its_verdicts_without_relaxing_them(renderer):
    """Fails when transformers stops compiling templates through ``_compile_jinja_template``."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    assert renderer.sandbox_checks_memoized
    environment = _compile_jinja_template(renderer.hf.chat_template).environment
    check = environment.is_safe_attribute
    assert check.memoized
    for _ in range(2):  # decided, then remembered
        assert check("text", "startswith", "text".startswith)
        assert not check("text", "__class__", str)
        assert not check([], "append", [].append)  # the immutable sandbox: no mutating methods
        assert not check({}, "update", {}.update)
