"""Rendering with the tokenizer's own chat template, with a loss mask on what the assistant writes.

The tokenizer folder the recipe trains with (``tokenizer.json`` with ``tokenizer_config.json``
and its ``chat_template``, or a ``chat_template.jinja`` beside them) renders each conversation
through transformers' ``apply_chat_template``, so a row holds exactly the text the model sees
at inference: the system prompt with the tool list, ``<think>`` blocks, tool calls and tool
responses as the template writes them.

Input is OpenAI-style (:mod:`chat_formats` turns ShareGPT and Alpaca records into it): ``messages``
with roles ``system`` (or ``developer``), ``user``, ``assistant`` and ``tool``;
``content`` a string or a list of parts (``{"type": "text", "text": ...}`` parts are joined; a
conversation with any other part, e.g. an image, is skipped as ``non_text_content``);
assistant turns may carry ``reasoning_content`` and ``tool_calls`` (then ``content`` may be
null; ``function.arguments`` may be a JSON string, it is parsed); an optional per-conversation
``tools`` list is passed to the template. An assistant turn with no text, reasoning or tool
call (``empty_assistant_reply``) and a tool result that follows no assistant tool call
(``tool_result_without_call``) are skipped: training on them teaches an empty answer or a
result nobody asked for. What the text may hold (no control token, no LLaVA ``<image>`` line, no
image in a reply; reasoning inside content only as the template renders it) is :mod:`message_text`'s.

Mask (1 = supervised). A ChatML template (Qwen's) renders the conversation once: the k-th
``<|im_start|>assistant\n`` of the rendering ``S`` opens the k-th assistant message, whose span
starts after the generation prompt where ``S`` repeats it (else after the header line) and ends
with its end-of-turn token; the count of headers and each reply's text inside its span are
checked, and a conversation that fails them takes the general road. So a conversation is
rendered a bounded number of times whatever its turns, and an earlier turn whose reasoning the
template drops is supervised as ``S`` shows it. The general road (any template, three renders
per assistant turn): for each assistant message ``i`` the template renders
``messages[:i]`` with the generation prompt (``G``) and ``messages[:i+1]`` (``Q``); the full
conversation renders to ``S``. The assistant's text starts where ``G`` ends (the generation
prompt, e.g. ``<|im_start|>assistant\\n<think>\\n``, is prompt, not target) and ends with its
end-of-turn token (``<|im_end|>``), at the end of ``Q`` where ``Q`` is a prefix of ``S``. A
template may render an earlier turn differently once later turns exist (Qwen templates drop
the ``<think>`` block of turns before the last user query); then the turn starts after the
header line the generation prompt and ``S`` share, and ends at its first end-of-turn token in
``S``, so what is supervised is that turn as ``S`` shows it. The history before the turn
(``messages[:i]`` without the generation prompt) must be a prefix of ``S``, or the
conversation is skipped (``template_not_prefix_consistent``). So: the assistant's reasoning,
text, tool calls and end-of-turn token have mask 1 (but for a turn with ``weight`` 0); system,
user and tool turns, the assistant header and the ``\\n`` after each turn have mask 0. A thinking
template (:func:`empty_think_block`) writes an empty think block before a reply without reasoning; its
tokens have mask 0 and the reply after it mask 1, unless ``train_empty_think``: trained, the block
teaches the model to close its thinking at once.

Tokens are those of ``S`` tokenized whole (as at inference), and each span boundary must be
a token boundary: the tokens of ``S[:start]`` and ``S[:end]`` must be prefixes of the tokens
of ``S``. A token merged across a boundary has no single correct mask value; such a
conversation is skipped as ``tokenization_not_prefix_consistent``, never mis-masked. The
tokenizer splits its text at added tokens (``<|im_start|>``, ``<|im_end|>``, ...) before anything
else, so the tokens of ``S[:c]`` are those of ``S`` up to the last added token ending at or before
``c``, followed by the tokens of the text from there to ``c``: only that text is tokenized again,
and ``S`` is tokenized once, whatever the number of turns.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bridge_recipes.chat.errors import MalformedConversation, SftRowsError
from bridge_recipes.chat.message_text import (
    THINK_CLOSE,
    THINK_OPEN,
    VL_BUILDER,
    assistant_image_problem,
    check_control_tokens,
    check_some_turn_trained,
    check_turn_keys,
    control_pattern,
    control_tokens,
    ends_with_reasoning,
    image_placeholder,
    is_image_part,
    placeholder_problem,
    think_block,
    trained,
)
from bridge_recipes.patches import jinja_sandbox

ROLES = ("system", "user", "assistant", "tool")
# OpenAI's newer models call the system message "developer"
ROLE_ALIASES = {"developer": "system"}
END_OF_TURN = "<|im_end|>"  # Qwen3.5's end of a chat turn
ASSISTANT_HEADER = "<|im_start|>assistant\n"  # ChatML's opening of an assistant turn
USER_HEADER = "<|im_start|>user\n"  # and of a user turn
SHORT_HEAD = 16  # characters: texts this short between an added token and a span boundary are cached


# The files of a tokenizer folder that decide how the chat template renders (chat_template_sha256).
TEMPLATE_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def template_files_sha256(folder: str | os.PathLike) -> str:
    """sha256 over the files that decide the rendering (name, then bytes, for those present)."""
    hasher = hashlib.sha256()
    for name in TEMPLATE_FILES:
        path = Path(folder) / name
        if path.is_file():
            hasher.update(name.encode() + b"\0" + path.read_bytes())
    return hasher.hexdigest()


def _text_of(content: Any, index: int | None, j: int, role: str = "user") -> str:
    """A message content as one string: a string, or the text parts of a list joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        kind = type(content).__name__
        raise MalformedConversation(index, "content_not_a_string", f"message {j} content is {kind}, not a string")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif role == "assistant" and is_image_part(part):
            raise assistant_image_problem(index, j)
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            hint = f" (image conversations: {VL_BUILDER})" if is_image_part(part) else ""
            raise MalformedConversation(
                index,
                "non_text_content",
                f"message {j} has a {kind!r} content part; text models take text parts only{hint}",
            )
    return "".join(texts)


def _tool_call(call: Any, index: int | None, j: int) -> dict:
    fn = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise MalformedConversation(index, "tool_call_malformed", f"message {j} has a tool call without a name")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise MalformedConversation(
                index, "tool_arguments_not_json", f"message {j} tool call {fn['name']!r} arguments are not JSON"
            ) from None
    if not isinstance(args, dict):
        raise MalformedConversation(
            index, "tool_arguments_not_json", f"message {j} tool call {fn['name']!r} arguments are not an object"
        )
    return {"type": "function", "function": {"name": fn["name"], "arguments": args}}


def normalize_conversation(messages: Any, tools: Any = None, index: int | None = None) -> tuple[list[dict], list]:
    """Validated messages in the form the template takes, and the tool list; else MalformedConversation."""
    if not isinstance(messages, list):
        kind = type(messages).__name__
        raise MalformedConversation(index, "messages_not_a_list", f"messages is {kind}, not a list")
    if not messages:
        raise MalformedConversation(index, "empty_conversation", "messages is an empty list")
    if tools is not None and not isinstance(tools, list):
        raise MalformedConversation(index, "tools_not_a_list", f"tools is {type(tools).__name__}, not a list")
    out = []
    for j, message in enumerate(messages):
        if not isinstance(message, dict):
            kind = type(message).__name__
            raise MalformedConversation(index, "message_not_an_object", f"message {j} is {kind}, not an object")
        role = message.get("role")
        if role is None:
            raise MalformedConversation(index, "missing_role_or_content", f"message {j} has no 'role'")
        role = ROLE_ALIASES.get(role, role)
        if role not in ROLES:
            raise MalformedConversation(
                index, "unknown_role", f"message {j} has unknown role {role!r} (expected one of {ROLES})"
            )
        if role == "system" and j:
            raise MalformedConversation(index, "system_not_first", f"message {j} is a system message after the first")
        check_turn_keys({**message, "role": role}, index, j)
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls is not None and not isinstance(calls, list):
            raise MalformedConversation(index, "tool_call_malformed", f"message {j} tool_calls is not a list")
        content = message.get("content")
        if content is None and not calls:
            raise MalformedConversation(index, "missing_role_or_content", f"message {j} has no 'content'")
        m = {"role": role, "content": "" if content is None else _text_of(content, index, j, role)}
        if image_placeholder(m["content"]):
            raise placeholder_problem(index, j)
        if role == "assistant":
            reasoning = message.get("reasoning_content")
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    kind = type(reasoning).__name__
                    raise MalformedConversation(
                        index, "reasoning_not_a_string", f"message {j} reasoning_content is {kind}, not a string"
                    )
                m["reasoning_content"] = reasoning
            if calls:
                m["tool_calls"] = [_tool_call(c, index, j) for c in calls]
            elif not m["content"].strip() and not (reasoning or "").strip():
                raise MalformedConversation(
                    index, "empty_assistant_reply", f"message {j} is an assistant turn with nothing in it"
                )
        if role == "tool" and not (out and (out[-1].get("tool_calls") or out[-1]["role"] == "tool")):
            raise MalformedConversation(
                index,
                "tool_result_without_call",
                f"message {j} is a tool result with no assistant tool call before it",
            )
        out.append(m)
    if not any(m["role"] == "assistant" for m in out):
        raise MalformedConversation(index, "no_assistant_turn", "conversation has no assistant turn")
    check_some_turn_trained(messages, index)
    return out, list(tools or [])


class Rendered(NamedTuple):
    """One conversation rendered: its tokens (int32) and loss mask (uint8, 1 = supervised), whether its last
    reply carries reasoning (:func:`~bridge_recipes.chat.message_text.ends_with_reasoning`), and how many of
    its trained replies open with the template's empty think block."""

    ids: np.ndarray
    mask: np.ndarray
    reasoning: bool
    empty_thinks: int


PROBE = ({"role": "user", "content": "Question?"}, {"role": "assistant", "content": "Answer."})
_EMPTY_THINK = re.compile(re.escape(THINK_OPEN) + r"\s*" + re.escape(THINK_CLOSE) + r"\s*")


def empty_think_block(template: Any, render: Callable[[list[dict]], str]) -> str | None:
    """The empty think block a thinking chat template writes between the assistant header and a reply without
    reasoning, or None when the template is no thinking template. Qwen3.5/3.6's released template writes
    ``<think>\\n\\n</think>\\n\\n`` before each reply after the last user query that has no reasoning (and the
    same block as the generation prompt with ``enable_thinking=false``). Decided from the template's text
    (it writes ``<think>`` and ``</think>``) and ``render`` of a one-question conversation whose reply has no
    reasoning: what stands between its ``<|im_start|>assistant\\n`` and the reply."""
    text = template if isinstance(template, str) else json.dumps(template)
    if THINK_OPEN not in text or THINK_CLOSE not in text:
        return None
    question, reply = PROBE
    try:
        rendered = render([dict(question), dict(reply)])
    except Exception:  # a template that cannot render the probe: no block this builder can place
        return None
    head = rendered.rfind(ASSISTANT_HEADER)
    at = rendered.find(reply["content"], head + len(ASSISTANT_HEADER)) if head >= 0 else -1
    block = rendered[head + len(ASSISTANT_HEADER) : at] if at >= 0 else ""
    return block if _EMPTY_THINK.fullmatch(block) else None


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class TemplateRenderer:
    """Renders conversations with a tokenizer folder's chat template (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike, end_of_turn: str = END_OF_TURN, *, train_empty_think: bool = False):
        folder = Path(folder).expanduser()
        if folder.is_file():
            folder = folder.parent
        if not (folder / "tokenizer.json").is_file():
            raise SftRowsError(f"tokenizer folder {folder} has no tokenizer.json (pass the model's tokenizer folder)")
        try:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as e:  # transformers raises many kinds on a bad folder
            raise SftRowsError(f"cannot load the tokenizer folder {folder}: {type(e).__name__}: {e}") from e
        if not getattr(self.hf, "chat_template", None):
            raise SftRowsError(
                f"tokenizer folder {folder} has no chat template (tokenizer_config.json 'chat_template' or "
                "chat_template.jinja); use the model's tokenizer folder, or --chat-format chatml for plain ChatML"
            )
        self.backend = self.hf.backend_tokenizer
        if self.backend.token_to_id(end_of_turn) is None:
            raise SftRowsError(f"tokenizer {folder} lacks the end-of-turn token {end_of_turn!r}")
        self.folder = folder
        self.end_of_turn = end_of_turn
        # tokens the tokenizer matches before anything else, splitting the text around them
        self.added_ids = frozenset(self.backend.get_added_tokens_decoder())
        self.added_array = np.fromiter(sorted(self.added_ids), dtype=np.int32)
        controls = control_tokens(self.backend)
        self.control = control_pattern(controls)
        self.think_tokens = THINK_OPEN in controls or THINK_CLOSE in controls
        self.sha256 = template_files_sha256(folder)
        self.generation_prompt = self._generation_prompt()
        self.empty_think = empty_think_block(self.hf.chat_template, lambda probe: self._apply(probe, [], False))
        self.train_empty_think = train_empty_think
        self._short_heads: dict[str, list[int]] = {}
        self.sandbox_checks_memoized = jinja_sandbox.memoize(self.hf.chat_template)

    def _apply(self, messages: list[dict], tools: list, generation: bool) -> str:
        return self.hf.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation
        )

    def _ids(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def _head_ids(self, text: str) -> list[int]:
        """Tokens of the text between an added token and a span boundary: mostly a few characters that
        recur every turn (``\n`` after ``<think>``, nothing after ``<|im_end|>``), so short ones are kept."""
        if len(text) > SHORT_HEAD:
            return self._ids(text)
        ids = self._short_heads.get(text)
        if ids is None:
            ids = self._short_heads[text] = self._ids(text)
        return ids

    def render(self, messages: Any, tools: Any = None, *, index: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids (int32) and loss mask (uint8, 1 = supervised) of one conversation."""
        done = self.rendered(messages, tools, index=index)
        return done.ids, done.mask

    def rendered(self, messages: Any, tools: Any = None, *, index: int | None = None) -> Rendered:
        """One conversation's tokens and loss mask, with what the build counts of it (:class:`Rendered`)."""
        given = messages
        messages, tools = normalize_conversation(messages, tools, index)
        # spans come one per assistant turn, in order; a turn with weight 0 stays out of the loss
        kept = [trained(m) for m in given if m.get("role") == "assistant"]
        try:
            messages = self._reasoning_from_content(messages, tools, index)
            check_control_tokens(self.control, messages, tools, index)
            full = self._apply(messages, tools, False)
            spans = self.spans_from_rendering(messages, full)
            if spans is None:
                spans = self.spans_by_prefix_renders(messages, tools, full, index)
        except MalformedConversation:
            raise
        except Exception as e:  # a template's raise_exception or a Jinja error on this input
            raise MalformedConversation(index, "template_error", f"chat template failed: {e}") from None
        encoding = self.backend.encode(full, add_special_tokens=False)
        ids = encoding.ids
        # (end character, tokens up to it) of each added token: where the tokenizer splits regardless
        tokens = np.asarray(ids, dtype=np.int32)
        offsets = encoding.offsets
        splits = [(offsets[k][1], k + 1) for k in np.flatnonzero(np.isin(tokens, self.added_array)).tolist()]
        mask = np.zeros(len(ids), dtype=np.uint8)
        empty_thinks = 0
        for (start, end), keep in zip(spans, kept, strict=True):
            if not keep:
                continue
            a, b = self._token_index(full, start, ids, splits, index), self._token_index(full, end, ids, splits, index)
            mask[a:b] = 1
            if (cut := self._empty_think_end(full, start, end)) is not None:
                empty_thinks += 1
                if not self.train_empty_think:  # the tokens inside the block; one it shares with the reply stays
                    mask[a : bisect.bisect_right(offsets, cut, key=lambda o: o[1])] = 0
        return Rendered(tokens, mask, ends_with_reasoning(messages), empty_thinks)

    def _empty_think_end(self, full: str, start: int, end: int) -> int | None:
        """Where the empty think block ends when the reply spanning ``full[start:end]`` opens with it (it
        has no reasoning, and the template wrote the block after its header); else None."""
        if self.empty_think is None:
            return None
        head = full.rfind(ASSISTANT_HEADER, 0, start)
        if head < 0:
            return None
        after = head + len(ASSISTANT_HEADER)
        cut = after + len(self.empty_think)
        return cut if after <= start < cut <= end and full.startswith(self.empty_think, after) else None

    def _reasoning_from_content(self, messages: list[dict], tools: list, index: int | None) -> list[dict]:
        """Assistant replies that begin with their reasoning as a ``<think>...</think>`` block, given as
        ``reasoning_content`` instead, when the template renders the two alike (Qwen's templates read such a
        block as the reasoning); else MalformedConversation (``reasoning_in_content``): the template would
        render the tags as text of the reply. Unchanged when ``<think>`` is no control token."""
        if not self.think_tokens:
            return messages
        moved, changed = [], []
        for j, m in enumerate(messages):
            block = None
            if m["role"] == "assistant" and "reasoning_content" not in m and THINK_CLOSE in m["content"]:
                block = think_block(m["content"])
            if block is None:
                moved.append(m)
            else:
                moved.append({**m, "reasoning_content": block[0], "content": block[1]})
                changed.append(j)
        if changed and self._apply(messages, tools, False) != self._apply(moved, tools, False):
            raise MalformedConversation(
                index,
                "reasoning_in_content",
                f"message {changed[0]} writes its reasoning inside content as {THINK_OPEN}...{THINK_CLOSE}, which "
                "this chat template does not render as reasoning; give it as the message's reasoning_content",
            )
        return moved

    def spans_from_rendering(self, messages: list[dict], full: str) -> list[tuple[int, int]] | None:
        """The assistant spans read off the one rendering ``full`` of a ChatML template, or None when it cannot
        vouch for them (then :meth:`spans_by_prefix_renders` decides). The k-th assistant header of ``full``
        opens the k-th assistant message; its span starts after the generation prompt when ``full`` repeats
        it there (else after the header line) and ends with the first end-of-turn token after it, as the
        prefix renders would place them. Checked: as many headers as assistant messages, and each message's
        reply text inside its span (a reply holding a header or an end-of-turn token of its own fails)."""
        if self.generation_prompt is None:
            return None
        replies = [m for m in messages if m["role"] == "assistant"]
        heads, at = [], full.find(ASSISTANT_HEADER)
        while at != -1:
            heads.append(at)
            at = full.find(ASSISTANT_HEADER, at + len(ASSISTANT_HEADER))
        if len(heads) != len(replies):
            return None
        spans = []
        for head, message in zip(heads, replies):
            prompt = self.generation_prompt if full.startswith(self.generation_prompt, head) else ASSISTANT_HEADER
            start = head + len(prompt)
            end = full.find(self.end_of_turn, start)
            reply = message["content"].split("</think>")[-1].strip()
            if end < 0 or reply not in full[start:end]:
                return None
            spans.append((start, end + len(self.end_of_turn)))
        return spans

    def spans_by_prefix_renders(
        self, messages: list[dict], tools: list, full: str, index: int | None
    ) -> list[tuple[int, int]]:
        """The assistant spans from rendering each assistant message's history with and without the generation
        prompt (three renders per assistant message: any template, quadratic in the turns)."""
        return [
            self._span(messages, tools, i, full, index) for i, m in enumerate(messages) if m["role"] == "assistant"
        ]

    def _generation_prompt(self) -> str | None:
        """What the generation prompt adds after a history (``<|im_start|>assistant\n``, and ``<think>\n``
        for a thinking template), when the template is ChatML; else None."""
        probe = [{"role": "user", "content": "x"}]
        try:
            history, prompt = self._apply(probe, [], False), self._apply(probe, [], True)
        except Exception:  # a template that cannot render the probe: the prefix renders decide
            return None
        tail = prompt[len(history) :] if prompt.startswith(history) else ""
        return tail if tail.startswith(ASSISTANT_HEADER) else None

    def _span(self, messages: list[dict], tools: list, i: int, full: str, index: int | None) -> tuple[int, int]:
        history = self._apply(messages[:i], tools, False) if i else ""
        if not full.startswith(history):
            raise MalformedConversation(
                index,
                "template_not_prefix_consistent",
                f"the chat template renders the turns before message {i} differently once later turns exist",
            )
        prompt = self._apply(messages[:i], tools, True)
        if full.startswith(prompt):
            start = len(prompt)
        else:  # this turn is rendered differently in the full conversation: start after the shared header line
            shared = _common_prefix(prompt, full)
            start = full.rfind("\n", len(history), shared) + 1
            if start <= len(history):
                raise MalformedConversation(
                    index, "template_not_prefix_consistent", f"no assistant header found for message {i}"
                )
        through = self._apply(messages[: i + 1], tools, False)
        end = (
            through.rfind(self.end_of_turn, start) if full.startswith(through) else full.find(self.end_of_turn, start)
        )
        if end < start:
            raise MalformedConversation(
                index, "template_no_end_of_turn", f"message {i} has no {self.end_of_turn} after it in the rendering"
            )
        return start, end + len(self.end_of_turn)

    def _token_index(
        self, full: str, char: int, ids: list[int], splits: list[tuple[int, int]], index: int | None
    ) -> int:
        """How many tokens of ``full`` (``ids``) the text before ``char`` tokenizes to, checked to be a prefix
        of them: the text after the last added token ending at or before ``char`` is tokenized again
        (``splits``: the end character of each added token and the tokens up to it)."""
        at = bisect.bisect_right(splits, (char, len(ids) + 1))
        begin, known = splits[at - 1] if at else (0, 0)
        head = self._head_ids(full[begin:char])
        if ids[known : known + len(head)] != head:
            raise MalformedConversation(
                index,
                "tokenization_not_prefix_consistent",
                f"a token spans the boundary at character {char} between a prompt and an assistant span",
            )
        return known + len(head)
