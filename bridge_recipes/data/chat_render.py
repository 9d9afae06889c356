"""Chat rendering of one conversation into token ids and an assistant-only loss mask.

Chat format (Qwen ChatML, as the Qwen3.5 chat template renders plain text turns): each
message is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. Supervised (mask 1) are the
content tokens of assistant messages and their closing ``<|im_end|>``; the
``<|im_start|>assistant\\n`` header, the ``\\n`` after ``<|im_end|>`` and every system and user
token have mask 0. Content is used verbatim: no ``<think>`` block is inserted (a content that
already holds one is supervised as written). Roles are ``system``, ``user`` and ``assistant``.

Tokenization is per segment (the ``{role}\\n`` header, each content, the ``\\n`` after
``<|im_end|>``; the special tokens are inserted by id), so every token belongs to exactly one
message and the mask is exact. Tokenizing the whole rendered string instead can merge
characters across a segment boundary (e.g. a content starting with ``\\n`` joins the header's
``\\n`` in one BPE token), and such a token has no single correct mask value. As with the HF
chat template, special-token text inside a content (e.g. ``<|im_end|>``) encodes to the
special token.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from bridge_recipes.data.conversations import MalformedConversation, SftRowsError

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
    newline = tuple(tok.encode("\n", add_special_tokens=False).ids)
    if not newline:  # a tokenizer that drops newlines cannot represent the format
        raise SftRowsError("tokenizer encodes '\\n' to no token; it cannot render the Qwen chat format")
    headers = {role: tuple(tok.encode(f"{role}\n", add_special_tokens=False).ids) for role in ROLES}
    return ChatFormat(
        im_start_id=tok.token_to_id(IM_START),
        im_end_id=tok.token_to_id(IM_END),
        eos_id=tok.token_to_id(eos_token) if eos_token is not None else None,
        newline_ids=newline,
        header_ids=headers,
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
        if not isinstance(message["content"], str):
            kind = type(message["content"]).__name__
            raise MalformedConversation(index, "content_not_a_string", f"message {j} content is {kind}, not a string")
        if message["role"] == SUPERVISED_ROLE and not message["content"].strip():
            raise MalformedConversation(
                index, "empty_assistant_reply", f"message {j} is an assistant turn with nothing in it"
            )
    if not any(m["role"] == SUPERVISED_ROLE for m in messages):
        raise MalformedConversation(index, "no_assistant_turn", "conversation has no assistant turn")
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
    contents = tok.encode_batch([m["content"] for m in messages], add_special_tokens=False)
    ids: list[int] = []
    mask: list[int] = []
    for message, content in zip(messages, contents):
        header = [fmt.im_start_id, *fmt.header_ids[message["role"]]]
        body = [*content.ids, fmt.im_end_id]  # the closing <|im_end|> is learned with the reply
        supervised = 1 if message["role"] == SUPERVISED_ROLE else 0
        ids += header + body + list(fmt.newline_ids)
        mask += [0] * len(header) + [supervised] * len(body) + [0] * len(fmt.newline_ids)
    return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)
