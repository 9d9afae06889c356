"""What the text of a conversation may hold in a text-only SFT rows build (docs/sft_data.md).

- Control tokens: the tokenizer's special tokens and the added tokens it matches on the raw text
  (``<|im_start|>``, ``<|im_end|>``, ``<think>``, ``<tool_call>``, ...). Written inside a message's
  text (content, reasoning, a tool call, the tool list) they would tokenize to the control token
  itself, so a user could end a turn or open an assistant one: such a conversation is skipped as
  ``control_token_in_text``. The one exception is an assistant reply that begins with its
  reasoning as a ``<think>...</think>`` block (see :func:`think_block`).
- LLaVA image placeholders: a line that is ``<image>`` alone, or a record with an ``image`` /
  ``images`` key, is an image conversation (``image_conversation``) for
  ``scripts/build_vl_dataset.py``.
- Image parts: an image in an assistant reply is a target no text model writes
  (``image_in_assistant_reply``).
- Turn keys: an assistant turn's ``weight`` (OpenAI's fine-tuning marker) is 0 (not trained: its
  tokens stay out of the loss) or 1 (``weight_not_0_or_1`` otherwise; ``no_trained_turn`` when every
  reply has weight 0); ``reasoning_content`` belongs to assistant turns only
  (``reasoning_on_a_user_turn``: no renderer shows it there, so it would vanish).
- Turn notes (:func:`turn_notes`): what a kept conversation holds that the build counts and
  reports without skipping it (untrained replies, blank user turns, user turns in a row, a last
  user turn nobody answers).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from bridge_recipes.chat.errors import MalformedConversation

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
IMAGE_PLACEHOLDER = "<image>"  # LLaVA's stand-in for an image in the text
IMAGE_KEYS = ("image", "images")  # a LLaVA record's image path(s)
IMAGE_PART_TYPES = ("image", "image_url", "input_image")
VL_BUILDER = "scripts/build_vl_dataset.py --processor CHECKPOINT"  # how image conversations are built
_PLACEHOLDER_LINE = re.compile(r"^[ \t]*<image>[ \t]*$", re.MULTILINE)


def control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The texts of a ``tokenizers.Tokenizer``'s control tokens: its special tokens and the added tokens
    it matches before normalizing (an added vocabulary word is normalized, and stays ordinary text)."""
    added = tokenizer.get_added_tokens_decoder().values()
    return tuple(sorted({t.content for t in added if t.special or not t.normalized}, key=len, reverse=True))


def control_pattern(tokens: tuple[str, ...]) -> re.Pattern | None:
    return re.compile("|".join(map(re.escape, tokens))) if tokens else None


def texts(value: Any) -> Iterator[str]:
    """Every string in a JSON-like value: strings, mapping keys and values, list items."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from texts(k)
            yield from texts(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from texts(v)


def find_control_token(pattern: re.Pattern | None, value: Any) -> str | None:
    """The first control token written in any string of ``value``, or None."""
    if pattern is None:
        return None
    for text in texts(value):
        if "<" in text and (found := pattern.search(text)):
            return found.group()
    return None


def check_control_tokens(
    pattern: re.Pattern | None,
    messages: list[dict],
    tools: Any,
    index: int | None,
    think_allowed: frozenset[int] | set[int] = frozenset(),
) -> None:
    """MalformedConversation (``control_token_in_text``) when a message or the tool list writes a control
    token; ``think_allowed``: messages whose leading ``<think>...</think>`` block is accepted."""
    for j, message in enumerate(messages):
        fields = {k: v for k, v in message.items() if k != "role"}
        if j in think_allowed:
            fields["content"] = think_block(fields["content"])
        if token := find_control_token(pattern, fields):
            raise MalformedConversation(
                index,
                "control_token_in_text",
                f"message {j} ({message['role']}) writes the control token {token!r} in its text, which would "
                "tokenize to the token itself; remove it from the data",
            )
    if token := find_control_token(pattern, tools):
        raise MalformedConversation(
            index, "control_token_in_text", f"the tools list writes the control token {token!r} in its text"
        )


def think_block(content: str) -> tuple[str, str] | None:
    """(reasoning, reply) of a content that begins with its reasoning in one ``<think>...</think>``
    block (the opening tag may be left out, as a thinking model's output omits what its prompt opened),
    split as Qwen's templates split it; None when the content is not of that form."""
    if content.count(THINK_CLOSE) != 1 or content.count(THINK_OPEN) > 1:
        return None
    head, reply = content.split(THINK_CLOSE)
    if THINK_OPEN in head:
        before, head = head.split(THINK_OPEN)
        if before.strip():
            return None
    return head.strip("\n"), reply.lstrip("\n")


def has_reasoning(message: dict) -> bool:
    """Whether an assistant turn carries reasoning: a ``reasoning_content`` with text in it, or a content
    that begins with a ``<think>...</think>`` block (:func:`think_block`) with text in it."""
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning.strip():
        return True
    content = message.get("content")
    block = think_block(content) if isinstance(content, str) and THINK_CLOSE in content else None
    return block is not None and bool(block[0].strip())


def ends_with_reasoning(messages: Any) -> bool:
    """Whether a conversation's last assistant reply carries reasoning (:func:`has_reasoning`): a reasoning
    conversation, which trains a thinking model to think before it answers."""
    replies = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    return bool(replies) and has_reasoning(replies[-1])


def image_placeholder(text: str) -> bool:
    """Whether a text holds a LLaVA ``<image>`` line (the placeholder alone on its line)."""
    return IMAGE_PLACEHOLDER in text and _PLACEHOLDER_LINE.search(text) is not None


def placeholder_problem(index: int | None, j: int) -> MalformedConversation:
    return MalformedConversation(
        index,
        "image_conversation",
        f"message {j} holds a LLaVA {IMAGE_PLACEHOLDER} line: an image conversation, which a text-only build "
        f"cannot train; build it with {VL_BUILDER}",
    )


def check_image_record(record: dict, index: int, exclude: tuple[str, ...] = ()) -> None:
    """MalformedConversation (``image_conversation``) for a record that names images (LLaVA's keys, other
    than ``exclude``: keys its format reads as something else)."""
    for key in IMAGE_KEYS:
        if key not in exclude and record.get(key) not in (None, "", []):
            raise MalformedConversation(
                index,
                "image_conversation",
                f"record has an {key!r} key: an image conversation, which a text-only build cannot train; "
                f"build it with {VL_BUILDER}",
            )


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and (
        part.get("type") in IMAGE_PART_TYPES or any(k in part for k in ("image", "image_url"))
    )


def assistant_image_problem(index: int | None, j: int) -> MalformedConversation:
    return MalformedConversation(
        index,
        "image_in_assistant_reply",
        f"message {j} is an assistant reply with an image part; a model writes text, so an image cannot be a "
        "target: remove the image from the reply (images belong in user turns, with " + VL_BUILDER + ")",
    )


def drop_nulls(value: Any) -> Any:
    """``value`` with every null mapping value removed, at any depth: a Parquet struct column gives each
    row all the keys any row has, null where it had none, so a null there is read as absent."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


WEIGHT_KEY = "weight"  # OpenAI's per-turn fine-tuning marker: 0 leaves an assistant turn out of the loss


def check_turn_keys(message: dict, index: int | None, j: int) -> None:
    """MalformedConversation for a turn key no renderer can honour: ``reasoning_content`` on a turn
    other than an assistant's (it would vanish from the rendering), a ``weight`` other than 0 or 1."""
    role = message.get("role")
    reasoning = message.get("reasoning_content")
    if role != "assistant" and reasoning not in (None, ""):
        raise MalformedConversation(
            index,
            "reasoning_on_a_user_turn",
            f"message {j} ({role}) has reasoning_content, which only an assistant turn carries (no chat template "
            "renders it on another turn, so it would be dropped); move it into the content, or remove it",
        )
    if WEIGHT_KEY in message and (
        role != "assistant" or isinstance(message[WEIGHT_KEY], bool) or message[WEIGHT_KEY] not in (0, 1)
    ):
        where = "an assistant turn" if role == "assistant" else f"a {role} turn (only assistant turns are trained)"
        raise MalformedConversation(
            index,
            "weight_not_0_or_1",
            f"message {j} has weight {message[WEIGHT_KEY]!r} on {where}; weight is 0 (not trained) or 1 (trained) "
            "on an assistant turn",
        )


def trained(message: dict) -> bool:
    """Whether an assistant turn is in the loss: all are, but one with ``weight`` 0."""
    return message.get(WEIGHT_KEY, 1) != 0


def check_some_turn_trained(messages: list[dict], index: int | None) -> None:
    """MalformedConversation (``no_trained_turn``) when every assistant turn has weight 0: nothing to learn."""
    replies = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    if replies and not any(map(trained, replies)):
        raise MalformedConversation(
            index, "no_trained_turn", f"all {len(replies)} assistant turn(s) have weight 0: nothing is trained"
        )


# notes a kept conversation may carry, counted per split (manifest conversations.notes)
NOTE_UNTRAINED = "assistant_turns_with_weight_0"
NOTE_BLANK_USER = "blank_user_turns"
NOTE_USERS_IN_A_ROW = "user_turns_in_a_row"
NOTE_UNANSWERED = "ending_on_a_user_turn"


def _blank(content: Any) -> bool:
    """A content with no text but white space (a string, or text parts; a part of another kind is not blank)."""
    parts = content if isinstance(content, list) else [content]
    text = []
    for part in parts:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            part = part["text"]
        if not isinstance(part, str):
            return False
        text.append(part)
    return not "".join(text).strip()


def turn_notes(messages: Any) -> list[str]:
    """What a renderable conversation holds that is kept but counted and reported: each assistant turn
    with weight 0 (masked out of the loss), each user turn with only white space, each user turn right after
    another, and the conversation ending on a user turn (a question nobody answers)."""
    if not isinstance(messages, list):
        return []
    turns = [m for m in messages if isinstance(m, dict)]
    notes = [NOTE_UNTRAINED for m in turns if m.get("role") == "assistant" and not trained(m)]
    notes += [NOTE_BLANK_USER for m in turns if m.get("role") == "user" and _blank(m.get("content"))]
    roles = [m.get("role") for m in turns]
    notes += [NOTE_USERS_IN_A_ROW for a, b in zip(roles, roles[1:]) if a == b == "user"]
    if roles and roles[-1] == "user":
        notes.append(NOTE_UNANSWERED)
    return notes
