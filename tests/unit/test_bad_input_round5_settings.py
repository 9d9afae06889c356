"""Memory caps, config files, full disks and checks before launch: a dry run that agrees with the
plan, a cap that is a GPU's memory (or a card named), a config file that cannot pass for another
recipe, a --save-config that fails cleanly, and what a look at the disk refutes answered before
Megatron loads."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import sys
from pathlib import Path

import pytest

from bridge_recipes.runner.cli import main

RECIPE = "qwen35_35b_a3b_sft_8gpu_h100_bf16_config"  # written for 8 x H100
OTHER_MODEL = "qwen35_122b_a10b_sft_24gpu_h200_bf16_config"  # MoE too, another size


def _run(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue()


def _no_megatron_loaded(text: str) -> bool:
    return "loading Megatron-Bridge" not in text


# ----------------------------------------------------------------- caps and cards


@pytest.mark.parametrize("cap", ["inf", "nan", "1e9", "-3", "0"])
def test_a_cap_that_is_no_gpus_memory_is_refused_before_loading(cap):
    code, text = _run("--recipe", RECIPE, "--dry-run", f"--gpu-memory-gb={cap}")
    assert code == 2 and "--gpu-memory-gb" in text and "Traceback" not in text
    assert _no_megatron_loaded(text)


def test_a_card_is_named_and_its_real_memory_taken():
    from bridge_recipes.hardware.gpus import GPUS, card_by_name

    assert card_by_name("h100") is GPUS["H100"] and card_by_name("rtx6000ada") is GPUS["L40S"]
    assert card_by_name("A100-80") is GPUS["A100"] and card_by_name("nvidia-h200") is GPUS["H200"]
    code, text = _run("--recipe", RECIPE, "--plan", "--gpu", "h100")
    assert code == 0 and f"{GPUS['H100'].usable_memory_gb:.1f} GB" in text, text[-1500:]


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--gpu", "a100-40"], "not a card of the GPU table"),
        (["--gpu", "h100", "--gpu-memory-gb", "70"], "both set the memory"),
    ],
)
def test_a_card_not_in_the_table_or_two_memories_are_refused(argv, words):
    code, text = _run("--recipe", RECIPE, "--dry-run", *argv)
    assert code == 2 and words in text and _no_megatron_loaded(text)


def test_the_size_printed_on_a_card_is_explained():
    from bridge_recipes.hardware.gpu_memory import nominal_note

    note = nominal_note(80, "h100")
    assert note is not None and "--gpu h100" in note and "85.0" in note
    assert nominal_note(70) is None


def test_the_dry_run_refuses_a_cap_the_plan_refuses():
    plan, plan_text = _run("--recipe", RECIPE, "--plan", "--gpu-memory-gb", "48")
    dry, dry_text = _run("--recipe", RECIPE, "--dry-run", "--gpu-memory-gb", "48")
    assert plan == 2 and "DOES NOT FIT" in plan_text
    assert dry == 2 and "does not fit --gpu-memory-gb 48" in dry_text and "checks: ok" not in dry_text
    fits, fits_text = _run("--recipe", RECIPE, "--dry-run", "--gpu", "h100")
    assert fits == 0 and "planned peak" in fits_text


def test_the_plan_lists_only_recipes_that_fit_with_the_overrides():
    import bridge_recipes
    from bridge_recipes.recipes.gpu_fit import plan_fits

    code, text = _run("--recipe", "qwen35_35b_a3b_peft_1gpu_h100_bf16_config", "--plan", "-sl", "16384")
    assert code == 2
    listed = re.search(r"planned to fit ([\d.]+) GB with your overrides: (.*)", text)
    for name in listed.group(2).split(", ") if listed else []:
        cfg = bridge_recipes.build(name, flags={"sl": 16384})
        assert plan_fits(cfg, 1, float(listed.group(1)))[0], name


def test_save_config_keeps_the_cap_and_the_file_brings_it_back(tmp_path):
    saved = tmp_path / "cfg.yaml"
    code, text = _run("--recipe", RECIPE, "--dry-run", "--gpu-memory-gb", "84", "--save-config", saved)
    assert code == 0, text[-1500:]
    assert "# gpu-memory-gb: 84\n" in saved.read_text()
    code, text = _run("--config-file", saved, "--dry-run", "--world-size", "8")
    assert code == 0 and "--gpu-memory-gb 84 (from" in text and "of 84.0 GB" in text, text[-1500:]


# ----------------------------------------------------------------- full disk


def test_save_config_on_a_full_disk_is_one_error_and_keeps_the_old_file(tmp_path, monkeypatch):
    from bridge_recipes.utils import outputs

    saved = tmp_path / "cfg.yaml"
    saved.write_text("the user's old config\n")

    def full(path, text):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(outputs, "write_text_atomic", full)
    code, text = _run("--recipe", RECIPE, "--dry-run", "--save-config", saved, "--overwrite-config")
    assert code == 2 and "Traceback" not in text and "--save-config" in text and "as it was" in text
    assert saved.read_text() == "the user's old config\n"


def test_the_row_build_on_a_file_size_limit_is_one_error_and_leaves_nothing(tmp_path):
    import json
    import resource
    import subprocess

    root = Path(__file__).resolve().parents[2]
    import random

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(4000)]
    src = tmp_path / "in.jsonl"
    with src.open("w") as f:
        for _ in range(400):
            text = " ".join(rng.choice(words) for _ in range(60))
            turns = [{"role": "user", "content": text[:200]}, {"role": "assistant", "content": text}]
            f.write(json.dumps({"messages": turns}) + "\n")

    def small_files():  # the input can be read; no file over 16 kB can be written, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    cmd = [sys.executable, str(root / "scripts/build_sft_rows.py"), "--input", str(src), "--chat-format", "chatml"]
    cmd += ["--tokenizer", str(root / "tests/fixtures/chatml_tokenizer.json"), "--row-tokens", "1024"]
    cmd += ["--out", str(tmp_path / "rows"), "--workers", "1", "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=root, preexec_fn=small_files, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "File too large" in p.stderr, p.stderr[-2000:]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.jsonl"]


# ----------------------------------------------------------------- config files


@pytest.fixture(scope="module")
def saved_rows_text():
    import bridge_recipes
    from bridge_recipes.config import files as config_files

    cfg = bridge_recipes.build(RECIPE, dataset="sft-rows", overrides=["dataset.path=/nowhere/rows"])
    return config_files.to_text(cfg, RECIPE)


def test_a_list_where_a_path_belongs_in_a_config_file_is_refused(saved_rows_text, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(saved_rows_text.replace("  path: /nowhere/rows", "  path:\n  - /a\n  - /b"))
    code, text = _run("--config-file", path, "--dry-run")
    assert code == 2 and "Traceback" not in text and "dataset.path is list" in text, text[-1500:]


def test_a_home_relative_data_path_is_the_home_folder(saved_rows_text, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "cfg.yaml"
    path.write_text(saved_rows_text.replace("  path: /nowhere/rows", "  path: ~/rows"))
    code, text = _run("--config-file", path, "--dry-run")
    assert code == 2 and f"{tmp_path}/rows" in text and "--out ~/rows" not in text, text[-1500:]


def test_a_recipe_line_naming_another_model_of_the_same_kind_is_refused(saved_rows_text, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(saved_rows_text.replace(f"# recipe: {RECIPE}", f"# recipe: {OTHER_MODEL}"))
    code, text = _run("--config-file", path, "--dry-run")
    assert code == 2 and "hidden_size" in text and "# recipe:" in text and "Traceback" not in text


# ----------------------------------------------------------------- before Megatron loads


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--dataset", "parquet"], "--dataset 'parquet' is not known"),
        (["--pretrained-checkpoint", "/nowhere/ckpt"], "no such folder"),
        (["checkpoint.pretrained_checkpoint=/nowhere/ckpt"], "no such folder"),
        (["--hf-checkpoint", "/nowhere/hf"], "no such folder"),
        (["--dataset", "sft-rows", "dataset.path=/nowhere/rows"], "build it with scripts/build_sft_rows.py"),
    ],
)
def test_what_the_disk_refutes_is_answered_before_megatron_loads(argv, words):
    code, text = _run("--recipe", RECIPE, "--dry-run", *argv)
    assert code == 2 and words in text and _no_megatron_loaded(text), text[-1500:]


def test_a_jsonl_file_given_as_the_rows_folder_points_at_the_builder(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    code, text = _run("--recipe", RECIPE, "--dry-run", "--dataset", "sft-rows", f"dataset.path={data}")
    assert code == 2 and "is a file" in text and f"--input {data}" in text and _no_megatron_loaded(text)


# ----------------------------------------------------------------- advice the environment would override


def test_env_advice_says_an_exported_variable_wins():
    from bridge_recipes.runner.env_settings import env_advice

    assert env_advice("X_MODE", "1", {}) == "+env_vars.X_MODE=1"
    said = env_advice("X_MODE", "1", {"X_MODE": "0"})
    assert "exported" in said and "export X_MODE=1" in said


def test_a_file_of_a_rows_folder_given_as_the_path_names_the_folder(tmp_path):
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "rows.parquet").write_bytes(b"PAR1")
    given = tmp_path / "rows" / "rows.parquet"
    code, text = _run("--recipe", RECIPE, "--dry-run", "--dataset", "sft-rows", f"dataset.path={given}")
    assert code == 2 and f"dataset.path={tmp_path / 'rows'}" in text and "--input" not in text
