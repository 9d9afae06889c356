"""Bad settings answered at the dry run: each one exits 2 with a message naming the field, its value
and the fix, instead of a traceback, a failure on the GPU, or a misleading hint."""

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bridge_recipes.runner.cli import main

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
VL_RECIPE = "qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config"


def _run(*argv) -> tuple[int, str]:
    """The runner in this process: exit code and stdout + stderr."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue()


def _dry_run(*argv) -> tuple[int, str]:
    return _run("--recipe", RECIPE, "--dry-run", "--world-size", "8", *argv)


# ----------------------------------------------------------------- override keys


@pytest.mark.parametrize("token", ["train..train_iters=5", ".train.train_iters=5", "train.=5", "~train..x"])
def test_an_empty_key_part_is_named_not_a_traceback(token):
    code, text = _dry_run(token)
    assert code == 2 and "Traceback" not in text
    assert "empty part" in text and repr(token.split("=")[0].lstrip("~")) in text


# ----------------------------------------------------------------- a VL checkpoint's token ids


@pytest.fixture(scope="module")
def vl_setup(tiny_vl_toy, tmp_path_factory):
    """The tiny VL toy, a dataset built with its processor, and the flags that fit the recipe to it
    (no model.*_token_id overrides: the ids come from the checkpoint)."""
    from bridge_recipes.hf.toy import model_overrides
    from bridge_recipes.vl.synthetic_images import write_conversations
    from bridge_recipes.vl.vl_dataset import build_vl_dataset

    root = tmp_path_factory.mktemp("round4_vl")
    toy, spec = tiny_vl_toy
    build_vl_dataset(
        write_conversations(root / "data", 12, seed=3), toy, root / "ds", val_fraction=0.25, progress=False
    )
    fit = ["--scale-down", "4", "--scale-experts", spec.num_experts, "-gb", "8", "-sl", "256", "--max-steps", "1"]
    fit += ["--warmup-iters", "0", *model_overrides(spec)]
    fit += ["dataset.task_encoder.min_pixels=4096", "dataset.task_encoder.max_pixels=16384"]
    return {"toy": toy, "dataset": root / "ds", "fit": fit}


def test_the_vl_checkpoint_token_ids_become_the_models(vl_setup):
    toy = vl_setup["toy"]
    ids = {k: v for k, v in json.loads((toy / "config.json").read_text()).items() if k.endswith("_token_id")}
    code, text = _run(
        "--recipe", VL_RECIPE, *vl_setup["fit"], "--dataset", "energon", f"dataset.path={vl_setup['dataset']}",
        "--hf-checkpoint", toy, "--dry-run", "--show-yaml",
    )  # fmt: skip
    assert code == 0, text[-2000:]
    assert ids["image_token_id"] != 248056  # the toy's processor has its own ids
    for name in ("image_token_id", "video_token_id", "vision_start_token_id"):
        assert f"model.{name}: " in text and f"  {name}: {ids[name]}\n" in text


def test_token_ids_are_read_from_text_config_and_checked(tmp_path):
    from bridge_recipes.hf import architecture
    from bridge_recipes.hf import checkpoint as ck
    from bridge_recipes.hf.files import HfCheckpointError

    config = {"model_type": "qwen3_5_moe", "text_config": {"image_token_id": 7, "video_token_id": 8}}
    folder = ck.HfFolder(path=tmp_path, config=config, shards=[])
    assert architecture.vision_token_ids(folder) == {"image_token_id": 7, "video_token_id": 8}
    config["image_token_id"] = 9  # the top level wins, as in transformers' VL configs
    assert architecture.vision_token_ids(folder)["image_token_id"] == 9
    config["video_token_id"] = "8"
    with pytest.raises(HfCheckpointError, match="video_token_id is '8'"):
        architecture.vision_token_ids(folder)
    text = ck.HfFolder(path=tmp_path, config={"model_type": "qwen3_5_moe_text", "image_token_id": 1}, shards=[])
    assert architecture.vision_token_ids(text) == {}


# ----------------------------------------------------------------- layer count against the layer patterns


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["model.num_layers=38"], ["model.linear_attention_freq lists 40", "model.num_layers=38", "num_layers=40"]),
        (["model.linear_attention_freq=[1,1,1,0]"], ["lists 4 layers", "model.linear_attention_freq=4"]),
        (["model.linear_attention_freq=3"], ["not a multiple of model.linear_attention_freq=3"]),
        (["model.linear_attention_freq=0"], ["model.linear_attention_freq=0", "integer >= 1"]),
        (["model.moe_layer_freq=[1,1]"], ["model.moe_layer_freq lists 2", "model.moe_layer_freq=1"]),
    ],
)
def test_a_layer_pattern_that_does_not_fit_the_layers_is_refused(overrides, words):
    code, text = _dry_run(*overrides)
    assert code == 2 and "Traceback" not in text
    assert all(w in text for w in words), text[-1500:]


def test_the_recipes_own_layer_pattern_passes():
    from bridge_recipes import build
    from bridge_recipes.runner.checks import layer_pattern_problems

    assert layer_pattern_problems(build(RECIPE).model) == []
    assert layer_pattern_problems(build(RECIPE, overrides=["model.linear_attention_freq=4"]).model) == []


# ----------------------------------------------------------------- rows against the vocabulary and rows_per_sample

CHATML = ROOT / "tests/fixtures/chatml_tokenizer.json"
GOOD = {
    "messages": [
        {"role": "user", "content": "what is the capital of france, and why is it there?"},
        {"role": "assistant", "content": "paris; the river seine made it a crossing and a port long ago."},
    ]
}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    from bridge_recipes.data.sft_rows import build_sft_rows

    root = tmp_path_factory.mktemp("round4_rows")
    src = root / "in.jsonl"
    src.write_text("".join(json.dumps(GOOD) + "\n" for _ in range(40)))
    build_sft_rows(src, CHATML, root / "rows", row_tokens=256, chat_format="chatml", progress=False)
    return root / "rows"


def _rows_dry_run(rows, *argv):
    return _dry_run("--dataset", "sft-rows", f"dataset.path={rows}", "-sl", "256", "-mb", "1", *argv)


def test_the_rows_pass_as_built(rows):
    code, text = _rows_dry_run(rows)
    assert code == 0, text[-1500:]


@pytest.mark.parametrize(
    "overrides,field",
    [(["dataset.vocab_size=100"], "dataset.vocab_size=100"), (["model.vocab_size=100"], "model.vocab_size=100")],
)
def test_a_vocabulary_below_the_rows_token_ids_names_the_field(rows, overrides, field):
    code, text = _rows_dry_run(rows, *overrides, "tokenizer.vocab_size=100")
    assert code == 2 and "Traceback" not in text
    assert "holds token id" in text and field in text, text[-1500:]


@pytest.mark.parametrize("value", [0, -2])
def test_rows_per_sample_below_one_names_its_range(rows, value):
    code, text = _rows_dry_run(rows, f"dataset.rows_per_sample={value}")
    assert code == 2 and "Traceback" not in text
    assert f"dataset.rows_per_sample={value} must be an integer >= 1" in text
    assert "set model.seq_length" not in text  # the old hint: a seq_length of 0 or below


# ----------------------------------------------------------------- where the run writes


def test_a_cache_variable_naming_a_file_is_refused_at_the_dry_run(vl_setup, tmp_path, monkeypatch):
    from bridge_recipes.hf.importer import CACHE_ENV

    blocker = tmp_path / "cache_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker))
    data = ["--dataset", "energon", f"dataset.path={vl_setup['dataset']}"]
    code, text = _run("--recipe", VL_RECIPE, *vl_setup["fit"], *data, "--hf-checkpoint", vl_setup["toy"], "--dry-run")
    assert code == 2 and "Traceback" not in text
    assert f"${CACHE_ENV}={blocker}" in text and "is a file" in text, text[-1500:]
    assert blocker.read_text() == "not a folder"


def test_the_cache_check_passes_a_folder_and_names_a_file_on_the_way(tmp_path, monkeypatch):
    from bridge_recipes.hf.importer import CACHE_ENV, cache_problem

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "new" / "cache"))
    assert cache_problem() is None  # created at launch
    (tmp_path / "f").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "f" / "cache"))
    assert f"{tmp_path / 'f'} is a file" in cache_problem()


@pytest.mark.parametrize("where", ["save_inside", "save_is", "save_holds"])
def test_a_save_folder_in_the_rows_folder_is_refused(rows, where):
    save = {"save_inside": rows / "ckpt", "save_is": rows, "save_holds": rows.parent}[where]
    code, text = _rows_dry_run(rows, "--save-dir", save)
    assert code == 2 and "Traceback" not in text
    assert "checkpoint.save" in text and f"dataset.path {rows}" in text and "mixed" in text
    assert not (rows / "ckpt").exists()


def test_an_export_folder_in_the_rows_folder_is_refused(rows):
    from types import SimpleNamespace

    from bridge_recipes.hf.run_hooks import check_export_target

    cfg = SimpleNamespace(
        checkpoint=SimpleNamespace(save=str(rows.parent / "save"), load=None, pretrained_checkpoint=None),
        dataset=SimpleNamespace(path=str(rows)),
    )
    with pytest.raises(ValueError, match=r"export_hf .*/hf is inside dataset.path"):
        check_export_target(cfg, str(rows / "hf"))
    check_export_target(cfg, str(rows.parent / "hf"))  # beside the data: fine


# ----------------------------------------------------------------- config files


@pytest.fixture(scope="module")
def saved_text():
    import bridge_recipes
    from bridge_recipes.config import files as config_files

    return config_files.to_text(bridge_recipes.build(RECIPE), RECIPE)


def test_a_duplicate_key_in_a_config_file_names_the_key_and_lines(saved_text, tmp_path):
    lines = saved_text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("  train_iters:"))
    lines.insert(at + 1, "  train_iters: 5\n")  # the same key again, in the train section
    path = tmp_path / "cfg.yaml"
    path.write_text("".join(lines))
    code, text = _run("--config-file", path, "--dry-run", "--world-size", "8")
    assert code == 2 and "Traceback" not in text
    assert str(path) in text and "train.train_iters" in text and f"lines {at + 1} and {at + 2}" in text, text[-800:]


def test_a_recipe_line_of_another_kind_of_model_is_refused(saved_text, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(saved_text.replace(f"# recipe: {RECIPE}", f"# recipe: {VL_RECIPE}"))
    code, text = _run("--config-file", path, "--dry-run", "--world-size", "8")
    assert code == 2 and "Traceback" not in text
    assert f"# recipe: {VL_RECIPE}" in text and "vision-language" in text and "text MoE" in text, text[-800:]
    path.write_text(saved_text.replace(f"# recipe: {RECIPE}\n", f"# recipe: {RECIPE}\n# recipe: {VL_RECIPE}\n"))
    code, text = _run("--config-file", path, "--dry-run", "--world-size", "8")
    assert code == 2 and "names 2 recipes" in text


def test_a_config_file_as_saved_still_builds(saved_text, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(saved_text)
    code, text = _run("--config-file", path, "--dry-run", "--world-size", "8")
    assert code == 0, text[-1500:]


# ----------------------------------------------------------------- messages that pointed the wrong way


def test_a_manifest_field_of_the_wrong_type_is_named_as_such(rows, tmp_path):
    copy = tmp_path / "rows"
    shutil.copytree(rows, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["row_tokens"] = str(manifest["row_tokens"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, text = _rows_dry_run(copy)
    assert code == 2 and "Traceback" not in text
    assert re.search(r"manifest field row_tokens\b.*string \('256'\)", text) and "not 256" not in text, text[-1500:]


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("rows", -1, "rows is -1, below 0"),
        ("packing", "zigzag", "packing is 'zigzag'"),
        ("eos_token_id", 1.5, "a number with a fraction (1.5), not an integer or null"),
    ],
)
def test_manifest_field_types_and_values_are_checked(rows, tmp_path, field, value, words):
    from bridge_recipes.data.integrity import RowsIntegrityError, read_manifest

    copy = tmp_path / "rows"
    shutil.copytree(rows, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest[field] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RowsIntegrityError, match=f"manifest field {field}") as info:
        read_manifest(copy)
    assert words in str(info.value)


def test_inspect_rows_without_a_validation_split_says_how_to_build_one(rows):
    from bridge_recipes.data.inspect_rows import inspect_rows
    from bridge_recipes.data.integrity import VAL_DIR, RowsIntegrityError

    assert not (rows / VAL_DIR).exists()
    with pytest.raises(RowsIntegrityError) as info:
        inspect_rows(rows, split="val")
    err = str(info.value)
    assert "no validation split" in err and "--val-fraction" in err and "--val-input" in err
    assert f"--out {rows / VAL_DIR}" not in err  # the old hint: build rows into val/ by hand


def _compare_losses(*argv) -> tuple[int, str, str]:
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts/compare_losses.py"), *map(str, argv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, p.stdout, p.stderr


def test_compare_losses_reports_two_identical_runs_as_agreeing(tmp_path):
    curve = "".join(f"{s} {10 / s}\n" for s in range(1, 11))
    (tmp_path / "a.txt").write_text(curve)
    (tmp_path / "b.txt").write_text(curve)
    code, out, err = _compare_losses(tmp_path / "a.txt", tmp_path / "b.txt")
    assert code == 0 and json.loads(out)["passed"] is True, err
    code, _, err = _compare_losses(tmp_path / "a.txt", tmp_path / "a.txt")  # one file twice: a slip
    assert code == 2 and "given twice" in err


@pytest.mark.parametrize("bad", ["inf", "nan", "-Infinity"])
def test_compare_losses_reports_a_non_finite_loss_as_a_divergence(tmp_path, bad):
    (tmp_path / "a.txt").write_text("".join(f"{s} {10 / s}\n" for s in range(1, 11)))
    (tmp_path / "b.txt").write_text("".join(f"{s} {bad if s == 7 else 10 / s}\n" for s in range(1, 11)))
    code, out, err = _compare_losses(tmp_path / "a.txt", tmp_path / "b.txt", "--out", tmp_path / "r.json")
    assert code == 1 and "error" not in err
    reasons = json.loads(out)["reasons"]
    assert any("candidate" in r and "step 7" in r and "diverged" in r for r in reasons), reasons
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is False  # strict JSON: no bare inf


def test_a_megatron_log_with_a_nan_loss_is_a_divergence(tmp_path):
    def line(s, loss):
        return (
            f" [t] iteration {s}/ 10 | elapsed time per iteration (ms): 100.0 | global batch size: 8 | "
            f"lm loss: {loss} |\n"
        )

    (tmp_path / "a.log").write_text("".join(line(s, f"{10 / s:.6E}") for s in range(1, 11)))
    (tmp_path / "b.log").write_text("".join(line(s, "nan" if s > 5 else f"{10 / s:.6E}") for s in range(1, 11)))
    code, out, _ = _compare_losses(tmp_path / "a.log", tmp_path / "b.log")
    assert code == 1 and "diverged" in out


@pytest.mark.parametrize(
    "part,named",
    [
        ({"type": "image", "image": None}, "part 0 (image) has a null image"),
        ({"type": "image_url", "image_url": {"url": None}}, "has a null image_url"),
        (None, "part 0 is null"),
    ],
)
def test_a_null_image_part_is_named_with_its_record(part, named):
    from bridge_recipes.chat.conversations import MalformedConversation
    from bridge_recipes.vl.vl_conversations import parse_record

    record = {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "hi"}]}, REPLY]}
    with pytest.raises(MalformedConversation) as info:
        parse_record(record, 7, ROOT)
    assert info.value.reason == "image_null" and "source row 7" in str(info.value) and named in str(info.value)
    assert "parts are text" not in str(info.value)  # the old message: as if images were unsupported


@pytest.mark.parametrize(
    "images,named", [({"images": [None]}, "images[0] is null"), ({"image": None}, "image is null")]
)
def test_a_null_llava_image_is_named_with_its_record(images, named):
    from bridge_recipes.chat.conversations import MalformedConversation
    from bridge_recipes.vl.vl_conversations import parse_record

    with pytest.raises(MalformedConversation) as info:
        parse_record({"messages": [{"role": "user", "content": "<image> what?"}, REPLY], **images}, 3, ROOT)
    assert info.value.reason == "image_null" and "source row 3" in str(info.value) and named in str(info.value)


REPLY = {"role": "assistant", "content": "a picture"}


def test_a_vl_recipe_on_mock_data_is_pointed_at_energon():
    code, text = _run("--recipe", VL_RECIPE, "--dataset", "mock", "--dry-run", "--world-size", "8")
    assert "MOCK" in text and "--dataset energon" in text and "build_vl_dataset.py" in text
    assert "sft-rows" not in text  # VL recipes refuse rows
    code, text = _dry_run("--dataset", "mock")
    assert "--dataset sft-rows" in text  # a text recipe still is


@pytest.mark.parametrize("var", ["HF_HOME", "HF_HUB_CACHE"])
def test_a_hugging_face_cache_variable_naming_a_file_is_named(var, tmp_path, monkeypatch):
    from bridge_recipes.hf.checkpoint import resolve_source
    from bridge_recipes.hf.files import HfCheckpointError

    (tmp_path / "file").write_text("x")
    monkeypatch.setenv(var, str(tmp_path / "file"))
    with pytest.raises(HfCheckpointError, match=rf"\${var}=.* is a file"):
        resolve_source("Qwen/Qwen3.5-27B")
