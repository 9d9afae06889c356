"""The conversation record formats an SFT rows build reads, detected per record.

- ``openai``: ``{"messages": [{"role", "content", ...}], "tools": [...]}`` (roles ``system``,
  ``developer``, ``user``, ``assistant``, ``tool``; the key is ``--messages-key``).
- ``sharegpt``: ``{"conversations": [{"from", "value"}], "system": ..., "tools": ...}`` with
  ``from`` one of ``system``, ``human``, ``gpt``, ``function_call`` (a JSON call the assistant
  makes), ``observation`` or ``tool`` (its result); ``tools`` a list or its JSON text.
- ``alpaca``: ``{"instruction", "input", "output", "system", "history"}``: the user turn is the
  instruction, then a newline and the input when there is one; ``history`` is a
  list of ``[instruction, response]`` pairs before it.

The speakers' names are read through a role map first (:meth:`RecordFormat.map_roles`): by default
the names real ShareGPT dumps give the assistant (:data:`DEFAULT_ROLE_MAP`: ``chatgpt``, ``bing``,
``bard``); a build adds its own (``--role-map NAME=ROLE``), for ShareGPT ``from`` and OpenAI ``role``
alike, and counts the turns each name gave (:func:`role_note`).

Each record becomes OpenAI messages (and a tool list), which the renderer then validates; a
record that lacks its file's keys is skipped as ``missing_<key>_key``, one with LLaVA's ``image`` /
``images`` key as ``image_conversation`` (``scripts/build_vl_dataset.py`` builds those). Each record is
read as the format its own keys fit (:func:`record_format`: a file may mix them, and the build counts
each); a file whose first record fits none of them is refused, with :func:`formats_help` listing what
each looks like.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bridge_recipes.chat.chat_template import ROLES  # what a speaker's name can be read as
from bridge_recipes.chat.errors import MalformedConversation, SftRowsError
from bridge_recipes.chat.message_text import IMAGE_KEYS, WEIGHT_KEY, check_image_record

TOOLS_KEY = "tools"  # the optional per-conversation tool list (OpenAI and ShareGPT)
# ShareGPT speaker -> OpenAI role; function_call becomes an assistant tool call
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",
    "observation": "tool",
    "tool": "tool",
}

# The names real ShareGPT dumps give the assistant: the product each conversation was shared from.
DEFAULT_ROLE_MAP = {"chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}
ROLE_NOTE_PREFIX = "role_mapped:"  # a turn note: ``role_mapped:NAME=ROLE``, one a turn read so

Convert = Callable[[dict, int], tuple[Any, Any]]


def role_note(name: str, role: str) -> str:
    """The turn note counting a turn whose speaker ``name`` was read as ``role``."""
    return f"{ROLE_NOTE_PREFIX}{name}={role}"


def role_problem(name: Any, role: Any, typed: str | None = None) -> str | None:
    """Why reading speaker ``name`` as ``role`` is refused, naming the option (``typed``: as given on the
    command line); None for a name and a role of :data:`ROLES`."""
    if isinstance(name, str) and name.strip() and role in ROLES:
        return None
    given = repr(typed) if typed is not None else f"{name}={role}"
    return (
        f"--role-map {given}: expected NAME=ROLE with ROLE one of {', '.join(ROLES)} "
        "(e.g. --role-map chatgpt=assistant)"
    )


def parse_role_map(items: list[str] | None) -> dict[str, str]:
    """``--role-map NAME=ROLE`` options as a map; SftRowsError naming the option and the fix for one that is not
    ``NAME=ROLE`` (:func:`role_problem`), or that gives a name two roles."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, role = (part.strip() for part in item.partition("="))
        if problem := role_problem(name if sep else "", role, item):
            raise SftRowsError(problem)
        if out.get(name, role) != role:
            raise SftRowsError(f"--role-map gives {name!r} two roles: {out[name]} and {role}; keep one")
        out[name] = role
    return out


@dataclass(frozen=True)
class RecordFormat:
    name: str
    required: tuple[str, ...]  # keys a record of this format must have (detection and checks)
    optional: tuple[str, ...]  # keys it may have
    shape: str  # one record's shape, for the error that lists the formats
    convert: Convert  # record -> (OpenAI messages, tool list or None)
    role_key: str | None = None  # the key naming a turn's speaker (None: the format has no speakers)

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys a build reads: the format's, and LLaVA's image keys, which mark a record it refuses."""
        return self.required + self.optional + IMAGE_KEYS

    def read(self, record: dict, index: int) -> tuple[Any, Any]:
        """The record as OpenAI messages and tools; MalformedConversation when it lacks a key."""
        for key in self.required:
            if key not in record:
                raise MalformedConversation(
                    index,
                    f"missing_{key}_key",
                    f"record has no {key!r} key and fits no other format (the file is {self.name}, from its "
                    "first record)",
                )
        check_image_record(record, index, exclude=self.required)
        return self.convert(record, index)

    def map_roles(self, record: Any, role_map: dict[str, str]) -> tuple[Any, tuple[str, ...]]:
        """``record`` with each turn's speaker named in ``role_map`` renamed to its role (a copy; the record
        as it was when none is), and the turn notes (:func:`role_note`) of the turns renamed."""
        turns = record.get(self.required[0]) if self.role_key and isinstance(record, dict) else None
        if not isinstance(turns, list):
            return record, ()
        key, notes, renamed = self.role_key, [], []
        for turn in turns:
            name = turn.get(key) if isinstance(turn, dict) else None
            if isinstance(name, str) and name in role_map and role_map[name] != name:
                notes.append(role_note(name, role_map[name]))
                turn = {**turn, key: role_map[name]}
            renamed.append(turn)
        return ({**record, self.required[0]: renamed}, tuple(notes)) if notes else (record, ())


def _openai(messages_key: str) -> Convert:
    def convert(record: dict, index: int) -> tuple[Any, Any]:
        return record[messages_key], record.get(TOOLS_KEY)

    return convert


def _tools(value: Any, index: int) -> Any:
    """A tool list, parsed when given as JSON text (ShareGPT files often store it so)."""
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except ValueError:
            raise MalformedConversation(index, "tools_not_a_list", "tools is text that is not JSON") from None
    return value


def _sharegpt_call(value: Any, index: int, j: int) -> list:
    """A function_call turn's value (a JSON object or list of them) as OpenAI tool calls."""
    try:
        calls = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        raise MalformedConversation(index, "tool_call_malformed", f"turn {j} function_call is not JSON") from None
    calls = calls if isinstance(calls, list) else [calls]
    return [{"function": c} if isinstance(c, dict) and "function" not in c else c for c in calls]


def _sharegpt(record: dict, index: int) -> tuple[Any, Any]:
    turns = record["conversations"]
    if not isinstance(turns, list):
        raise MalformedConversation(
            index, "messages_not_a_list", f"conversations is {type(turns).__name__}, not a list"
        )
    messages: list[dict[str, Any]] = []
    system = record.get("system")
    if system is not None and not isinstance(system, str):
        raise MalformedConversation(
            index,
            "system_not_a_string",
            f"system is {type(system).__name__}, not a string: the conversation would train without its system "
            "prompt; give the system prompt as text",
        )
    if system:
        messages.append({"role": "system", "content": system})
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise MalformedConversation(index, "message_not_an_object", f"turn {j} is {type(turn).__name__}")
        if "from" not in turn or "value" not in turn:
            raise MalformedConversation(index, "missing_role_or_content", f"turn {j} lacks 'from' or 'value'")
        speaker = turn["from"]
        if speaker not in SHAREGPT_ROLES:
            raise MalformedConversation(
                index,
                "unknown_role",
                f"turn {j} is from {speaker!r} (expected one of {tuple(SHAREGPT_ROLES)}; --role-map "
                f"{speaker}=ROLE reads it as a role)",
            )
        if speaker == "function_call":
            messages.append(
                {"role": "assistant", "content": None, "tool_calls": _sharegpt_call(turn["value"], index, j)}
            )
        else:
            messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn["value"]})
        if WEIGHT_KEY in turn:  # the per-turn training marker some ShareGPT files carry, as OpenAI's
            messages[-1][WEIGHT_KEY] = turn[WEIGHT_KEY]
    return messages, _tools(record.get(TOOLS_KEY), index)


def _text(record: dict, key: str, index: int) -> str:
    value = record.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedConversation(index, "content_not_a_string", f"{key} is {type(value).__name__}, not a string")
    return value


def _alpaca(record: dict, index: int) -> tuple[Any, Any]:
    messages: list[dict[str, Any]] = []
    if system := _text(record, "system", index):
        messages.append({"role": "system", "content": system})
    history = record.get("history") or []
    if not isinstance(history, list) or not all(isinstance(p, list | tuple) and len(p) == 2 for p in history):
        raise MalformedConversation(
            index, "history_malformed", "history is not a list of [instruction, response] pairs"
        )
    for question, answer in history:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    instruction, given = _text(record, "instruction", index), _text(record, "input", index)
    if not (instruction.strip() or given.strip()):  # the reply would answer an empty user turn
        raise MalformedConversation(
            index, "alpaca_empty_prompt", "instruction and input are both empty: the output answers no prompt"
        )
    prompt = f"{instruction}\n{given}" if instruction and given else instruction or given
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": _text(record, "output", index)}]
    return messages, None


def formats(messages_key: str = "messages") -> tuple[RecordFormat, ...]:
    """The formats in detection order (the first whose required keys a record has wins)."""
    return (
        RecordFormat(
            "openai",
            (messages_key,),
            (TOOLS_KEY,),
            f'{{"{messages_key}": [{{"role": "user", "content": "..."}}, {{"role": "assistant", "content": "..."}}]}}',
            _openai(messages_key),
            role_key="role",
        ),
        RecordFormat(
            "sharegpt",
            ("conversations",),
            ("system", TOOLS_KEY),
            '{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}',
            _sharegpt,
            role_key="from",
        ),
        RecordFormat(
            "alpaca",
            ("instruction", "output"),
            ("input", "system", "history"),
            '{"instruction": "...", "input": "...", "output": "..."}',
            _alpaca,
        ),
    )


def detect(keys: Any, messages_key: str = "messages") -> RecordFormat | None:
    """The format of a record (or Parquet file) with these keys (column names), or None."""
    return next((f for f in formats(messages_key) if all(k in keys for k in f.required)), None)


def record_format(record: dict, first: RecordFormat, messages_key: str = "messages") -> RecordFormat:
    """The format of one record of a file: its own when its keys (those not null) fit one, so a file may
    mix formats; else the file's first record's (``first``), whose reading then names the missing key."""
    return detect([k for k, v in record.items() if v is not None], messages_key) or first


def formats_help(messages_key: str = "messages") -> str:
    """What each format's record looks like, for the error naming a file that fits none."""
    lines = [f"  {f.name}: {f.shape}" for f in formats(messages_key)]
    return "accepted formats (one record each; docs/sft_data.md):\n" + "\n".join(lines)
