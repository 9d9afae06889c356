"""One conversation of a rows build made into token ids and a loss mask: the renderer ``--chat-format``
picks (the tokenizer folder's chat template, or plain ChatML), the bounds on a record's size checked
before it is parsed, the turn cutter of ``--long split``, and the fingerprint that finds a conversation
in both splits. This is the work done per conversation, the part the worker processes
(``render_workers``) run; ``split_packing`` packs what it returns.

A thinking chat template (Qwen3.5/3.6's) writes an empty think block before a reply without reasoning;
its tokens stay out of the loss unless ``train_empty_think`` (``thinking`` in the manifest), and a build
whose conversations carry reasoning less than :data:`MIN_REASONING_SHARE` of the time warns.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bridge_recipes.chat.chat_render import chat_format, load_tokenizer, render_conversation
from bridge_recipes.chat.chat_render import eos_id as special_token_id
from bridge_recipes.chat.chat_template import Rendered, TemplateRenderer
from bridge_recipes.chat.errors import MalformedConversation, SftRowsError
from bridge_recipes.chat.message_text import ends_with_reasoning, turn_notes
from bridge_recipes.data.long_conversations import TurnCutter
from bridge_recipes.utils.outputs import file_sha256

log = logging.getLogger(__name__)

# A token of Qwen3.5's vocabulary is a few bytes of text (at most a few dozen, written as JSON
# escapes); a JSONL line (or a Parquet row's text) of more than this many bytes a token cannot fit
# its row, and is skipped before it is parsed or tokenized.
MAX_LINE_BYTES_PER_TOKEN = 64
# With --long split or truncate a conversation of any length is tokenized; one larger than this is a
# broken record rather than a conversation, and is skipped before it is parsed.
MAX_CONVERSATION_BYTES = 64 * 2**20
# A thinking model trained on fewer conversations with reasoning than this share loses its thinking mode: the
# build warns, naming the share (the advice for fine-tuning a thinking model: three in four with reasoning).
MIN_REASONING_SHARE = 0.75

Renderer = Callable[[Any, int], Rendered]


def _renderer(
    tokenizer: str | os.PathLike, fmt: str, eos_token: str, train_empty_think: bool = False
) -> tuple[Renderer, dict, int, Any]:
    """The conversation renderer, its manifest fields, the EOS (separator / padding) id and the
    tokenizer (``tokenizers.Tokenizer``) it encodes with."""
    if fmt == "chatml":
        tok, tokenizer_file = load_tokenizer(tokenizer)
        chat = chat_format(tok, eos_token)

        def render(conversation: Any, index: int) -> Rendered:
            messages, tools = conversation
            if tools:
                raise MalformedConversation(index, "tools_need_template", "a tools list needs --chat-format template")
            ids, mask = render_conversation(tok, messages, chat, index=index)
            return Rendered(ids, mask, ends_with_reasoning(messages), 0)

        fields = {
            "tokenizer": str(tokenizer_file),
            "tokenizer_sha256": file_sha256(tokenizer_file),
            "chat_format": "qwen-chatml: <|im_start|>{role}\\n{content}<|im_end|>\\n, tokenized per segment",
            "chat_template_sha256": None,
            "loss_on": "assistant content + its <|im_end|>",
            "thinking": thinking_fields(None, False),
        }
        return render, fields, chat.eos_id, tok
    renderer = TemplateRenderer(tokenizer, train_empty_think=train_empty_think)
    eos_id = special_token_id(renderer.backend, eos_token)
    if train_empty_think and renderer.empty_think is None:
        log.warning(
            "--train-empty-think: the chat template of %s writes no empty think block (it is no thinking "
            "template), so the option changes nothing",
            renderer.folder,
        )

    def render(conversation: Any, index: int) -> Rendered:
        messages, tools = conversation
        return renderer.rendered(messages, tools, index=index)

    loss_on = "assistant reasoning, text, tool calls and end-of-turn token"
    if renderer.empty_think is not None:
        loss_on += (
            ", and the empty think block of a reply without reasoning (--train-empty-think)"
            if train_empty_think
            else "; not the empty think block of a reply without reasoning"
        )
    fields = {
        "tokenizer": str(renderer.folder / "tokenizer.json"),
        "tokenizer_sha256": file_sha256(renderer.folder / "tokenizer.json"),
        "chat_format": "chat_template: the tokenizer folder's template through transformers' apply_chat_template",
        "chat_template_sha256": renderer.sha256,
        "loss_on": loss_on,
        "thinking": thinking_fields(renderer.empty_think, train_empty_think),
    }
    return render, fields, eos_id, renderer.backend


def thinking_fields(empty_think: str | None, train_empty_think: bool) -> dict:
    """The manifest's ``thinking``: whether the chat template is a thinking template (it writes a think block
    before each reply), the empty block it writes before a reply without reasoning, and whether that block
    is trained (``--train-empty-think``) or left out of the loss (the default)."""
    return {
        "template": empty_think is not None,
        "empty_think_block": empty_think,
        "empty_think_trained": bool(train_empty_think and empty_think is not None),
    }


def _cutter(tok: Any, long: str) -> TurnCutter | None:
    """The turn cutter ``--long split`` needs (None for the other modes)."""
    if long != "split":
        return None
    try:
        return TurnCutter(lambda text: tok.encode(text, add_special_tokens=False).ids, tok.token_to_id)
    except ValueError as e:
        raise SftRowsError(f"--long split: {e}; use --long truncate or skip") from None


def reasoning_share(conversations: dict) -> float | None:
    """The share of a split's used conversations whose last reply carries reasoning (None when none was used
    or the counts are not in the manifest)."""
    used = conversations.get("used") or 0
    with_reasoning = conversations.get("with_reasoning")
    return with_reasoning / used if used and with_reasoning is not None else None


def thinking_warning(thinking: dict | None, conversations: dict) -> str | None:
    """What a thinking template trained on mostly replies without reasoning does to the model, with the share
    and the ways out; None when the template is no thinking template or the share is at least
    :data:`MIN_REASONING_SHARE`."""
    share = reasoning_share(conversations)
    if not (thinking or {}).get("template") or share is None or share >= MIN_REASONING_SHARE:
        return None
    used = conversations["used"]
    effect = (
        "the empty think blocks of the others are trained (--train-empty-think), so the model learns to close its "
        "thinking at once: thinking mode is trained away"
        if thinking.get("empty_think_trained")
        else "the empty think blocks of the others are left out of the loss, but their replies are learned with no "
        "thinking before them, so thinking mode gets little training and may weaken"
    )
    without = "serve it with enable_thinking=false (the prompt then ends with the empty think block, as these rows do)"
    if not thinking.get("empty_think_trained"):
        without += " or build with --train-empty-think"
    return (
        f"only {share:.1%} of the {used:,} training conversations ({conversations['with_reasoning']:,}) end on a "
        f"reply with reasoning, and the chat template is a thinking template: {effect}. To keep thinking mode, give "
        f"at least {MIN_REASONING_SHARE:.0%} of the conversations reasoning (reasoning_content); for a model that "
        f"answers without thinking, {without} (docs/sft_data.md, Thinking mode)"
    )


def conversation_fingerprint(ids: np.ndarray) -> bytes:
    """A conversation's identity for finding it in both splits: a hash of its rendered tokens."""
    return hashlib.blake2b(np.asarray(ids, dtype="<i4").tobytes(), digest_size=16).digest()


def _text_size(value: Any) -> int:
    """Characters of text in a decoded record (a Parquet row): its strings, nested in lists and
    mappings, summed."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_size(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_text_size(v) for v in value)
    return 0


@dataclass(frozen=True)
class Prepared:
    """A conversation rendered: its tokens and loss mask, the record format it was read as, what it
    holds that is counted (:func:`~bridge_recipes.chat.message_text.turn_notes`), its size in bytes, whether
    its last reply carries reasoning and how many of its trained replies open with an empty think block."""

    ids: np.ndarray
    mask: np.ndarray
    record_format: str
    notes: tuple[str, ...]
    size: int
    reasoning: bool = False
    empty_thinks: int = 0


def _prepare(
    decode: Callable, render: Renderer, row_bound: int | None, index: int, raw: Any
) -> Prepared | MalformedConversation:
    """One conversation read, decoded and rendered (in a worker process
    when there are several), or why it is skipped. ``row_bound``: the row length when a conversation longer
    than a row is skipped (one of more bytes than could fit it is skipped unread); None when it may be
    split or truncated (only a record over :data:`MAX_CONVERSATION_BYTES` is)."""
    try:
        size = len(raw) if isinstance(raw, bytes) else _text_size(raw)
        if row_bound is None and size > MAX_CONVERSATION_BYTES:
            raise MalformedConversation(
                index,
                "conversation_too_large",
                f"conversation of {size:,} bytes, over the {MAX_CONVERSATION_BYTES:,} a build reads of one "
                "conversation; skipped before tokenizing",
                size,
            )
        if row_bound is not None and size > row_bound * MAX_LINE_BYTES_PER_TOKEN:
            raise MalformedConversation(
                index,
                "longer_than_row",
                f"conversation of {size:,} bytes cannot fit a {row_bound}-token row "
                f"(over {MAX_LINE_BYTES_PER_TOKEN} bytes a token); skipped before tokenizing",
                size,
            )
        conversation = decode(raw, index)
        try:
            done = render(conversation, index)
            fmt = getattr(conversation, "record_format", "")
            notes = tuple(turn_notes(conversation[0])) + getattr(conversation, "notes", ())
            return Prepared(done.ids, done.mask, fmt, notes, size, done.reasoning, done.empty_thinks)
        except MalformedConversation:
            raise
        except (TypeError, ValueError, UnicodeError, RecursionError) as e:
            # one conversation the tokenizer or template cannot take: counted, never fatal
            raise MalformedConversation(index, "render_failed", f"{type(e).__name__}: {e}") from None
    except MalformedConversation as e:
        return e
