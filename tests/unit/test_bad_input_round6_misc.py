"""Typed feature settings checked before Megatron loads, settings that would change nothing, refusals
that say what is wrong (the GPU count only where the layout is), a rows folder with no rows, a VL
folder without its processor, the plan's speed at a shape its rate was not measured at, an Alpaca
record with no prompt, a cache on a pseudo file system, and the benchmark speaking its own flags and
passing on the runner's refusal."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bridge_recipes.config.overrides import FEATURES, OverrideError, precheck
from bridge_recipes.features import Features
from bridge_recipes.features import problems as feature_problems
from bridge_recipes.runner.cli import main

ROOT = Path(__file__).resolve().parents[2]
CHATML = ROOT / "tests/fixtures/chatml_tokenizer.json"
LORA = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"  # BF16 base, one H100
FP8_BASE = "qwen35_27b_peft_1gpu_h100_fp8base_config"  # LoRA on a base stored in FP8
VL = "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config"
LOADING = "loading Megatron-Bridge"


def _run(entry, *argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = entry([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue()


def _conv(i: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"what is {i} plus {i}?"},
            {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
        ]
    }


def _rows(folder: Path, records: list[dict], row_tokens: int = 256) -> dict:
    from bridge_recipes.data.sft_rows import build_sft_rows

    src = folder.with_suffix(".jsonl")
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    return build_sft_rows(src, CHATML, folder, row_tokens=row_tokens, progress=False, chat_format="chatml")


# ----------------------------------------------------------------- typed feature settings


@pytest.mark.parametrize(
    "token,key",
    [
        ("features.fp8_base.gemms=bogus", "features.fp8_base.gemms"),
        ("features.packed_attention.mode=bogus", "features.packed_attention.mode"),
        ("features.chunked_loss.enabled=maybe", "features.chunked_loss.enabled"),
        ("features.gdn_warmup.enabled=1", "features.gdn_warmup.enabled"),
        ("~features.te_wgrad.enabled", "features.te_wgrad.enabled"),
    ],
)
def test_a_feature_setting_of_the_wrong_type_or_value_is_refused_before_megatron_loads(token, key):
    code, text = _run(main, "--recipe", LORA, "--dry-run", token)
    assert code == 2 and key in text and "Traceback" not in text, text[-1500:]
    assert LOADING not in text


def _wrong(value):
    """A value of another type than ``value``'s (a list for a string: no number stands for it)."""
    return "not a switch" if isinstance(value, bool) else [value]


def test_every_field_of_every_feature_is_checked_in_overrides_and_in_a_built_run():
    fields = [
        (feature.name, f.name, getattr(getattr(Features(), feature.name), f.name))
        for feature in dataclasses.fields(Features)
        for f in dataclasses.fields(getattr(Features(), feature.name))
    ]
    assert len(fields) >= 6
    bad = Features()
    for feature, name, default in fields:
        key = f"{FEATURES}.{feature}.{name}"
        with pytest.raises(OverrideError, match=re.escape(key)):
            precheck([f"{key}={json.dumps(_wrong(default))}"])
        precheck([f"{key}={json.dumps(default) if isinstance(default, bool) else default}"])  # its default passes
        setattr(getattr(bad, feature), name, _wrong(default))
    found = feature_problems(SimpleNamespace(features=bad, env_vars=None))  # e.g. as a config file gives them
    assert len(found) == len(fields), found


# ----------------------------------------------------------------- FP8 GEMMs that change nothing; the GPU count


def test_fp8_gemms_on_a_run_without_fp8_are_refused_naming_the_key_not_the_gpus():
    code, text = _run(main, "--recipe", LORA, "--dry-run", "features.fp8_base.gemms=fp8")
    assert code == 2 and "error: features.fp8_base.gemms=fp8" in text, text[-2000:]
    closing = text.strip().splitlines()[-1]
    assert "GPU(s)" not in closing and LORA in closing


def test_fp8_gemms_stay_a_choice_of_an_fp8_base():
    import bridge_recipes
    from bridge_recipes.runner import checks

    cfg = bridge_recipes.build(FP8_BASE, overrides=["features.fp8_base.gemms=fp8"])
    assert not [p for p in checks.errors(checks.check(cfg, 1)) if "fp8_base" in p.message]


def test_the_gpu_count_is_named_for_a_layout_error():
    code, text = _run(main, "--recipe", LORA, "--dry-run", "--world-size", "2", "-gb", "7")
    assert code == 2 and "not divisible by micro batch x DP" in text, text[-2000:]
    assert "cannot run on 2 GPU(s)" in text.strip().splitlines()[-1]


# ----------------------------------------------------------------- --peft null, peft=null


@pytest.mark.parametrize(
    "argv,typed",
    [
        (["--peft", "null"], "--peft null"),
        (["--peft", "none"], "--peft none"),
        (["peft=null"], "'peft=null'"),
        (["peft=none"], "'peft=none'"),
    ],
)
def test_no_peft_says_how_to_train_every_weight_before_megatron_loads(argv, typed):
    code, text = _run(main, "--recipe", LORA, "--dry-run", *argv)
    assert code == 2 and typed in text and "~peft" in text and "--filter sft" in text, text[-1500:]
    assert LOADING not in text


# ----------------------------------------------------------------- rows: --epochs on no rows, the plan's speed


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    root = tmp_path_factory.mktemp("round6_rows")
    _rows(root / "rows", [_conv(i) for i in range(40)])
    return root


def _edited(rows: Path, name: str, rows_in_manifest: int, empty_file: bool = False) -> Path:
    folder = rows.parent / name
    shutil.copytree(rows, folder)
    if empty_file:
        table = pq.read_table(folder / "rows.parquet")
        pq.write_table(pa.Table.from_pylist([], schema=table.schema), folder / "rows.parquet")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["rows"] = rows_in_manifest
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("empty_file,named", [(False, "manifest.json records 0"), (True, "holds no rows")])
def test_epochs_on_a_folder_without_rows_says_to_rebuild_it(rows, empty_file, named):
    folder = _edited(rows / "rows", f"rows0_{empty_file}", 0, empty_file)
    code, text = _run(
        main, "--recipe", LORA, "--dataset", "sft-rows", f"dataset.path={folder}", "-sl", "256", "--epochs", "1",
        "--dry-run",
    )  # fmt: skip
    assert code == 2 and named in text and "build_sft_rows.py --out" in text, text[-1500:]
    assert "global batch" not in text.strip().splitlines()[-1]


@pytest.mark.parametrize("row_tokens,epoch_time", [(512, False), (8192, True)])
def test_the_plan_times_an_epoch_only_at_the_shape_the_rate_was_measured_at(rows, row_tokens, epoch_time):
    """The rate is measured at 8192 tokens per micro batch: at 512 the plan and the dry run both say
    "not estimated"."""
    folder = rows / f"rows{row_tokens}"
    _rows(folder, [_conv(i) for i in range(40)], row_tokens=row_tokens)
    data = ["--dataset", "sft-rows", f"dataset.path={folder}", "-sl", row_tokens]
    code, text = _run(main, "--recipe", LORA, *data, "--plan")
    speed = next(line for line in text.splitlines() if line.startswith("speed:"))
    assert code == 0 and ("an epoch of" in speed) is epoch_time and ("not estimated" in speed) is not epoch_time
    keep_nothing = ["checkpoint.save=null", "checkpoint.load=null", "checkpoint.async_save=false"]
    code, text = _run(main, "--recipe", LORA, *data, "--dry-run", "--lora-from-random-init", *keep_nothing)
    time_line = next(line for line in text.splitlines() if line.startswith("time "))
    assert code == 0 and ("not estimated" in time_line) is not epoch_time, text[-1500:]


# ----------------------------------------------------------------- a VL folder without its processor


def test_a_vl_folder_without_its_processor_is_named_with_the_missing_file(tiny_vl_toy, tmp_path):
    from bridge_recipes.hf.toy import model_overrides
    from bridge_recipes.vl.offline_vl_processor import vision_token_ids
    from bridge_recipes.vl.synthetic_images import write_conversations
    from bridge_recipes.vl.vl_dataset import build_vl_dataset

    toy, spec = tiny_vl_toy
    build_vl_dataset(write_conversations(tmp_path / "data", 12, seed=1), toy, tmp_path / "ds", progress=False)
    bare = tmp_path / "bare"
    shutil.copytree(toy, bare)
    (bare / "processor_config.json").unlink()
    overrides = [*model_overrides(spec), *(f"model.{k}={v}" for k, v in vision_token_ids(toy).items())]
    code, text = _run(
        main, "--recipe", VL, "--scale-down", "4", "--scale-experts", spec.num_experts, "-gb", "8", "-sl", "256",
        "--max-steps", "2", "--warmup-iters", "1", "dataset.task_encoder.min_pixels=4096",
        "dataset.task_encoder.max_pixels=16384", "dataset.do_validation=false", *overrides,
        "--dataset", "energon", f"dataset.path={tmp_path / 'ds'}", "--hf-checkpoint", bare, "--dry-run",
    )  # fmt: skip
    warning = next((line for line in text.splitlines() if "image processor" in line), "")
    assert f"--hf-checkpoint {bare}" in warning and "copy processor_config.json" in warning, text[-2000:]
    assert "pass --hf-checkpoint" not in text


# ----------------------------------------------------------------- an Alpaca record with no prompt


def test_an_alpaca_record_with_no_instruction_or_input_is_skipped_and_counted(tmp_path):
    records = [{"instruction": f"add {i} and {i}", "output": f"{2 * i}"} for i in range(40)]
    records += [
        {"instruction": "", "input": "", "output": "an answer to nothing"},
        {"instruction": " ", "output": "x"},
    ]
    c = _rows(tmp_path / "rows", records)["conversations"]
    assert c["used"] == 40 and c["skipped"] == {"alpaca_empty_prompt": 2}


# ----------------------------------------------------------------- a conversion cache on a pseudo file system


def test_a_cache_where_no_folder_can_be_made_is_refused(monkeypatch, tmp_path):
    from bridge_recipes.hf.importer import CACHE_ENV, cache_problem

    monkeypatch.setenv(CACHE_ENV, "/proc/bridge_recipes_cache")
    problem = cache_problem()
    assert problem is not None and "/proc" in problem and CACHE_ENV in problem
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert cache_problem() is None and list(tmp_path.iterdir()) == []  # the probe leaves nothing behind


# ----------------------------------------------------------------- the benchmark


def test_the_benchmark_names_its_own_flags_for_a_warm_up_too_long(tmp_path):
    from bridge_recipes.bench.benchmark import main as bench

    code, text = _run(
        bench, "--recipe", LORA, "--lora-from-random-init", "--gpu", "h100", "--steps", "3", "--window", "1", "3",
        "--out", tmp_path / "r.yaml",
    )  # fmt: skip
    assert code == 2 and "scheduler.lr_warmup_iters" in text and "--warmup-iters" not in text, text[-1500:]


def test_every_runner_flag_a_shared_message_names_becomes_one_the_benchmark_takes():
    from bridge_recipes.bench.benchmark import build_parser, in_benchmark_terms
    from bridge_recipes.config.overrides import FLAG_KEYS, flag_option

    taken = {o for a in build_parser()._actions for o in a.option_strings}
    for dest in FLAG_KEYS:
        for message in (
            f"set {flag_option(dest)} 4",
            f"set {flag_option(dest)} below 3",
            f"lower {flag_option(dest)}",
        ):
            said = in_benchmark_terms(message)
            assert set(re.findall(r"(?<![\w.-])--?[a-z][\w-]*", said)) <= taken, (message, said)


@pytest.fixture
def no_launch(monkeypatch):
    from bridge_recipes.bench import runs

    monkeypatch.setattr(runs, "launch", lambda *a, **k: pytest.fail("launched"))


def test_the_benchmark_checks_the_gpu_before_it_launches(monkeypatch, no_launch, tmp_path):
    from bridge_recipes.bench.benchmark import main as bench
    from bridge_recipes.hardware import gpu_memory

    a100 = gpu_memory.Device("NVIDIA A100-SXM4-80GB", 79.15 * 2**30 / 1e9, (8, 0))
    monkeypatch.setattr(gpu_memory, "current_device", lambda: a100)
    code, text = _run(
        bench, "--recipe", FP8_BASE, "--lora-from-random-init", "--gpu", "h100", "--out", tmp_path / "r.yaml"
    )
    assert code == 2 and "FP8" in text and "A100" in text and "a100_bf16" in text, text[-1500:]


def test_a_run_the_runner_refuses_is_reported_with_its_reason(monkeypatch, tmp_path):
    from bridge_recipes.bench import runs
    from bridge_recipes.bench.benchmark import main as bench

    log = "[run_recipe] error: the first reason\nrun_recipe.py: error: X cannot run; fix the error(s) above\n"
    monkeypatch.setattr(runs, "launch", lambda name, *a, **k: runs.Run(name, 1, None, log, 1.0))
    code, text = _run(
        bench, "--recipe", LORA, "--lora-from-random-init", "--gpu", "h100", "--out", tmp_path / "r.yaml"
    )
    assert code == 2 and "the first reason" in text and "X cannot run" in text, text[-1500:]
