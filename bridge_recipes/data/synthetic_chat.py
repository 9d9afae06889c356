"""Generated OpenAI-style chat conversations in the shapes real Qwen3.5/3.6 SFT data takes.

Every other conversation is a tool call: a system prompt, a user question, an assistant turn with
``reasoning_content``, ``content: None`` and a ``tool_calls`` entry, the ``tool`` result and the
assistant's answer, with a per-conversation ``tools`` list. The others are two-turn reasoning
chats whose first user turn has list-style content. Words come from a 16-word list, so every
token is in the committed fixture tokenizer's vocabulary. Used by the GPU evidence (SFT on
real-format rows, the packed training-step check) and by the row builder's tests, so they all
read the same data.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np

WORDS = "the a river city light model token layer weight data train north south quick slow".split()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(rng: random.Random, i: int) -> dict[str, Any]:
    """Conversation ``i``: a tool call and its result when ``i`` is odd, a reasoning chat when even."""
    city = _text(rng, 2)
    if i % 2:
        return {
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"What is the weather in {city}? {_text(rng, 20)}"},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": _text(rng, 30),
                    "tool_calls": [
                        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
                    ],
                },
                {"role": "tool", "content": json.dumps({"city": city, "temperature": rng.randint(-5, 35)})},
                {"role": "assistant", "content": _text(rng, 40)},
            ],
        }
    return {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": _text(rng, 30)}]},
            {"role": "assistant", "reasoning_content": _text(rng, 40), "content": _text(rng, 60)},
            {"role": "user", "content": _text(rng, 15)},
            {"role": "assistant", "reasoning_content": _text(rng, 20), "content": _text(rng, 30)},
        ]
    }


def conversations_jsonl(n: int, seed: int = 0) -> str:
    """``n`` conversations as JSON lines, the same text for the same ``n`` and ``seed``."""
    rng = random.Random(seed)
    return "".join(json.dumps(conversation(rng, i)) + "\n" for i in range(n))


# The real-format SFT evidence's rows: 10 steps x 4 rows of 2,048 tokens, each conversation
# ~150-400 tokens, so 600 conversations fill the 40 training rows with some to spare, and 10% of
# them make the validation rows.
EVIDENCE_CONVERSATIONS = 600
EVIDENCE_ROW_TOKENS = 2048
EVIDENCE_VAL_FRACTION = 0.1


def build_evidence_rows(out: str | Path, tokenizer: str | Path, packing: str = "boundaries") -> dict[str, Any]:
    """Write the evidence's conversations to ``out``'s parent as ``chat.jsonl`` and build them into
    rows in ``out`` (replacing it) with ``packing``; returns the manifest. One definition for the
    GPU tests that train on these rows, so their first steps read the same rows."""
    return _build_rows(out, tokenizer, packing, conversations_jsonl(EVIDENCE_CONVERSATIONS, seed=0))


def _build_rows(out: str | Path, tokenizer: str | Path, packing: str, text: str) -> dict[str, Any]:
    """``text`` (JSON lines) written to ``out``'s parent as ``chat.jsonl`` and built into rows in ``out``
    as the evidence builds them (``EVIDENCE_ROW_TOKENS``, ``EVIDENCE_VAL_FRACTION``, the default seed, and the
    empty think block of a reply without reasoning trained: the rows the evidence's GPU runs trained on)."""
    from bridge_recipes.data.sft_rows import build_sft_rows

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / "chat.jsonl"
    src.write_text(text)
    return build_sft_rows(
        src,
        tokenizer,
        out,
        row_tokens=EVIDENCE_ROW_TOKENS,
        val_fraction=EVIDENCE_VAL_FRACTION,
        packing=packing,
        overwrite=True,
        progress=False,
        train_empty_think=True,
    )


# The conversations of the packed-against-one-per-row comparison: the evidence's kinds, each
# rendered to exactly ALIGNED_TOKENS tokens, so a boundaries row holds three (3 x 640 = 1,920 of
# 2,048 tokens) and never four. Equal lengths, not a band: the boundaries packer closes the
# fullest open row first, so rows close in the order they opened only when they are equally full;
# then packed row i holds one_per_row rows 3i, 3i+1 and 3i+2. 180 conversations: 18 validation
# (six packed rows), 162 training (54 packed rows: 13 steps of 4 packed or 12 one-per-row rows).
ALIGNED_CONVERSATIONS = 180
ALIGNED_TOKENS = 640
ALIGNED_PER_ROW = 3


def aligned_conversations_jsonl(tokenizer: str | Path, n: int = ALIGNED_CONVERSATIONS, seed: int = 0) -> str:
    """``n`` conversations of :func:`conversation`'s kinds, each rendered by ``tokenizer``'s chat
    template (the row builder's render) to exactly ``ALIGNED_TOKENS`` tokens: the last answer's
    words are cut or extended until it does. Lengths are measured, never estimated: a word's tokens
    at the end of an answer are rendered once, and every conversation is rendered again to check."""
    from bridge_recipes.chat.chat_template import TemplateRenderer

    renderer = TemplateRenderer(tokenizer)

    def measure(conv: dict) -> int:
        plain = json.loads(json.dumps(conv))  # what the builder reads back from the JSON line
        return len(renderer.render(plain["messages"], plain.get("tools"))[0])

    rng = random.Random(seed)
    probe = conversation(random.Random(seed), 0)
    bare = measure(probe)
    cost = {}
    for word in WORDS:
        probe["messages"][-1]["content"] += f" {word}"
        cost[word] = measure(probe) - bare
        probe["messages"][-1]["content"] = probe["messages"][-1]["content"].rsplit(" ", 1)[0]
    fillers = [w for w in WORDS if cost[w] == 1]
    lines = []
    for i in range(n):
        conv = conversation(rng, i)
        answer = conv["messages"][-1]
        words = answer["content"].split()
        length = measure(conv)
        while length > ALIGNED_TOKENS and len(words) > 1:
            length -= cost[words.pop()]
        while length < ALIGNED_TOKENS:
            word = rng.choice(WORDS)
            word = word if cost[word] <= ALIGNED_TOKENS - length else rng.choice(fillers)
            words.append(word)
            length += cost[word]
        answer["content"] = " ".join(words)
        if (got := measure(conv)) != ALIGNED_TOKENS:
            raise ValueError(
                f"conversation {i} renders to {got} tokens, not {ALIGNED_TOKENS}: the tokenizer "
                f"{tokenizer} joins words across spaces; use the fixture tokenizer"
            )
        lines.append(json.dumps(conv) + "\n")
    return "".join(lines)


def build_aligned_rows(out: str | Path, tokenizer: str | Path, packing: str) -> dict[str, Any]:
    """:func:`aligned_conversations_jsonl` built into rows in ``out`` with ``packing``, as the evidence
    builds its rows (``chat.jsonl`` in ``out``'s parent); returns the manifest."""
    return _build_rows(out, tokenizer, packing, aligned_conversations_jsonl(tokenizer))


def aligned_row_problems(packed: str | Path, single: str | Path, per_row: int = ALIGNED_PER_ROW) -> list[str]:
    """Where ``boundaries`` rows (``packed``) are not ``one_per_row`` rows (``single``) taken ``per_row``
    at a time: packed row i must hold exactly one_per_row rows ``per_row * i`` ... ``per_row * i +
    per_row - 1``, in order (tokens and loss masks, padding stripped, its conversations cut at its
    ``cu_seqlens``), in the training rows and in the validation rows. Empty when they are."""
    from bridge_recipes.data.inspect_rows import row_conversations
    from bridge_recipes.data.integrity import VAL_DIR, check_rows

    problems = []
    for split in ("train", "validation"):
        sub = VAL_DIR if split == "validation" else ""
        a, b = check_rows(Path(packed) / sub), check_rows(Path(single) / sub)
        modes = (a.manifest["packing"], b.manifest["packing"])
        if modes != ("boundaries", "one_per_row"):
            return [f"{split}: packing {modes[0]} against {modes[1]}, not boundaries against one_per_row"]
        eos = a.manifest["eos_token_id"]
        if len(a.ids) * per_row != len(b.ids):
            problems.append(f"{split}: {len(a.ids)} packed rows against {len(b.ids)} one_per_row rows")
        singles = [row_conversations(ids, mask, None, "one_per_row", eos) for ids, mask in zip(b.ids, b.mask)]
        if a.cu is None:
            problems.append(f"{split}: the packed rows carry no cu_seqlens")
            continue
        for i, (ids, mask, cu) in enumerate(zip(a.ids, a.mask, a.cu)):
            held = row_conversations(ids, mask, cu, "boundaries", eos)
            if len(held) != per_row:
                problems.append(f"{split} row {i}: {len(held)} conversations, not {per_row}")
            for j, (c_ids, c_mask) in enumerate(held):
                k = per_row * i + j
                alone = singles[k] if k < len(singles) else []
                if len(alone) != 1 or not (np.array_equal(c_ids, alone[0][0]) and np.array_equal(c_mask, alone[0][1])):
                    problems.append(f"{split} row {i}: conversation {j} is not one_per_row row {k}")
    return problems


def lognormal_conversation(rng: random.Random, words: int) -> dict[str, Any]:
    """A two-turn chat of about ``words`` words, a fifth of them the user's."""
    user = max(1, words // 5)
    return {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": _text(rng, user)},
            {"role": "assistant", "content": _text(rng, max(1, words - user))},
        ]
    }


# Conversation lengths of held-out chat data: lognormal, a mean of about 1,700 tokens with the
# fixture tokenizer (about four tokens a word), the longest under an 8,192-token row.
LOGNORMAL_MEAN_WORDS = 430
LOGNORMAL_SIGMA = 0.8
LOGNORMAL_MAX_WORDS = 1900


def lognormal_conversations_jsonl(n: int, seed: int = 0) -> str:
    """``n`` chats with lognormal lengths (``LOGNORMAL_*``), the same text for the same ``n`` and ``seed``."""
    rng = random.Random(seed)
    mu = math.log(LOGNORMAL_MEAN_WORDS) - LOGNORMAL_SIGMA**2 / 2
    lines = []
    for _ in range(n):
        words = LOGNORMAL_MAX_WORDS + 1
        while words > LOGNORMAL_MAX_WORDS:
            words = max(8, round(rng.lognormvariate(mu, LOGNORMAL_SIGMA)))
        lines.append(json.dumps(lognormal_conversation(rng, words)) + "\n")
    return "".join(lines)


# The packing benchmark's conversations: enough that the one-per-row rows outnumber what a short
# benchmark reads, and that the packed rows still hold a few dozen steps of one-row micro batches.
LOGNORMAL_CONVERSATIONS = 600


def build_lognormal_rows(out: str | Path, tokenizer: str | Path, packing: str, row_tokens: int = 8192) -> dict:
    """``LOGNORMAL_CONVERSATIONS`` chats of lognormal lengths (``chat.jsonl`` in ``out``'s parent)
    built into rows in ``out`` with ``packing``; returns the manifest."""
    from bridge_recipes.data.sft_rows import build_sft_rows

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / "chat.jsonl"
    src.write_text(lognormal_conversations_jsonl(LOGNORMAL_CONVERSATIONS, seed=0))
    return build_sft_rows(src, tokenizer, out, row_tokens=row_tokens, packing=packing, overwrite=True, progress=False)


# Long multi-turn chats: lognormal total lengths with a mean of about 4,300 tokens and no upper
# bound, so about one in ten is longer than an 8,192-token row; each is a system prompt and
# exchanges of about LONG_TURN_WORDS words.
LONG_MEAN_WORDS = 1075
LONG_TURN_WORDS = 300


def long_conversation(rng: random.Random, words: int) -> dict[str, Any]:
    """A multi-turn chat of about ``words`` words in exchanges of about ``LONG_TURN_WORDS``, a fifth
    of each exchange the user's."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    left = words
    while left > 0:
        turn = min(left, max(8, round(rng.uniform(0.5, 1.5) * LONG_TURN_WORDS)))
        user = max(1, turn // 5)
        messages.append({"role": "user", "content": _text(rng, user)})
        messages.append({"role": "assistant", "content": _text(rng, max(1, turn - user))})
        left -= turn
    return {"messages": messages}


def long_conversations_jsonl(n: int, seed: int = 0) -> str:
    """``n`` long multi-turn chats (``LONG_*``), the same text for the same ``n`` and ``seed``."""
    rng = random.Random(seed)
    mu = math.log(LONG_MEAN_WORDS) - LOGNORMAL_SIGMA**2 / 2
    return "".join(
        json.dumps(long_conversation(rng, max(8, round(rng.lognormvariate(mu, LOGNORMAL_SIGMA))))) + "\n"
        for _ in range(n)
    )


def build_long_split_rows(out: str | Path, tokenizer: str | Path, row_tokens: int = 8192) -> dict:
    """``LOGNORMAL_CONVERSATIONS`` long multi-turn chats (``long_chat.jsonl`` in ``out``'s parent) built
    into boundaries rows in ``out``, the chats longer than a row kept as pieces (``--long split``);
    returns the manifest."""
    from bridge_recipes.data.sft_rows import build_sft_rows

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / "long_chat.jsonl"
    src.write_text(long_conversations_jsonl(LOGNORMAL_CONVERSATIONS, seed=0))
    return build_sft_rows(
        src, tokenizer, out, row_tokens=row_tokens, packing="boundaries", long="split", overwrite=True, progress=False
    )
