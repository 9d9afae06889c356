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
    from bridge_recipes.data.sft_rows import build_sft_rows

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / "chat.jsonl"
    src.write_text(conversations_jsonl(EVIDENCE_CONVERSATIONS, seed=0))
    return build_sft_rows(
        src,
        tokenizer,
        out,
        row_tokens=EVIDENCE_ROW_TOKENS,
        val_fraction=EVIDENCE_VAL_FRACTION,
        packing=packing,
        overwrite=True,
        progress=False,
    )


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
