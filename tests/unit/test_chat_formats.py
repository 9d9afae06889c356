"""SFT rows from ShareGPT, Alpaca and OpenAI records (with the developer role): each format,
read per record, gives the rows of the OpenAI conversation it stands for; a file of no known
format is refused listing the formats; a build without rows says why, naming no manifest."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge_recipes.chat.conversations import SftRowsError
from bridge_recipes.data.sft_rows import build_sft_rows

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"city": {"type": "string"}}}}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}

SHAREGPT = {
    "system": "You are helpful.",
    "tools": json.dumps(TOOLS),
    "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": json.dumps(CALL)},
        {"from": "observation", "value": "sunny"},
        {"from": "gpt", "value": "It is sunny."},
    ],
}
SHAREGPT_AS_OPENAI = {
    "tools": TOOLS,
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": CALL}]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ],
}
ALPACA = {
    "system": "You translate.",
    "history": [["Translate: yes", "oui"]],
    "instruction": "Translate to French.",
    "input": "Good morning",
    "output": "Bonjour",
}
ALPACA_AS_OPENAI = {
    "messages": [
        {"role": "system", "content": "You translate."},
        {"role": "user", "content": "Translate: yes"},
        {"role": "assistant", "content": "oui"},
        {"role": "user", "content": "Translate to French.\nGood morning"},
        {"role": "assistant", "content": "Bonjour"},
    ]
}
DEVELOPER = {"messages": [{"role": "developer", "content": "Be brief."}, *ALPACA_AS_OPENAI["messages"][1:]]}
DEVELOPER_AS_SYSTEM = {"messages": [{"role": "system", "content": "Be brief."}, *ALPACA_AS_OPENAI["messages"][1:]]}


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _build(src: Path, out: Path) -> dict:
    return build_sft_rows(src, TOKENIZER, out, row_tokens=256, progress=False)


@pytest.mark.parametrize(
    "record,equivalent,fmt",
    [
        (SHAREGPT, SHAREGPT_AS_OPENAI, "sharegpt"),
        (ALPACA, ALPACA_AS_OPENAI, "alpaca"),
        (DEVELOPER, DEVELOPER_AS_SYSTEM, "openai"),
    ],
)
def test_each_format_gives_the_rows_of_its_openai_conversation(tmp_path, record, equivalent, fmt):
    got = _build(_jsonl(tmp_path / "in.jsonl", [record] * 3), tmp_path / "a")
    want = _build(_jsonl(tmp_path / "want.jsonl", [equivalent] * 3), tmp_path / "b")
    assert got["conversations"]["used"] == 3 and got["record_format"] == fmt
    assert got["rows_sha256"] == want["rows_sha256"]


def test_alpaca_without_input_or_system_is_one_user_turn(tmp_path):
    got = _build(_jsonl(tmp_path / "in.jsonl", [{"instruction": "Name a prime.", "output": "7"}]), tmp_path / "a")
    plain = {"messages": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"}]}
    assert got["rows_sha256"] == _build(_jsonl(tmp_path / "w.jsonl", [plain]), tmp_path / "b")["rows_sha256"]


def test_each_record_is_read_as_its_own_format_and_bad_ones_are_skipped_by_reason(tmp_path):
    records = [SHAREGPT, SHAREGPT_AS_OPENAI, {"conversations": [{"from": "robot", "value": "x"}]}, {"text": "x"}]
    m = _build(_jsonl(tmp_path / "in.jsonl", records), tmp_path / "a")
    assert m["conversations"]["skipped"] == {"missing_conversations_key": 1, "unknown_role": 1}
    assert m["conversations"]["record_formats"] == {"openai": 1, "sharegpt": 1}


def test_parquet_format_comes_from_its_columns(tmp_path):
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([ALPACA] * 3), parquet)
    got = _build(parquet, tmp_path / "a")
    assert got["record_format"] == "alpaca"
    assert (
        got["rows_sha256"]
        == _build(_jsonl(tmp_path / "w.jsonl", [ALPACA_AS_OPENAI] * 3), tmp_path / "b")["rows_sha256"]
    )


def test_a_file_of_no_known_format_is_refused_listing_the_formats(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", [{"prompt": "x", "completion": "y"}])
    with pytest.raises(SftRowsError) as err:
        _build(src, tmp_path / "out")
    assert all(name in str(err.value) for name in ("prompt", "openai", "sharegpt", "alpaca"))
    assert not (tmp_path / "out").exists()


def test_a_build_without_rows_gives_the_skip_reasons_and_names_no_manifest(tmp_path, caplog):
    src = _jsonl(tmp_path / "in.jsonl", [{"messages": [{"role": "user", "content": "no answer"}]}] * 30)
    with pytest.raises(SftRowsError) as err:
        _build(src, tmp_path / "out")
    assert "30 no_assistant_turn" in str(err.value)
    assert "manifest" not in str(err.value) + caplog.text and not (tmp_path / "out").exists()


def test_the_records_docs_sft_data_shows_build_as_their_formats(tmp_path):
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "sft_data.md").read_text()
    records = [json.loads(block) for block in re.findall(r"```json\n(.*?)\n```", doc, re.DOTALL)]
    formats = []
    for i, record in enumerate(records):
        m = _build(_jsonl(tmp_path / f"{i}.jsonl", [record]), tmp_path / f"out{i}")
        assert m["conversations"]["used"] == 1
        formats.append(m["record_format"])
    assert formats == ["openai", "sharegpt", "alpaca"]
