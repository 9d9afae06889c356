"""The VL SFT and PEFT recipes dry-run on a built image-conversation dataset (``--dataset energon
dataset.path=DIR``), and the dry run checks it: Energon's metadata, the processor and tokenizer
against the ones it was built with, the vision token ids, and the image budget against the sequence."""

import contextlib
import copy
import io
import json
import re
import shutil

import pytest

from bridge_recipes import build
from bridge_recipes.hf.toy import model_overrides
from bridge_recipes.runner.cli import main as run_main
from bridge_recipes.vl.offline_vl_processor import vision_token_ids
from bridge_recipes.vl.synthetic_images import write_conversations
from bridge_recipes.vl.vl_checks import dry_run_problems
from bridge_recipes.vl.vl_dataset import build_vl_dataset

RECIPE = "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config"
PIXELS = ["dataset.task_encoder.min_pixels=4096", "dataset.task_encoder.max_pixels=16384"]


@pytest.fixture(scope="module")
def setup(tiny_vl_toy, tmp_path_factory):
    """A tiny VL toy (its processor inside), a dataset built with it (with and without a validation
    split), and the runner arguments that fit the recipe to the toy."""
    root = tmp_path_factory.mktemp("vl_dry")
    toy, spec = tiny_vl_toy
    src = write_conversations(root / "data", 30, seed=1)
    build_vl_dataset(src, toy, root / "ds", val_fraction=0.2, progress=False)
    build_vl_dataset(src, toy, root / "ds_no_val", progress=False)
    overrides = [*model_overrides(spec), *(f"model.{k}={v}" for k, v in vision_token_ids(toy).items()), *PIXELS]
    flags = ["--scale-down", "4", "--scale-experts", str(spec.num_experts), "-gb", "8", "-sl", "256"]
    flags += ["--max-steps", "3", "--warmup-iters", "1"]  # 24 samples: one pass over the 24 training ones
    return {"root": root, "toy": toy, "dataset": root / "ds", "fit": [*flags, *overrides], "overrides": overrides}


def _dry_run(*args) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run_main([str(a) for a in args])
    return rc, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("peft", [[], ["--peft", "lora"]])
def test_the_sft_and_peft_recipes_dry_run_on_the_dataset(setup, peft):
    """From the checkpoint folder: its tokenizer and its processor become the run's."""
    rc, text = _dry_run(
        "--recipe", RECIPE, *setup["fit"], "--dataset", "energon", f"dataset.path={setup['dataset']}",
        "--hf-checkpoint", setup["toy"], *peft, "--dry-run", "--show-yaml",
    )  # fmt: skip
    assert rc == 0, text[-3000:]
    assert f"hf_processor_path: {setup['toy']}" in text
    assert not re.search(r"\[run_recipe\] error", text)


@pytest.fixture(scope="module")
def cfg(setup):
    """The SFT recipe on the dataset with the processor named by its field (no --hf-checkpoint)."""
    return build(
        RECIPE,
        scale_down=4,
        scale_experts=4,
        dataset="energon",
        flags={"gb": 8, "sl": 256, "max_steps": 3, "warmup_iters": 1},
        overrides=[
            *setup["overrides"],
            f"dataset.path={setup['dataset']}",
            f"dataset.task_encoder.hf_processor_path={setup['toy']}",
        ],
    )


def test_a_well_built_dataset_passes(cfg):
    errors, warnings = dry_run_problems(cfg)
    assert errors == [] and warnings == []


def _changed(cfg, **fields):
    c = copy.deepcopy(cfg)
    for dotted, value in fields.items():
        *path, last = dotted.split("__")
        obj = c
        for p in path:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return c


@pytest.mark.parametrize(
    "fields,named",
    [
        ({"model__image_token_id": 7}, "model.image_token_id=5"),
        ({"model__vision_start_token_id": 248053}, "model.vision_start_token_id=3"),
        ({"dataset__task_encoder__patch_size": 14}, "dataset.task_encoder.patch_size=16"),
        ({"dataset__task_encoder__spatial_merge_size": 1}, "dataset.task_encoder.spatial_merge_size=2"),
        ({"model__vocab_size": 100}, "model.vocab_size=100"),
        ({"dataset__task_encoder__min_pixels": 10**6}, "min_pixels"),
        ({"dataset__path": "/nonexistent/ds"}, "dataset.path=/nonexistent/ds"),
        ({"dataset__path": None}, "dataset.path="),
    ],
)
def test_each_mismatch_is_one_error_naming_the_field_and_fix(cfg, fields, named):
    errors, _ = dry_run_problems(_changed(cfg, **fields))
    assert len(errors) >= 1 and any(named in e for e in errors), errors


def test_another_processor_is_refused_naming_the_file(cfg, setup, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(setup["toy"], other)
    (other / "chat_template.jinja").write_text((other / "chat_template.jinja").read_text() + "\n")
    errors, _ = dry_run_problems(_changed(cfg, dataset__task_encoder__hf_processor_path=str(other)))
    assert len(errors) == 1 and "chat_template.jinja" in errors[0] and "--processor" in errors[0]
    shutil.copytree(setup["toy"], tmp_path / "same")  # the same files elsewhere are the same processor
    assert dry_run_problems(_changed(cfg, dataset__task_encoder__hf_processor_path=str(tmp_path / "same")))[0] == []


def test_another_tokenizer_is_refused(cfg, setup, tmp_path):
    from megatron.bridge.training.tokenizers.config import TokenizerConfig

    other = tmp_path / "tok"
    shutil.copytree(setup["toy"], other)
    (other / "tokenizer.json").write_text(json.dumps(json.loads((other / "tokenizer.json").read_text())) + " ")
    c = _changed(cfg, tokenizer=TokenizerConfig(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(other)))
    errors, _ = dry_run_problems(c)
    assert len(errors) == 1 and "tokenizer.tokenizer_model" in errors[0]


def test_a_hub_processor_is_named_but_not_compared(cfg):
    errors, warnings = dry_run_problems(_changed(cfg, dataset__task_encoder__hf_processor_path="Qwen/Qwen3.5-35B-A3B"))
    assert errors == [] and len(warnings) == 1 and "dataset.task_encoder.hf_processor_path" in warnings[0]


def test_samples_longer_than_the_sequence_name_a_budget_that_fits(cfg):
    """The error offers a max_pixels; with it the dataset fits the sequence."""
    short = _changed(cfg, model__seq_length=52, dataset__seq_length=52)
    [error] = dry_run_problems(short)[0]
    assert "-sl" in error
    fit = int(re.search(r"dataset\.task_encoder\.max_pixels=(\d+)$", error).group(1))
    assert fit < cfg.dataset.task_encoder.max_pixels
    assert dry_run_problems(_changed(short, dataset__task_encoder__max_pixels=fit))[0] == []
    too_big = _changed(short, dataset__task_encoder__max_pixels=fit + (16 * 2) ** 2)
    assert dry_run_problems(too_big)[0] != []


def test_samples_the_task_encoder_would_drop_are_counted(cfg):
    """Each image takes 4 to 16 tokens under the fixture's budget: a cap of 8 drops some samples
    (a warning), a cap of 1 drops them all (an error), a cap of 16 none."""
    errors, warnings = dry_run_problems(_changed(cfg, dataset__task_encoder__max_visual_tokens=8))
    assert errors == [] and any("max_visual_tokens=8" in w for w in warnings)
    errors, _ = dry_run_problems(_changed(cfg, dataset__task_encoder__max_visual_tokens=1))
    assert len(errors) == 1 and "every training sample" in errors[0]
    assert dry_run_problems(_changed(cfg, dataset__task_encoder__max_visual_tokens=16)) == ([], [])


def test_validation_needs_a_val_split(cfg, setup):
    no_val = _changed(cfg, dataset__path=str(setup["root"] / "ds_no_val"))
    [error] = dry_run_problems(no_val)[0]
    assert "dataset.do_validation=false" in error and "--val-fraction" in error
    assert dry_run_problems(_changed(no_val, dataset__do_validation=False))[0] == []


@pytest.mark.parametrize("damage", ["no split.yaml", "other sample loader", "truncated shard", "samples changed"])
def test_a_damaged_dataset_is_refused_naming_the_file(cfg, setup, tmp_path, damage):
    ds = tmp_path / "ds"
    shutil.copytree(setup["dataset"], ds)
    if damage == "no split.yaml":
        (ds / ".nv-meta" / "split.yaml").unlink()
        named = "split.yaml"
    elif damage == "other sample loader":
        (ds / ".nv-meta" / "dataset.yaml").write_text("__module__: megatron.energon\n__class__: VQAWebdataset\n")
        named = "dataset.yaml"
    elif damage == "truncated shard":
        shard = sorted(ds.glob("train-*.tar"))[0]
        shard.write_bytes(shard.read_bytes()[:1000])
        named = shard.name
    else:
        (ds / "samples.parquet").write_bytes((ds / "samples.parquet").read_bytes() + b"x")
        named = "samples.parquet"
    [error] = dry_run_problems(_changed(cfg, dataset__path=str(ds)))[0]
    assert named in error


def test_an_energon_dataset_built_elsewhere_is_checked_for_its_metadata_only(cfg, setup, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(setup["dataset"], ds)
    (ds / "manifest.json").unlink()
    errors, warnings = dry_run_problems(_changed(cfg, dataset__path=str(ds)))
    assert errors == [] and len(warnings) == 1 and "manifest.json" in warnings[0]


def test_the_runner_exits_2_naming_the_field(setup):
    rc, text = _dry_run(
        "--recipe", RECIPE, *setup["fit"], "--dataset", "energon", f"dataset.path={setup['dataset']}",
        f"dataset.task_encoder.hf_processor_path={setup['toy']}", "model.image_token_id=9", "--dry-run",
    )  # fmt: skip
    assert rc == 2 and "[run_recipe] error: model.image_token_id=9" in text and "Traceback" not in text


def test_energon_validates_once_per_interval_by_default():
    cfg = build(RECIPE, dataset="energon")
    assert cfg.validation.eval_iters == 1
