"""Chat rendering of one conversation into token ids and an assistant-only loss mask.

Chat format (Qwen ChatML, as the Qwen3.5 chat template renders plain text turns): each
message is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. Supervised (mask 1) are the
content tokens of assistant messages and their closing ``<|im_end|>``; the
``<|im_start|>assistant\\n`` header, the ``\\n`` after ``<|im_end|>`` and every system and user
token have mask 0. Content is used verbatim: no ``<think>`` block is inserted (a reply that
begins with one is supervised as written); an assistant turn with ``weight`` 0 has mask 0
throughout. Roles are ``system``, ``user`` and ``assistant``; this
format renders no ``reasoning_content`` (skipped as ``reasoning_needs_template``: the template road
renders it).

Tokenization is per segment (the ``{role}\\n`` header, each content, the ``\\n`` after
``<|im_end|>``; the special tokens are inserted by id), so every token belongs to exactly one
message and the mask is exact. Tokenizing the whole rendered string instead can merge
characters across a segment boundary (e.g. a content starting with ``\\n`` joins the header's
``\\n`` in one BPE token), and such a token has no single correct mask value. A content that
writes a control token (``<|im_end|>``, ...; :mod:`message_text`) is skipped as
``control_token_in_text``, as on the template road: it would encode to the token itself.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bridge_recipes.chat.errors import MalformedConversation, SftRowsError
from bridge_recipes.chat.message_text import (
    assistant_image_problem,
    check_control_tokens,
    check_some_turn_trained,
    check_turn_keys,
    control_pattern,
    control_tokens,
    image_placeholder,
    is_image_part,
    placeholder_problem,
    think_block,
    trained,
)

DEFAULT_EOS_TOKEN = "<|endoftext|>"  # Qwen3.5's EOS, id 248046 in the released tokenizer
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLES = ("system", "user", "assistant")
SUPERVISED_ROLE = "assistant"


@dataclass(frozen=True)
class ChatFormat:
    """Token ids of the fixed parts of the Qwen chat format for one tokenizer."""

    im_start_id: int
    im_end_id: int
    eos_id: int | None
    newline_ids: tuple[int, ...]
    header_ids: dict[str, tuple[int, ...]]  # role -> ids of "{role}\n"
    control: re.Pattern | None = field(default=None, compare=False)  # the control tokens' texts


def backend_tokenizer(tokenizer: Any) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` behind a ``Tokenizer`` or a HF ``PreTrainedTokenizerFast``."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    raise TypeError(f"expected a tokenizers.Tokenizer or a PreTrainedTokenizerFast, got {type(tokenizer).__name__}")


def load_tokenizer(path: str | os.PathLike) -> tuple[Tokenizer, Path]:
    """Load ``tokenizer.json`` (a file, or a folder holding one); returns it and its path."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise SftRowsError(f"tokenizer not found: {file} (pass a tokenizer.json file or a folder holding one)")
    try:
        return Tokenizer.from_file(str(file)), file
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise SftRowsError(f"cannot read tokenizer {file}: {e}") from e


def chat_format(tokenizer: Any, eos_token: str | None = DEFAULT_EOS_TOKEN) -> ChatFormat:
    """Resolve the chat-format token ids; ``eos_token=None`` when no packing is needed."""
    tok = backend_tokenizer(tokenizer)
    needed = [IM_START, IM_END] + ([eos_token] if eos_token is not None else [])
    missing = [t for t in needed if tok.token_to_id(t) is None]
    if missing:
        raise SftRowsError(
            f"tokenizer lacks the token(s) {', '.join(missing)}: the Qwen chat format needs "
            f"{IM_START} and {IM_END}, and the EOS separator between conversations "
            f"({eos_token!r}, set with --eos-token) must be a single token"
        )
    eos = eos_id(tok, eos_token) if eos_token is not None else None
    newline = tuple(tok.encode("\n", add_special_tokens=False).ids)
    if not newline:  # a tokenizer that drops newlines cannot represent the format
        raise SftRowsError("tokenizer encodes '\\n' to no token; it cannot render the Qwen chat format")
    headers = {role: tuple(tok.encode(f"{role}\n", add_special_tokens=False).ids) for role in ROLES}
    return ChatFormat(
        im_start_id=tok.token_to_id(IM_START),
        im_end_id=tok.token_to_id(IM_END),
        eos_id=eos,
        newline_ids=newline,
        header_ids=headers,
        control=control_pattern(control_tokens(tok)),
    )


def eos_id(tokenizer: Any, eos_token: str) -> int:
    """The id of ``--eos-token``, which must be one of the tokenizer's special tokens: a plain word that
    happens to be one token would pass for text where it separates or pads conversations."""
    tok = backend_tokenizer(tokenizer)
    specials = [t.content for _, t in sorted(tok.get_added_tokens_decoder().items()) if t.special]
    if eos_token in specials:
        return tok.token_to_id(eos_token)
    fit = [t for t in specials if t != IM_START]
    lacks = "is not a token of" if tok.token_to_id(eos_token) is None else "is not a special token of"
    raise SftRowsError(
        f"--eos-token {eos_token!r} {lacks} the tokenizer; it separates conversations (eos_joined rows) and pads "
        f"rows, so it must be a special token: one of {', '.join(fit[:12]) or '(none)'}"
        + (f" (the default is {DEFAULT_EOS_TOKEN})" if DEFAULT_EOS_TOKEN in fit else "")
    )


# --------------------------------------------------------------------- render and mask


def validate_conversation(messages: Any, index: int | None = None) -> list[dict]:
    """Return ``messages`` if it is a renderable conversation, else raise MalformedConversation."""
    if not isinstance(messages, list):
        kind = type(messages).__name__
        raise MalformedConversation(index, "messages_not_a_list", f"messages is {kind}, not a list")
    if not messages:
        raise MalformedConversation(index, "empty_conversation", "messages is an empty list")
    for j, message in enumerate(messages):
        if not isinstance(message, dict):
            raise MalformedConversation(
                index, "message_not_an_object", f"message {j} is {type(message).__name__}, not an object"
            )
        for key in ("role", "content"):
            if message.get(key) is None:
                raise MalformedConversation(index, "missing_role_or_content", f"message {j} has no {key!r}")
        if message["role"] not in ROLES:
            raise MalformedConversation(
                index, "unknown_role", f"message {j} has unknown role {message['role']!r} (expected one of {ROLES})"
            )
        check_turn_keys(message, index, j)
        content = message["content"]
        if isinstance(content, list) and message["role"] == SUPERVISED_ROLE and any(map(is_image_part, content)):
            raise assistant_image_problem(index, j)
        if not isinstance(content, str):
            kind = type(content).__name__
            raise MalformedConversation(index, "content_not_a_string", f"message {j} content is {kind}, not a string")
        if message["role"] == SUPERVISED_ROLE and not message["content"].strip():
            raise MalformedConversation(
                index, "empty_assistant_reply", f"message {j} is an assistant turn with nothing in it"
            )
        if image_placeholder(content):
            raise placeholder_problem(index, j)
        reasoning = message.get("reasoning_content") if message["role"] == SUPERVISED_ROLE else None
        if isinstance(reasoning, str) and reasoning.strip():
            raise MalformedConversation(
                index,
                "reasoning_needs_template",
                f"message {j} has reasoning_content, which --chat-format chatml does not render (it would be "
                "dropped); build with --chat-format template, which renders it",
            )
    if not any(m["role"] == SUPERVISED_ROLE for m in messages):
        raise MalformedConversation(index, "no_assistant_turn", "conversation has no assistant turn")
    check_some_turn_trained(messages, index)
    return messages


def render_conversation(
    tokenizer: Any, messages: Any, fmt: ChatFormat | None = None, *, index: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int32) and loss mask (uint8, 1 = supervised) of one conversation.

    Raises MalformedConversation (naming ``index``) if the conversation is malformed.
    """
    tok = backend_tokenizer(tokenizer)
    fmt = fmt or chat_format(tok, eos_token=None)
    validate_conversation(messages, index)
    thinks = {j for j, m in enumerate(messages) if m["role"] == SUPERVISED_ROLE and think_block(m["content"])}
    texts = [{"role": m["role"], "content": m["content"]} for m in messages]
    check_control_tokens(fmt.control, texts, None, index, thinks)
    contents = tok.encode_batch([m["content"] for m in messages], add_special_tokens=False)
    ids: list[int] = []
    mask: list[int] = []
    for message, content in zip(messages, contents):
        header = [fmt.im_start_id, *fmt.header_ids[message["role"]]]
        body = [*content.ids, fmt.im_end_id]  # the closing <|im_end|> is learned with the reply
        supervised = 1 if message["role"] == SUPERVISED_ROLE and trained(message) else 0
        ids += header + body + list(fmt.newline_ids)
        mask += [0] * len(header) + [supervised] * len(body) + [0] * len(fmt.newline_ids)
    return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)
