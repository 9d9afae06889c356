"""Every text SFT and LoRA recipe dry-runs on the default rows (packed with boundaries) as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge_recipes.data.sft_rows import build_sft_rows
from bridge_recipes.data.synthetic_chat import conversations_jsonl
from bridge_recipes.recipes import registry

TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"
RECIPES = sorted(
    name
    for name, e in registry.discover().items()
    if e.meta.task in ("sft", "peft") and "_vl_" not in name and not name.endswith("_mock_config")
)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rows")
    (tmp / "c.jsonl").write_text(conversations_jsonl(120))
    manifest = build_sft_rows(tmp / "c.jsonl", TOKENIZER, tmp / "rows", row_tokens=8192, progress=False)
    assert manifest["packing"] == "boundaries"  # the builder's default
    return tmp / "rows"


@pytest.fixture(scope="module")
def base_weights(tmp_path_factory):
    """A folder Megatron-Bridge takes for a checkpoint (its tracker file): what a LoRA run starts from."""
    folder = tmp_path_factory.mktemp("base")
    (folder / "latest_checkpointed_iteration.txt").write_text("1")
    (folder / "iter_0000001").mkdir()  # the step the tracker names
    return folder


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_dry_runs_on_packed_rows(rows, base_weights, recipe, capsys):
    from bridge_recipes.runner.cli import main

    cfg = registry.load(recipe)()
    gpus = registry.find(recipe).meta.gpus
    args = [
        "--recipe",
        recipe,
        "--dry-run",
        "--world-size",
        str(gpus),
        "--dataset",
        "sft-rows",
        f"dataset.path={rows}",
    ]
    if cfg.peft is not None:  # a LoRA run is refused without base weights
        args.append(f"checkpoint.pretrained_checkpoint={base_weights}")
    if cfg.model.seq_length != 8192:  # the long-context recipes: rows of their own length would do the same
        args += ["-sl", "8192"]
    code = main(args)
    captured = capsys.readouterr()
    if cfg.model.context_parallel_size > 1:
        # packed-row attention does not split a conversation over ranks: refused, with the fix
        assert code == 2 and "set -cp 1" in captured.err and "--packing one_per_row" in captured.err
        return
    assert code == 0, captured.err[-2000:]
    assert "checks: ok" in captured.out
    # the recipe's k rows per micro batch run as one packed sequence of the k rows joined, the same rows per step
    mb = cfg.train.micro_batch_size
    joined = [f"packed rows: train.micro_batch_size: {mb} -> 1", f"packed rows: dataset.rows_per_sample: 1 -> {mb}"]
    assert all(line in captured.out for line in joined) == (mb > 1)


@pytest.mark.parametrize("recipe", sorted(n for n, e in registry.discover().items() if "_vl_" not in n))
def test_a_text_recipe_declares_its_rows_per_micro_batch(recipe):
    """Boundaries rows take one packed sequence per micro batch, so a text recipe of k > 1 rows per micro batch
    says so with the policy block that joins them there; a micro batch it does not declare would be refused."""
    from bridge_recipes.data.packed_rows import recipe_rows

    cfg = registry.load(recipe)()
    assert recipe_rows(cfg) == cfg.train.micro_batch_size


def test_the_global_batch_of_a_recipe_that_joins_its_rows_counts_rows(rows, capsys):
    """-gb of a recipe joining two rows per sequence counts rows: 24 rows are 12 sequences, which 8 GPUs do not
    divide, and the fix names rows; 7 rows do not make whole sequences."""
    from bridge_recipes.runner.cli import main

    recipe = "qwen35_35b_a3b_sft_8gpu_h200_bf16_fast_mt16k_config"
    args = ["--recipe", recipe, "--dry-run", "--world-size", "8", "--dataset", "sft-rows", f"dataset.path={rows}"]
    assert main([*args, "-gb", "32"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\bpacked rows: train\.global_batch_size: 32 -> 16 sequences$", out, re.M), out
    assert main([*args, "-gb", "24"]) == 2
    assert "multiple of 16" in capsys.readouterr().err
    assert main([*args, "-gb", "7"]) == 2
    err = capsys.readouterr().err
    assert "train.global_batch_size 7" in err and "multiple of 2" in err
