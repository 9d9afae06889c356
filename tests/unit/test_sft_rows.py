"""Packed SFT rows: chat rendering and mask, packing, hashes, malformed input, CLI (offline).

A byte-level BPE tokenizer is trained in memory on a tiny corpus, with the Qwen special tokens
added, so rendering is lossless and every check can decode what it asserts about.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from bridge_recipes.chat.chat_render import chat_format, render_conversation, validate_conversation
from bridge_recipes.chat.conversations import source_kind
from bridge_recipes.chat.errors import MalformedConversation, SftRowsError
from bridge_recipes.data.integrity import parquet_rows_sha256
from bridge_recipes.data.packing import RowPacker
from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.vl.byte_bpe import train_byte_bpe

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "scripts" / "build_sft_rows.py"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = "the a model learns to answer questions about data rows tokens and masks with care quickly".split()
ROW = 64  # small rows so a few dozen conversations make several of them


def train_tokenizer(specials: list[str]) -> Tokenizer:
    return train_byte_bpe([" ".join(WORDS), "system\nuser\nassistant\n"] * 20, specials, vocab_size=300)


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    return train_tokenizer(SPECIALS)


@pytest.fixture(scope="session")
def tokenizer_file(tok, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def make_conversations(n: int = 40, seed: int = 0) -> list[list[dict]]:
    """Short user turns and longer replies, so every 64-token row holds a supervised token."""
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        msgs = [{"role": "system", "content": sentence(rng, 1, 4)}] if i % 3 == 0 else []
        for _ in range(rng.randint(1, 2)):
            msgs.append({"role": "user", "content": sentence(rng, 1, 5)})
            msgs.append({"role": "assistant", "content": sentence(rng, 3, 15)})
        convs.append(msgs)
    return convs


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def read_rows(out: Path) -> tuple[list[list[int]], list[list[int]]]:
    table = pq.read_table(out / "rows.parquet")
    return table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()


def permuted_stream(tok, convs, seed: int, eos_id: int):
    """The token stream the builder should cut: permuted conversations joined by EOS."""
    ids, mask, starts = [], [], []
    for k, i in enumerate(np.random.default_rng(seed).permutation(len(convs))):
        if k:
            ids.append(eos_id)
            mask.append(0)
        starts.append(len(ids))
        a, m = render_conversation(tok, convs[i])
        ids += a.tolist()
        mask += m.tolist()
    return ids, mask, starts


def build(src: Path, tokenizer_file: Path, out: Path, **kw) -> dict:
    """The plain-ChatML, EOS-joined build (the benchmark workload's layout) these tests pin down."""
    kw = {"row_tokens": ROW, "chat_format": "chatml", "packing": "eos_joined", **kw}
    return build_sft_rows(src, tokenizer_file, out, progress=False, **kw)


def mask_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of every run of 1s."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


# ------------------------------------------------------------------- render and mask


CONV = [
    {"role": "system", "content": "answer with care"},
    {"role": "user", "content": "the data rows"},
    {"role": "assistant", "content": "tokens and masks"},
    {"role": "user", "content": "quickly"},
    {"role": "assistant", "content": "a model learns"},
]


def test_render_is_the_qwen_chat_format(tok):
    ids, mask = render_conversation(tok, CONV)
    assert ids.dtype == np.int32 and mask.dtype == np.uint8 and len(ids) == len(mask)
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in CONV)
    assert tok.decode(ids.tolist(), skip_special_tokens=False) == expected


def test_mask_covers_assistant_content_and_its_im_end_only(tok):
    ids, mask = render_conversation(tok, CONV)
    runs = [tok.decode(ids[a:b].tolist(), skip_special_tokens=False) for a, b in mask_runs(mask)]
    assert runs == ["tokens and masks<|im_end|>", "a model learns<|im_end|>"]  # no header, no "\n"
    im_end = tok.token_to_id("<|im_end|>")
    assert [int(mask[i]) for i in np.flatnonzero(ids == im_end)] == [0, 0, 1, 0, 1]  # system, user, asst, user, asst
    assert not mask[ids == tok.token_to_id("<|im_start|>")].any()
    n_content = sum(
        len(tok.encode(m["content"], add_special_tokens=False).ids) for m in CONV if m["role"] == "assistant"
    )
    assert int(mask.sum()) == n_content + 2


def test_hf_fast_tokenizer_renders_the_same(tok):
    from transformers import PreTrainedTokenizerFast

    a_ids, a_mask = render_conversation(tok, CONV)
    b_ids, b_mask = render_conversation(PreTrainedTokenizerFast(tokenizer_object=tok), CONV)
    assert a_ids.tolist() == b_ids.tolist() and a_mask.tolist() == b_mask.tolist()


@pytest.mark.parametrize(
    "messages, reason, detail",
    [
        ("hello", "messages_not_a_list", "messages is str, not a list"),
        ([], "empty_conversation", "empty list"),
        ([{"role": "user", "content": "hi"}, "oops"], "message_not_an_object", "message 1 is str"),
        ([{"role": "user"}], "missing_role_or_content", "message 0 has no 'content'"),
        ([{"content": "hi"}], "missing_role_or_content", "message 0 has no 'role'"),
        (
            [{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}],
            "unknown_role",
            "message 1 has unknown role 'bot'",
        ),
        ([{"role": "assistant", "content": 5}], "content_not_a_string", "message 0 content is int"),
        ([{"role": "user", "content": "hi"}], "no_assistant_turn", "no assistant turn"),
    ],
)
def test_malformed_conversation_names_row_and_reason(messages, reason, detail):
    with pytest.raises(MalformedConversation) as err:
        validate_conversation(messages, index=17)
    assert err.value.reason == reason and err.value.index == 17
    assert str(err.value).startswith("source row 17: ") and detail in str(err.value)


def test_tokenizer_without_chat_tokens_is_refused():
    with pytest.raises(SftRowsError, match=r"lacks the token\(s\) <\|im_start\|>, <\|im_end\|>"):
        chat_format(train_tokenizer(["<|endoftext|>"]))


# ------------------------------------------------------------------------------ packing


def test_packer_cuts_exact_rows_with_eos_between_conversations_only():
    packer = RowPacker(row_tokens=4, eos_id=99)
    assert packer.add(np.array([1, 2, 3]), np.array([0, 1, 1])) == []  # 3 pending, no EOS before the first
    rows = packer.add(np.array([4, 5, 6, 7, 8, 9]), np.array([1, 0, 0, 0, 0, 1]))
    assert [r[0].tolist() for r in rows] == [[1, 2, 3, 99], [4, 5, 6, 7]]
    assert [r[1].tolist() for r in rows] == [[0, 1, 1, 0], [1, 0, 0, 0]]
    assert packer.pending_tokens == 2 and packer.stream_tokens == 10
    supervised = RowPacker(row_tokens=4, eos_id=99, supervise_eos=True)
    supervised.add(np.array([1]), np.array([0]))
    assert supervised.add(np.array([2, 3]), np.array([0, 0]))[0][1].tolist() == [0, 1, 0, 0]


def test_rows_are_the_permuted_stream_cut_into_fixed_rows(tok, tokenizer_file, tmp_path):
    convs = make_conversations()
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in convs])
    m = build(src, tokenizer_file, tmp_path / "out")
    ids, mask = read_rows(tmp_path / "out")

    eos = tok.token_to_id("<|endoftext|>")
    s_ids, s_mask, starts = permuted_stream(tok, convs, 42, eos)
    assert m["rows_skipped_without_targets"] == 0  # so the rows are the whole prefix
    assert m["rows"] == len(ids) == len(s_ids) // ROW >= 5
    assert all(len(r) == ROW for r in ids) and all(len(r) == ROW for r in mask)
    flat_ids, flat_mask = sum(ids, []), sum(mask, [])
    assert flat_ids == s_ids[: len(flat_ids)] and flat_mask == s_mask[: len(flat_mask)]
    assert m["tail_tokens_dropped"] == len(s_ids) - len(flat_ids) < ROW
    assert m["padding_tokens"] == 0 and m["stream_tokens"] == len(s_ids)
    assert m["supervised_tokens"] == sum(flat_mask)
    assert m["supervised_ratio"] == pytest.approx(sum(flat_mask) / len(flat_ids), abs=1e-6)
    assert m["conversations"]["used"] == m["conversations"]["read"] == len(convs)

    schema = pq.read_schema(tmp_path / "out" / "rows.parquet")
    assert schema.field("input_ids").type == pa.list_(pa.int32())
    assert schema.field("loss_mask").type == pa.list_(pa.uint8())


def test_eos_sits_between_conversations_and_is_not_supervised(tok, tokenizer_file, tmp_path):
    convs = make_conversations()
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in convs])
    build(src, tokenizer_file, tmp_path / "out")
    ids, mask = read_rows(tmp_path / "out")
    flat_ids, flat_mask = np.array(sum(ids, [])), np.array(sum(mask, []))

    eos = tok.token_to_id("<|endoftext|>")
    _, _, starts = permuted_stream(tok, convs, 42, eos)
    separators = [s - 1 for s in starts[1:] if s - 1 < len(flat_ids)]
    assert np.flatnonzero(flat_ids == eos).tolist() == separators
    assert not flat_mask[separators].any()
    assert flat_ids[0] == tok.token_to_id("<|im_start|>")  # no EOS before the first conversation
    # every conversation starts right after its EOS with <|im_start|>system|user
    assert all(flat_ids[s] == tok.token_to_id("<|im_start|>") for s in starts if s < len(flat_ids))


def test_rows_without_targets_are_skipped_and_counted(tok, tokenizer_file, tmp_path):
    rng = random.Random(1)
    long_user = [{"role": "user", "content": sentence(rng, 400, 400)}, {"role": "assistant", "content": "ok"}]
    convs = [long_user] + make_conversations(10)
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in convs])
    m = build(src, tokenizer_file, tmp_path / "out")
    _, mask = read_rows(tmp_path / "out")

    user_tokens = len(tok.encode(long_user[0]["content"], add_special_tokens=False).ids)
    assert m["rows_skipped_without_targets"] >= user_tokens // ROW - 1 >= 5
    assert all(sum(r) > 0 for r in mask) and len(mask) == m["rows"]
    assert (m["rows"] + m["rows_skipped_without_targets"]) * ROW + m["tail_tokens_dropped"] == m["stream_tokens"]


def test_max_rows_stops_after_a_prefix_of_the_full_build(tokenizer_file, tmp_path):
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in make_conversations()])
    build(src, tokenizer_file, tmp_path / "full")
    m = build(src, tokenizer_file, tmp_path / "short", max_rows=3)
    assert m["rows"] == 3 and m["stopped_at_max_rows"]
    assert m["conversations"]["read"] < m["conversations"]["indexed"]
    full_ids, full_mask = read_rows(tmp_path / "full")
    assert read_rows(tmp_path / "short") == (full_ids[:3], full_mask[:3])


# ------------------------------------------------------------------------------- hashes


def independent_rows_sha256(parquet: Path) -> str:
    """rows_sha256 as the manifest defines it, computed without the library."""
    h = hashlib.sha256()
    table = pq.read_table(parquet)
    for ids, mask in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()):
        h.update(np.array(ids, dtype="<i4").tobytes() + np.array(mask, dtype=np.uint8).tobytes())
    return h.hexdigest()


def test_hashes_are_reproducible_and_change_with_the_seed(tokenizer_file, tmp_path):
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in make_conversations()])
    a = build(src, tokenizer_file, tmp_path / "a")
    b = build(src, tokenizer_file, tmp_path / "b")
    c = build(src, tokenizer_file, tmp_path / "c", seed=7)
    assert a["rows_sha256"] == b["rows_sha256"] and a["parquet_sha256"] == b["parquet_sha256"]
    assert c["rows_sha256"] != a["rows_sha256"] and c["parquet_sha256"] != a["parquet_sha256"]

    parquet = tmp_path / "a" / "rows.parquet"
    assert a["rows_sha256"] == independent_rows_sha256(parquet) == parquet_rows_sha256(parquet)
    assert a["parquet_sha256"] == hashlib.sha256(parquet.read_bytes()).hexdigest()
    assert a["parquet_bytes"] == parquet.stat().st_size
    assert a["tokenizer_sha256"] == hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()
    assert a["source_sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert json.loads((tmp_path / "a" / "manifest.json").read_text()) == a
    assert (a["seed"], c["seed"], a["row_tokens"]) == (42, 7, ROW)


def test_read_window_does_not_change_the_rows(tokenizer_file, tmp_path):
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in make_conversations()])
    default = build(src, tokenizer_file, tmp_path / "a")
    windowed = build(src, tokenizer_file, tmp_path / "b", read_window=3, rows_per_batch=2)
    assert windowed["rows_sha256"] == default["rows_sha256"]


# -------------------------------------------------------------------- inputs and errors


def test_malformed_rows_are_reported_with_their_index_and_counted(tokenizer_file, tmp_path, caplog):
    good = [{"messages": c} for c in make_conversations(12)]
    bad = {
        2: "{not json",
        4: {"messages": "hello"},
        5: {"text": "no messages key"},
        7: {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]},
        8: {"messages": [{"role": "bot", "content": "hi"}, {"role": "assistant", "content": "x"}]},
        10: {"messages": [{"role": "user", "content": ["a", "b"]}, {"role": "assistant", "content": "x"}]},
        11: {"messages": [{"role": "user", "content": "only a question"}]},
    }
    records = [bad.get(i) or good.pop() for i in range(len(bad) + len(good))]
    src = write_jsonl(tmp_path / "convs.jsonl", records + [""])  # a trailing blank line is no conversation

    with caplog.at_level(logging.WARNING, logger="bridge_recipes.data.split_packing"):
        m = build(src, tokenizer_file, tmp_path / "out")
    conv = m["conversations"]
    assert conv["skipped"] == {
        "content_not_a_string": 1,
        "invalid_json": 1,
        "messages_not_a_list": 1,
        "missing_messages_key": 1,
        "missing_role_or_content": 1,
        "no_assistant_turn": 1,
        "unknown_role": 1,
    }
    assert conv["indexed"] == conv["read"] == len(records) and conv["used"] == len(records) - len(bad)
    assert conv["skipped_total"] == len(bad) and conv["blank_lines"] == 1
    for index in bad:  # named by line number, from 1 as an editor counts them
        assert any(f"line {index + 1}:" in r.getMessage() for r in caplog.records)
        assert any(e.startswith(f"line {index + 1}:") for e in conv["skipped_examples"])
    assert re.search(r"message 0\b.*unknown role 'bot'", caplog.text)


def test_parquet_input_gives_the_same_rows_as_jsonl(tokenizer_file, tmp_path):
    convs = make_conversations()
    jsonl = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in convs])
    parquet = tmp_path / "convs.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": c} for c in convs]), parquet, row_group_size=7)
    assert pq.ParquetFile(parquet).num_row_groups > 1

    from_jsonl = build(jsonl, tokenizer_file, tmp_path / "j")
    # a one-byte cache and tiny windows force row-group re-reads and evictions
    from_parquet = build(parquet, tokenizer_file, tmp_path / "p", read_window=5, parquet_cache_bytes=1)
    assert from_parquet["source_format"] == "parquet"
    assert from_parquet["rows_sha256"] == from_jsonl["rows_sha256"]
    assert from_parquet["conversations"]["used"] == len(convs)


def test_parquet_without_messages_column_is_refused(tokenizer_file, tmp_path):
    parquet = tmp_path / "convs.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), parquet)
    with pytest.raises(SftRowsError, match="columns text, which fit no accepted conversation format"):
        build(parquet, tokenizer_file, tmp_path / "out")


def test_failed_build_leaves_nothing_behind(tokenizer_file, tmp_path):
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": "not a list"}] * 3)
    with pytest.raises(SftRowsError, match="no rows built"):
        build(src, tokenizer_file, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SftRowsError):
        build(src, tokenizer_file, tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []


def test_input_kinds(tmp_path):
    (tmp_path / "a.jsonl").write_text("")
    assert source_kind(str(tmp_path / "a.jsonl")) == "jsonl"
    assert source_kind("allenai/some-sft-mixture") == "hf"
    with pytest.raises(SftRowsError, match="input file not found"):
        source_kind(str(tmp_path / "missing.jsonl"))
    (tmp_path / "a.csv").write_text("")
    with pytest.raises(SftRowsError, match="unsupported file type .csv"):
        source_kind(str(tmp_path / "a.csv"))


def test_hub_dataset_offline_fails_clearly(tokenizer_file, tmp_path):
    pytest.importorskip("datasets")
    with pytest.raises(SftRowsError, match="needs network access"):
        build("someone/some-sft-dataset", tokenizer_file, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CLI), "--no-progress", "--chat-format", "chatml", "--packing", "eos_joined", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_cli_builds_and_refuses_a_used_output_folder(tokenizer_file, tmp_path):
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in make_conversations()])
    out = tmp_path / "out"
    args = [
        "--input",
        str(src),
        "--tokenizer",
        str(tokenizer_file.parent),
        "--out",
        str(out),
        "--row-tokens",
        str(ROW),
    ]
    ok = run_cli(*args)
    assert ok.returncode == 0, ok.stderr
    assert "rows_sha256" in ok.stdout and json.loads((out / "manifest.json").read_text())["rows"] > 0

    again = run_cli(*args)
    assert again.returncode == 2 and "is not empty" in again.stderr and "--overwrite" in again.stderr
    assert run_cli(*args, "--overwrite", "--seed", "7").returncode == 0
    assert json.loads((out / "manifest.json").read_text())["seed"] == 7
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "rows.parquet"]  # no temp files left


def test_cli_bad_input_exits_2_and_says_what_is_wrong(tokenizer_file, tmp_path):
    src = write_jsonl(tmp_path / "convs.jsonl", [{"messages": c} for c in make_conversations(5)])
    plain = tmp_path / "plain" / "tokenizer.json"
    plain.parent.mkdir()
    train_tokenizer(["<|endoftext|>"]).save(str(plain))
    cases = [
        (["--input", str(tmp_path / "missing.jsonl"), "--tokenizer", str(tokenizer_file)], "input file not found"),
        (["--input", str(src), "--tokenizer", str(tmp_path / "nowhere")], "tokenizer not found"),
        (["--input", str(src), "--tokenizer", str(plain)], "lacks the token(s) <|im_start|>, <|im_end|>"),
        (["--input", str(src), "--tokenizer", str(tokenizer_file), "--eos-token", "<|eos|>"], "<|eos|>"),
    ]
    for args, message in cases:
        result = run_cli(*args, "--out", str(tmp_path / "out"))
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
        assert not (tmp_path / "out").exists()
