"""A rows folder is read once per process: its manifest parsed once, its rows read and hashed once, the
validation split likewise, whoever asks (the build, the dry run's checks, the summary, the run's identity,
the dataset at launch); a rebuilt folder or a replaced file is read again."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bridge_recipes.data import integrity
from bridge_recipes.data.integrity import RowsIntegrityError, check_rows, read_manifest
from bridge_recipes.data.sft_rows import build_sft_rows

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
ROW = 128
RECIPE = "qwen35_27b_sft_8gpu_h200_bf16_config"


def write_convs(path: Path, n: int) -> Path:
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"What is the weather in Paris on day {i}?"},
                    {"role": "assistant", "content": "It is sunny " * (1 + i % 4)},
                ]
            }
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def build(tmp: Path, n: int) -> Path:
    build_sft_rows(
        write_convs(tmp / f"c{n}.jsonl", n), TOKENIZER, tmp / "rows", row_tokens=ROW, packing="boundaries",
        val_fraction=0.25, progress=False, overwrite=True,
    )  # fmt: skip
    return tmp / "rows"


@pytest.fixture
def reads(monkeypatch) -> dict[str, Counter]:
    """How often each folder's manifest is parsed, its rows table read and a file hashed, by path."""
    integrity.forget_readings()
    counts: dict[str, Counter] = {"manifest": Counter(), "table": Counter(), "file_sha256": Counter()}

    def counted(kind, fn):
        def wrapper(path, *args, **kwargs):
            counts[kind][str(Path(path).resolve())] += 1
            return fn(path, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(integrity, "_parse_manifest", counted("manifest", integrity._parse_manifest))
    monkeypatch.setattr(integrity, "_read_table", counted("table", integrity._read_table))
    monkeypatch.setattr(integrity, "file_sha256", counted("file_sha256", integrity.file_sha256))
    yield counts
    integrity.forget_readings()


def test_a_dry_run_and_the_launch_after_it_read_the_rows_once(tmp_path, reads, capsys):
    from megatron.bridge.data.base import DatasetBuildContext

    import bridge_recipes
    from bridge_recipes.bench.harness import rows_workload
    from bridge_recipes.config import run_length
    from bridge_recipes.config.datasets import describe
    from bridge_recipes.runner.cli import main
    from bridge_recipes.training.saved_runs import run_identity

    rows = build(tmp_path, 40).resolve()
    val = rows / "val"
    reads["file_sha256"].clear()  # the build hashed what it wrote
    args = ["--recipe", RECIPE, "--dry-run", "--world-size", "8", "-sl", str(ROW)]
    assert main([*args, "--dataset", "sft-rows", f"dataset.path={rows}"]) == 0, capsys.readouterr().err
    # what the launching process does next in the same process: build, summary, identity, datasets
    cfg = bridge_recipes.build(
        RECIPE, dataset="sft-rows", flags={"sl": ROW}, overrides=[f"dataset.path={rows}"], report=lambda c: None
    )
    assert "validation rows" in describe(cfg)
    assert (
        run_identity(cfg, RECIPE)["data"]["rows_sha256"]
        == json.loads((rows / "manifest.json").read_text())["rows_sha256"]
    )
    assert rows_workload(cfg)["packing"] == "boundaries"
    assert run_length.training_rows(cfg) > 0 and run_length.validation_rows(cfg) > 0
    train, valid, _ = cfg.dataset.build_datasets(DatasetBuildContext(train_samples=8, valid_samples=4, test_samples=0))
    assert len(train) == 8 and len(valid) == 4
    once = Counter({str(rows): 1, str(val): 1})
    assert reads["manifest"] == once and reads["table"] == once, reads
    assert reads["file_sha256"] == Counter({str(rows / "rows.parquet"): 1, str(val / "rows.parquet"): 1}), reads


def test_the_rows_are_shared_read_only_and_each_caller_gets_its_own_manifest(tmp_path, reads):
    rows = build(tmp_path, 40)
    a, b = check_rows(rows, seq_length=ROW), check_rows(rows, seq_length=ROW)
    assert a.ids is b.ids and not a.ids.flags.writeable and not a.mask.flags.writeable
    with pytest.raises(ValueError):
        a.ids[0, 0] = 1
    m = read_manifest(rows)
    m["rows"] = -1
    assert read_manifest(rows)["rows"] == a.manifest["rows"] > 0
    assert sum(reads["manifest"].values()) == 2  # the folder and its validation split, once each


def test_what_depends_on_the_caller_is_checked_on_every_call(tmp_path, reads):
    rows = build(tmp_path, 40)
    check_rows(rows, seq_length=ROW, vocab_size=512)
    with pytest.raises(RowsIntegrityError, match="seq_length is 64"):
        check_rows(rows, seq_length=64)
    with pytest.raises(RowsIntegrityError, match=r"outside the model's vocabulary \[0, 10\)"):
        check_rows(rows, vocab_size=10)
    assert sum(reads["table"].values()) == 2  # still the one reading of each split


def test_a_rebuilt_folder_is_read_again(tmp_path, reads):
    rows = build(tmp_path, 40)
    before = check_rows(rows).manifest["rows"]
    after = check_rows(build(tmp_path, 120)).manifest["rows"]
    assert after > before
    assert reads["manifest"][str(rows.resolve())] == 2 and reads["table"][str(rows.resolve())] == 2


def test_a_damaged_file_after_a_good_check_is_caught(tmp_path, reads):
    rows = build(tmp_path, 40)
    check_rows(rows)
    data = bytearray((rows / "rows.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size, other bytes
    (rows / "rows.parquet").write_bytes(bytes(data))
    with pytest.raises(RowsIntegrityError, match="does not match the sha256"):
        check_rows(rows)
    with pytest.raises(RowsIntegrityError, match="does not match the sha256"):
        check_rows(rows)  # the damage is kept with the reading, not read again
    assert reads["file_sha256"][str((rows / "rows.parquet").resolve())] == 2
