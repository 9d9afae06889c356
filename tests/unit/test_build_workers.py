"""Rows built by several worker processes are those one process builds, byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.chat.errors import SftRowsError
from bridge_recipes.data import render_workers, sft_rows, split_packing
from bridge_recipes.data.synthetic_chat import conversations_jsonl

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "fixtures" / "qwen35_chat_tokenizer"


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    path = tmp_path_factory.mktemp("in") / "c.jsonl"
    lines = conversations_jsonl(300).splitlines()
    # skipped ones among them, at places a chunk boundary falls between
    lines[70] = "{not json"
    lines[129] = json.dumps({"messages": [{"role": "user", "content": "no reply"}]})
    path.write_text("\n".join(lines) + "\n")
    return path


def build(conversations, out, workers, **kw):
    return sft_rows.build_sft_rows(
        conversations, TOKENIZER, out, row_tokens=2048, progress=False, workers=workers, **kw
    )


@pytest.mark.parametrize("packing", ["boundaries", "eos_joined"])
def test_the_rows_are_the_same_whatever_the_workers(conversations, tmp_path, packing, monkeypatch):
    monkeypatch.setattr(render_workers, "WORK_CHUNK", 7)  # many chunks, a short window ahead
    one = build(conversations, tmp_path / "one", 1, packing=packing, val_fraction=0.1)
    three = build(conversations, tmp_path / "three", 3, packing=packing, val_fraction=0.1)
    assert one["rows"] > 1 and one["conversations"]["skipped_total"] == 2
    for key in ("rows_sha256", "parquet_sha256", "conversations", "validation", "supervised_tokens"):
        assert three[key] == one[key], key
    assert (tmp_path / "one/rows.parquet").read_bytes() == (tmp_path / "three/rows.parquet").read_bytes()


def test_workers_render_ahead_a_bounded_number_of_conversations(monkeypatch):
    monkeypatch.setattr(render_workers, "WORK_CHUNK", 5)
    monkeypatch.setattr(render_workers, "CHUNKS_AHEAD", 2)
    taken = []

    def records():
        for i in range(200):
            taken.append(i)
            yield i, i

    out = render_workers.prepared(records(), lambda index, raw: raw * 2, workers=2)
    first = [next(out) for _ in range(3)]
    assert first == [(0, 0), (1, 2), (2, 4)]
    assert len(taken) <= 5 * (2 * 2 + 1)  # the chunks in flight and the one being handed out
    assert [v for _, v in out] == [2 * i for i in range(3, 200)]


@pytest.mark.parametrize("workers", [0, -2, True])
def test_a_worker_count_below_one_is_refused(conversations, tmp_path, workers):
    with pytest.raises(SftRowsError, match="--workers .*at least 1"):
        build(conversations, tmp_path / "rows", workers)


def test_a_skipped_conversation_crosses_a_process_boundary():
    import pickle

    from bridge_recipes.chat.conversations import MalformedConversation

    back = pickle.loads(pickle.dumps(MalformedConversation(7, "invalid_json", "line is not valid JSON")))
    assert (back.index, back.reason, str(back)) == (
        7,
        "invalid_json",
        "source row 7: line is not valid JSON [invalid_json]",
    )


def test_a_failing_worker_stops_the_build_with_its_error():
    def work(index, raw):
        if index == 9:
            raise KeyError("boom")
        return raw

    for workers in (1, 2):
        with pytest.raises(render_workers.WorkerError, match="source row 9: KeyError: 'boom'"):
            list(render_workers.prepared(((i, i) for i in range(40)), work, workers=workers))


def test_a_build_stopped_by_a_worker_names_the_record_and_leaves_nothing(conversations, tmp_path, monkeypatch):
    real = split_packing._prepare

    def failing(decode, render, row_bound, index, raw):
        if index == 33:
            raise KeyError("boom")
        return real(decode, render, row_bound, index, raw)

    monkeypatch.setattr(split_packing, "_prepare", failing)
    with pytest.raises(SftRowsError, match=r"c\.jsonl, line 34: KeyError: 'boom'; the build stopped"):
        build(conversations, tmp_path / "rows", 2)
    assert list(tmp_path.iterdir()) == []


def test_no_worker_is_stopped_by_signal_at_the_end_or_an_early_stop(monkeypatch):
    """When the work is done, and when it stops early (a consumer that stops, an error, a Ctrl-C), the
    workers end by their end marker after the chunks in flight: none is sent SIGTERM, which can miss a
    worker just forked or end one holding the result queue's lock, and the pool would then wait forever."""
    import multiprocessing
    import multiprocessing.pool

    from bridge_recipes.data.render_workers import prepared

    terminated: list[list[bool]] = []
    real = multiprocessing.pool.Pool.terminate

    def terminate(self):
        terminated.append([p.exitcode is None for p in self._pool])
        return real(self)

    monkeypatch.setattr(multiprocessing.pool.Pool, "terminate", terminate)
    records = [(i, str(i)) for i in range(300)]
    assert list(prepared(iter(records), lambda i, raw: raw + "!", 2)) == [(i, f"{i}!") for i in range(300)]
    early = prepared(iter(records), lambda i, raw: raw, 2)
    assert next(early) == (0, "0")
    early.close()  # a consumer that stops (max_rows)
    assert not any(any(alive) for alive in terminated)
    assert multiprocessing.active_children() == []


def test_both_builders_take_the_shared_options_and_name_their_own_work():
    """The row builder and the image dataset builder share --out, --overwrite, --workers and
    --no-progress; each one's --workers help says what its workers do."""
    from bridge_recipes.vl import vl_cli

    parser = vl_cli.build_parser()
    args = parser.parse_args(["--input", "c.jsonl", "--processor", "p", "--out", "o"])
    assert (args.out, args.overwrite, args.workers, args.no_progress) == ("o", False, None, False)
    args = parser.parse_args(["--input", "c.jsonl", "--processor", "p", "--out", "o", "--overwrite", "--workers", "3"])
    assert (args.overwrite, args.workers) == (True, 3)
    vl_help = " ".join(parser.format_help().split())
    assert "reading images" in vl_help and "the dataset is the same" in vl_help
    rows = subprocess.run(
        [sys.executable, str(ROOT / "scripts/build_sft_rows.py"), "--help"], capture_output=True, text=True
    )
    assert rows.returncode == 0, rows.stderr
    rows_help = " ".join(rows.stdout.split())
    for option in ("--out OUT", "--overwrite", "--workers WORKERS", "--no-progress"):
        assert option in rows_help and option in vl_help, option
    assert "rendering conversations" in rows_help and "the rows are the same" in rows_help
    assert "reading images" not in rows_help
