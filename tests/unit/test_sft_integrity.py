"""Integrity of rows folders (each failure a one-line error naming the file and the fix) and atomic builds."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge_recipes.data.integrity import RowsIntegrityError, check_rows
from bridge_recipes.data.row_writer import clean_stale_stages
from bridge_recipes.data.sft_rows import build_sft_rows

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
ROW = 128


def write_convs(path: Path, n: int) -> Path:
    msgs = lambda i: [  # noqa: E731
        {"role": "user", "content": f"What is the weather in Paris on day {i}?"},
        {"role": "assistant", "content": "It is sunny " * (1 + i % 4)},
    ]
    path.write_text("".join(json.dumps({"messages": msgs(i)}) + "\n" for i in range(n)))
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("good")
    build_sft_rows(
        write_convs(tmp / "c.jsonl", 30), TOKENIZER, tmp / "rows", row_tokens=ROW, packing="boundaries", progress=False
    )
    return tmp / "rows"


@pytest.fixture
def rows(good, tmp_path) -> Path:
    shutil.copytree(good, tmp_path / "rows")
    return tmp_path / "rows"


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def rewrite(folder: Path, table: pa.Table, **fields) -> None:
    """Replace the Parquet file and make the manifest agree with its bytes (so a deeper check must catch it)."""
    pq.write_table(table, folder / "rows.parquet")
    data = (folder / "rows.parquet").read_bytes()
    m = {**manifest(folder), "parquet_sha256": hashlib.sha256(data).hexdigest(), "parquet_bytes": len(data), **fields}
    (folder / "manifest.json").write_text(json.dumps(m))


def with_column(table: pa.Table, name: str, values: list, kind) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values, kind))


def test_good_rows_pass_every_check(good):
    loaded = check_rows(good, seq_length=ROW, vocab_size=512, tokenizer=TOKENIZER)
    assert loaded.ids.shape == (manifest(good)["rows"], ROW) and loaded.cu is not None


def damage_cases():
    def zero_bytes(f):
        (f / "rows.parquet").write_bytes(b"")

    def truncated(f):
        data = (f / "rows.parquet").read_bytes()
        (f / "rows.parquet").write_bytes(data[: len(data) // 2])

    def flipped_byte(f):
        data = bytearray((f / "rows.parquet").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (f / "rows.parquet").write_bytes(bytes(data))

    def bad_json(f):
        (f / "manifest.json").write_text("{not json")

    def missing_keys(f):
        (f / "manifest.json").write_text(json.dumps({"row_tokens": ROW}))

    def no_rows_file(f):
        (f / "rows.parquet").unlink()

    def row_count(f):
        (f / "manifest.json").write_text(json.dumps({**manifest(f), "rows": manifest(f)["rows"] + 1}))

    def wrong_dtype(f):
        t = pq.read_table(f / "rows.parquet")
        rewrite(f, with_column(t, "input_ids", t.column("input_ids").to_pylist(), pa.list_(pa.int64())))

    def short_row(f):
        t = pq.read_table(f / "rows.parquet")
        ids, mask = t.column("input_ids").to_pylist(), t.column("loss_mask").to_pylist()
        ids[1], mask[1] = ids[1][:-1], mask[1][:-1]
        t = with_column(t, "input_ids", ids, pa.list_(pa.int32()))
        rewrite(f, with_column(t, "loss_mask", mask, pa.list_(pa.uint8())))

    def id_out_of_vocab(f):
        t = pq.read_table(f / "rows.parquet")
        ids = t.column("input_ids").to_pylist()
        ids[0][3] = 999
        rewrite(f, with_column(t, "input_ids", ids, pa.list_(pa.int32())))

    def mask_not_binary(f):
        t = pq.read_table(f / "rows.parquet")
        mask = t.column("loss_mask").to_pylist()
        mask[0][3] = 2
        rewrite(f, with_column(t, "loss_mask", mask, pa.list_(pa.uint8())))

    def bad_boundaries(f):
        t = pq.read_table(f / "rows.parquet")
        cu = t.column("cu_seqlens").to_pylist()
        cu[0][-1] = ROW - 1
        rewrite(f, with_column(t, "cu_seqlens", cu, pa.list_(pa.int32())))

    def rows_hash(f):
        t = pq.read_table(f / "rows.parquet")
        ids = t.column("input_ids").to_pylist()
        ids[0][3] = (ids[0][3] + 1) % 512
        rewrite(f, with_column(t, "input_ids", ids, pa.list_(pa.int32())))

    return [
        (zero_bytes, "rows.parquet is 0 bytes but manifest.json records"),
        (truncated, "the file is truncated or was replaced"),
        (flipped_byte, "does not match the sha256 in manifest.json"),
        (bad_json, "manifest.json is not valid JSON"),
        (missing_keys, "manifest.json lacks builder_version"),
        (no_rows_file, "has no rows.parquet: build it with scripts/build_sft_rows.py"),
        (row_count, "rows but manifest.json records"),
        (wrong_dtype, "column 'input_ids' is list<element: int64>, expected list<item: int32>"),
        (short_row, "row 1 input_ids has 127 tokens, not 128"),
        (id_out_of_vocab, "holds token id 999, outside the model's vocabulary [0, 512)"),
        (mask_not_binary, "loss_mask holds 2; only 0 and 1 are allowed"),
        (bad_boundaries, "row 0 cu_seqlens"),
        (rows_hash, "rows do not match rows_sha256"),
    ]


@pytest.mark.parametrize("damage, message", damage_cases(), ids=lambda x: getattr(x, "__name__", ""))
def test_each_damage_is_one_clear_error(rows, damage, message):
    damage(rows)
    with pytest.raises(RowsIntegrityError) as err:
        check_rows(rows, seq_length=ROW, vocab_size=512)
    text = str(err.value)
    assert message.replace("<item:", "<element:").split(", expected")[0] in text.replace("<item:", "<element:")
    assert str(rows) in text and "\n" not in text


def test_validation_rows_are_checked_too(tmp_path):
    build_sft_rows(
        write_convs(tmp_path / "c.jsonl", 30), TOKENIZER, tmp_path / "rows", row_tokens=ROW, val_fraction=0.2,
        progress=False,
    )  # fmt: skip
    check_rows(tmp_path / "rows", seq_length=ROW)
    (tmp_path / "rows" / "val" / "rows.parquet").write_bytes(b"")
    with pytest.raises(RowsIntegrityError, match=r"val/rows.parquet is 0 bytes"):
        check_rows(tmp_path / "rows", seq_length=ROW)


def test_rows_built_with_another_tokenizer_are_refused(rows, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(TOKENIZER, other)
    data = json.loads((other / "tokenizer.json").read_text())
    data["added_tokens"][0]["content"] = "<|eot|>"
    (other / "tokenizer.json").write_text(json.dumps(data))
    check_rows(rows, tokenizer=TOKENIZER / "tokenizer.json")
    with pytest.raises(RowsIntegrityError, match="built with a different tokenizer than the recipe's"):
        check_rows(rows, tokenizer=other)


def test_runner_dry_run_reports_damage_without_a_traceback(rows, capsys):
    from bridge_recipes.runner.cli import main

    (rows / "rows.parquet").write_bytes(b"")
    args = ["--recipe", "qwen35_27b_sft_8gpu_h200_bf16_config", "--dry-run", "--world-size", "8", "-sl", str(ROW)]
    assert main([*args, "--dataset", "sft-rows", f"dataset.path={rows}"]) == 2
    err = capsys.readouterr().err
    assert "rows.parquet" in err and "0 bytes" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ atomic writes

KILLER = """
import os, signal, sys
sys.path.insert(0, {repo!r})
import bridge_recipes.data.sft_rows as s
import bridge_recipes.data.row_writer as w
where = sys.argv[1]
if where == "packing":  # killed while writing rows
    add = w.RowWriter.add
    def dying_add(self, *a):
        add(self, *a)
        os.kill(os.getpid(), signal.SIGKILL)
    w.RowWriter.add = dying_add
elif where == "before_publish":  # killed with a complete staged dataset
    w.publish = lambda stage, out: os.kill(os.getpid(), signal.SIGKILL)
elif where == "between_renames":  # killed after the old dataset was parked, before the new one moved in
    real = os.replace
    def dying_replace(a, b):
        real(a, b)
        if ".old-" in str(b):
            os.kill(os.getpid(), signal.SIGKILL)
    w.os.replace = dying_replace
s.build_sft_rows(sys.argv[2], {tok!r}, sys.argv[3], row_tokens=64, overwrite=True, progress=False)
"""


@pytest.mark.parametrize("where", ["packing", "before_publish", "between_renames"])
def test_a_killed_overwrite_leaves_the_previous_dataset_and_nothing_that_blocks(tmp_path, where):
    src = write_convs(tmp_path / "c.jsonl", 30)
    out = tmp_path / "rows"
    before = build_sft_rows(src, TOKENIZER, out, row_tokens=ROW, progress=False)
    script = tmp_path / "kill.py"
    script.write_text(KILLER.format(repo=str(REPO), tok=str(TOKENIZER)))
    p = subprocess.run([sys.executable, str(script), where, str(src), str(out)], capture_output=True, timeout=120)
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    leftovers = [x.name for x in tmp_path.iterdir() if x.name.startswith(".rows.")]
    assert leftovers  # the kill left its staging (or parked) folder
    if where != "between_renames":
        assert manifest(out) == before and check_rows(out, seq_length=ROW).manifest == before
    clean_stale_stages(out)  # what the next build does first: the previous dataset is back
    assert manifest(out) == before and check_rows(out, seq_length=ROW).manifest == before
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".rows.")]
    after = build_sft_rows(src, TOKENIZER, out, row_tokens=64, overwrite=True, progress=False)
    assert manifest(out) == after and after["row_tokens"] == 64
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c.jsonl", "kill.py", "rows"]


def test_next_build_cleans_stale_stages_of_dead_builds_only(tmp_path):
    src = write_convs(tmp_path / "c.jsonl", 10)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".rows.tmp-{int(dead.stdout)}"
    stale.mkdir()
    (stale / "rows.parquet").write_bytes(b"partial")
    live = tmp_path / f".rows.tmp-{os.getppid()}"  # a running process: left alone
    live.mkdir()
    build_sft_rows(src, TOKENIZER, tmp_path / "rows", row_tokens=ROW, progress=False)
    assert not stale.exists() and live.exists()


def test_overwrite_refuses_a_folder_with_other_files(tmp_path):
    src = write_convs(tmp_path / "c.jsonl", 10)
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="holds files a build did not write"):
        build_sft_rows(src, TOKENIZER, tmp_path / "rows", row_tokens=ROW, overwrite=True, progress=False)
    assert (tmp_path / "rows" / "notes.txt").read_text() == "mine"
    assert np.array_equal(sorted(p.name for p in tmp_path.iterdir()), ["c.jsonl", "rows"])
