"""Data that would train the wrong thing without a word: a file mixing record formats, assistant
turns marked not to be trained (``weight`` 0), repeated conversations, a ShareGPT system prompt that
is not text, reasoning on a user turn, odd turn orders, most tokens left out as too long, files in
another encoding, a validation fraction that leaves nothing to train, more workers than cores. Each
is read right and counted, or refused naming the record (by its line, from 1) and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bridge_recipes.chat.conversations import SftRowsError
from bridge_recipes.data.sft_rows import build_sft_rows

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "tests/fixtures/qwen35_chat_tokenizer"
CHATML = ROOT / "tests/fixtures/chatml_tokenizer.json"
ROW = 256


def conv(i: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"what is {i} plus {i}?"},
            {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
        ]
    }


SHAREGPT = {"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi, what now?"}]}


def jsonl(path: Path, records, blank_after: int | None = None) -> Path:
    lines = [json.dumps(r) + "\n" for r in records]
    if blank_after is not None:
        lines.insert(blank_after, "\n")
    path.write_text("".join(lines))
    return path


def build(tmp_path: Path, records, name: str = "out", tokenizer=CHATML, **kw) -> dict:
    src = jsonl(tmp_path / f"{name}.jsonl", records)
    kw = {"row_tokens": ROW, "progress": False, "chat_format": "chatml" if tokenizer == CHATML else "template", **kw}
    return build_sft_rows(src, tokenizer, tmp_path / name, **kw)


def supervised_text(folder: Path, tokenizer) -> str:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer if tokenizer == CHATML else tokenizer / "tokenizer.json"))
    table = pq.read_table(folder / "rows.parquet")
    ids = np.concatenate(table.column("input_ids").to_pylist())
    mask = np.concatenate(table.column("loss_mask").to_pylist()).astype(bool)
    return tok.decode(ids[mask].tolist(), skip_special_tokens=False)


# ----------------------------------------------------------------- record formats, per record


def test_a_file_mixing_formats_is_read_per_record_and_counted(tmp_path):
    m = build(tmp_path, [SHAREGPT] + [conv(i) for i in range(40)])
    c = m["conversations"]
    assert c["used"] == 41 and c["skipped_total"] == 0
    assert c["record_formats"] == {"openai": 40, "sharegpt": 1}


def test_a_parquet_file_with_the_columns_of_two_formats_is_read_per_row(tmp_path):
    import pyarrow as pa

    rows = [{"messages": conv(i)["messages"], "conversations": None} for i in range(10)]
    rows.append({"messages": None, "conversations": SHAREGPT["conversations"]})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    m = build_sft_rows(tmp_path / "in.parquet", CHATML, tmp_path / "o", row_tokens=ROW, chat_format="chatml")
    assert m["conversations"]["record_formats"] == {"openai": 10, "sharegpt": 1}


# ----------------------------------------------------------------- weight 0: not trained


WEIGHTED = {
    "messages": [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "a reply we do not want", "weight": 0},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "the reply to learn", "weight": 1},
    ]
}


@pytest.mark.parametrize("tokenizer", [CHATML, TEMPLATE], ids=["chatml", "template"])
def test_an_assistant_turn_with_weight_0_is_context_not_target(tmp_path, tokenizer):
    m = build(tmp_path, [WEIGHTED] * 4, tokenizer=tokenizer, packing="one_per_row")
    trained = supervised_text(tmp_path / "out", tokenizer)
    assert "the reply to learn" in trained and "do not want" not in trained
    assert m["conversations"]["notes"]["assistant_turns_with_weight_0"] == 4
    # the untrained reply is still in the rows, as the context of the second question
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer if tokenizer == CHATML else tokenizer / "tokenizer.json"))
    ids = pq.read_table(tmp_path / "out" / "rows.parquet").column("input_ids").to_pylist()[0]
    assert "do not want" in tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize(
    "weight,reason", [(2, "weight_not_0_or_1"), ("0", "weight_not_0_or_1"), (0.5, "weight_not_0_or_1")]
)
def test_a_weight_other_than_0_or_1_is_skipped_by_reason(tmp_path, weight, reason):
    bad = json.loads(json.dumps(WEIGHTED))
    bad["messages"][3]["weight"] = weight
    m = build(tmp_path, [conv(i) for i in range(10)] + [bad])
    assert m["conversations"]["skipped"] == {reason: 1}


def test_a_conversation_with_every_reply_at_weight_0_is_skipped(tmp_path):
    bad = json.loads(json.dumps(WEIGHTED))
    bad["messages"][3]["weight"] = 0
    m = build(tmp_path, [conv(i) for i in range(10)] + [bad])
    assert m["conversations"]["skipped"] == {"no_trained_turn": 1}


# ----------------------------------------------------------------- duplicates


def test_repeated_conversations_are_counted_and_removed_on_request(tmp_path):
    records = [conv(i) for i in range(10)] + [conv(99)] * 20
    kept = build(tmp_path, records, "kept")
    assert kept["conversations"]["duplicates"] == 19 and kept["conversations"]["used"] == 30
    once = build(tmp_path, records, "once", dedupe=True)
    assert once["conversations"]["used"] == 11 and once["conversations"]["skipped"] == {"duplicate_conversation": 19}
    assert once["conversations"]["duplicates"] == 19 and once["dedupe"] is True


# ----------------------------------------------------------------- turns the data gets wrong


def test_a_sharegpt_system_that_is_not_text_is_skipped_naming_its_line(tmp_path):
    bad = {**SHAREGPT, "system": ["you are", "helpful"]}
    m = build(tmp_path, [SHAREGPT] * 6 + [bad])
    assert m["conversations"]["skipped"] == {"system_not_a_string": 1}
    assert m["conversations"]["skipped_examples"][0].startswith("line 7:")


@pytest.mark.parametrize("tokenizer", [CHATML, TEMPLATE], ids=["chatml", "template"])
def test_reasoning_on_a_user_turn_is_not_dropped_silently(tmp_path, tokenizer):
    bad = conv(5)
    bad["messages"][0]["reasoning_content"] = "the user thinks aloud"
    m = build(tmp_path, [conv(i) for i in range(8)] + [bad], tokenizer=tokenizer)
    assert m["conversations"]["skipped"] == {"reasoning_on_a_user_turn": 1}


def test_odd_turn_orders_are_kept_and_counted(tmp_path):
    user, reply = {"role": "user", "content": "q"}, {"role": "assistant", "content": "an answer"}
    records = [
        {"messages": [{"role": "user", "content": "  \n\t"}, reply]},
        {"messages": [user, {"role": "user", "content": "and also"}, reply]},
        {"messages": [user, reply, {"role": "user", "content": "anyone?"}]},
    ]
    m = build(tmp_path, [conv(i) for i in range(8)] + records)
    assert m["conversations"]["used"] == 11
    assert m["conversations"]["notes"] == {
        "blank_user_turns": 1,
        "ending_on_a_user_turn": 1,
        "user_turns_in_a_row": 1,
    }


# ----------------------------------------------------------------- line numbers, encodings


def test_skipped_records_are_named_by_their_line_from_1_blank_lines_counted(tmp_path):
    records = [conv(i) for i in range(6)] + [{"messages": "not a list"}]
    src = jsonl(tmp_path / "in.jsonl", records, blank_after=2)  # line 3 is blank: the bad record is on line 8
    m = build_sft_rows(src, CHATML, tmp_path / "o", row_tokens=ROW, chat_format="chatml", progress=False)
    assert (
        m["conversations"]["skipped_examples"]
        == [e for e in m["conversations"]["skipped_examples"] if e.startswith("line 8:")]
        and m["conversations"]["skipped_total"] == 1
    )


@pytest.mark.parametrize("encoding,named", [("utf-16", "UTF-16"), ("utf-16-be", "not UTF-8"), ("latin-1", "Latin-1")])
def test_a_file_in_another_encoding_is_refused_naming_it(tmp_path, encoding, named):
    text = "".join(json.dumps({**conv(i), "note": "café"}, ensure_ascii=False) + "\n" for i in range(5))
    src = tmp_path / "in.jsonl"
    src.write_bytes(text.encode(encoding))
    with pytest.raises(SftRowsError) as err:
        build_sft_rows(src, CHATML, tmp_path / "o", row_tokens=ROW, chat_format="chatml", progress=False)
    assert named in str(err.value) and "UTF-8" in str(err.value) and "iconv" in str(err.value)
    assert not (tmp_path / "o").exists()


def test_a_latin_1_line_further_down_is_skipped_naming_the_encoding(tmp_path):
    src = jsonl(tmp_path / "in.jsonl", [conv(i) for i in range(6)])
    with open(src, "ab") as f:
        f.write(json.dumps({**conv(7), "note": "café"}, ensure_ascii=False).encode("latin-1") + b"\n")
    m = build_sft_rows(src, CHATML, tmp_path / "o", row_tokens=ROW, chat_format="chatml", progress=False)
    assert m["conversations"]["skipped"] == {"not_utf8": 1}
    assert (
        "line 7:" in m["conversations"]["skipped_examples"][0]
        and "Latin-1" in m["conversations"]["skipped_examples"][0]
    )


# ----------------------------------------------------------------- tokens left out as too long


def long_conv(words: int) -> dict:
    return {"messages": [{"role": "user", "content": "word " * words}, {"role": "assistant", "content": "ok"}]}


def test_leaving_out_most_tokens_stops_the_build_and_names_the_share(tmp_path):
    records = [conv(i) for i in range(20)] + [long_conv(800)] * 5
    with pytest.raises(SftRowsError, match=r"--max-dropped-share") as err:
        build(tmp_path, records)
    assert "%" in str(err.value) and "--long split" in str(err.value)
    assert not (tmp_path / "out").exists()
    m = build(tmp_path, records, max_dropped_share=1.0)
    assert m["long_conversations"]["dropped_share"] > 0.5


def test_the_share_counts_conversations_skipped_unread_for_their_size(tmp_path):
    """A conversation of more bytes than a row could hold is skipped before tokenizing; the share
    still counts its tokens (estimated), so it reads no better than it is."""
    records = [conv(i) for i in range(40)] + [long_conv(ROW * 20)]  # ~100 kB: over ROW x 64 bytes
    m = build(tmp_path, records, max_dropped_share=1.0)
    lc = m["long_conversations"]
    assert lc["skipped_unread"]["conversations"] == 1 and lc["longer_than_row"] == 0
    assert lc["skipped_unread"]["tokens_estimated"] > ROW
    assert lc["dropped_share"] > 0.5  # the one long conversation holds most of the tokens
    with pytest.raises(SftRowsError, match="skipped unread"):
        build(tmp_path, records, "again")


def test_the_build_command_exits_non_zero_and_writes_nothing_above_the_share(tmp_path):
    src = jsonl(tmp_path / "in.jsonl", [conv(i) for i in range(20)] + [long_conv(800)] * 5)
    cmd = [sys.executable, str(ROOT / "scripts/build_sft_rows.py"), "--input", str(src), "--tokenizer", str(CHATML)]
    cmd += ["--chat-format", "chatml", "--row-tokens", str(ROW), "--out", str(tmp_path / "o"), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "--max-dropped-share" in p.stderr
    assert not (tmp_path / "o").exists()
    ok = subprocess.run([*cmd, "--max-dropped-share", "1"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "left out" in ok.stdout, ok.stderr


# ----------------------------------------------------------------- settings


def test_a_validation_fraction_that_leaves_nothing_to_train_says_so(tmp_path):
    with pytest.raises(SftRowsError, match=r"--val-fraction 0.999 .*leaving none to train on"):
        build(tmp_path, [conv(i) for i in range(41)], val_fraction=0.999)


def test_more_workers_than_cores_run_as_many_as_cores(tmp_path):
    cores = len(os.sched_getaffinity(0))
    src = jsonl(tmp_path / "in.jsonl", [conv(i) for i in range(20)])
    cmd = [sys.executable, str(ROOT / "scripts/build_sft_rows.py"), "--input", str(src), "--tokenizer", str(CHATML)]
    cmd += ["--chat-format", "chatml", "--row-tokens", str(ROW), "--out", str(tmp_path / "o"), "--no-progress"]
    p = subprocess.run([*cmd, "--workers", str(cores + 1000)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"--workers {cores + 1000}" in p.stderr and f"using {cores}" in p.stderr


def test_a_home_relative_input_is_read_from_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    jsonl(tmp_path / "in.jsonl", [conv(i) for i in range(10)])
    m = build_sft_rows("~/in.jsonl", CHATML, tmp_path / "o", row_tokens=ROW, chat_format="chatml", progress=False)
    assert m["conversations"]["used"] == 10


# ----------------------------------------------------------------- vision-language


@pytest.mark.parametrize(
    "reply",
    [
        [{"type": "text", "text": "here it is"}, {"type": "image", "image": "x.png"}],
        "here it is\n<image>",
    ],
)
def test_an_image_in_a_vl_assistant_reply_is_skipped_by_its_reason(tmp_path, reply):
    from bridge_recipes.chat.errors import MalformedConversation
    from bridge_recipes.vl.vl_conversations import parse_record

    record = {
        "messages": [{"role": "user", "content": "draw a cat"}, {"role": "assistant", "content": reply}],
        **({"images": ["x.png"]} if isinstance(reply, str) else {}),
    }
    with pytest.raises(MalformedConversation) as err:
        parse_record(record, 4, tmp_path)
    assert err.value.reason == "image_in_assistant_reply" and err.value.at("line 5").startswith("line 5: message 1")


def test_a_vl_toy_with_a_tokenizer_json_says_it_has_no_image_processor_and_the_vl_builder_names_the_fix(
    tmp_path, capsys
):
    from bridge_recipes.hf.cli import main
    from bridge_recipes.vl.vl_processor import VlDatasetError, load_processor

    code = main(["toy", "--vl", "--tokenizer-json", str(CHATML), "--out", str(tmp_path / "toy")])
    err = capsys.readouterr().err
    assert code == 0 and "no image processor" in err and "without --tokenizer-json" in err
    with pytest.raises(VlDatasetError, match="preprocessor_config.json") as raised:
        load_processor(tmp_path / "toy")
    assert "without" in str(raised.value)
