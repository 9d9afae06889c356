"""Resumes, exports and tokenizers that would pair a run with what it was not: a LoRA checkpoint resumed
from other starting weights of the same shape, a Hugging Face folder given where a run's checkpoint
folder belongs, an export whose recipe or template does not fit the run the checkpoint records, a
tracker naming a step that was never saved, a tokenizer override that is not the checkpoint's own, and
an adapter folder of the user's beside an export. Each is refused naming the file or field and the fix
(exit 2), a Hugging Face folder and a tracker before Megatron loads; the right inputs still pass."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from bridge_recipes.hf.toy import CPU_MOE_SIZES, CPU_SIZES, make_toy
from bridge_recipes.training import saved_runs

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TOKENIZER = ROOT / "tests/fixtures/qwen35_chat_tokenizer/tokenizer.json"
CONVERSATIONS = ROOT / "examples/conversations.jsonl"
LORA = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"
DENSE_SFT = "qwen35_27b_sft_8gpu_h200_bf16_config"
MOE_SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
ROW = 512


def _run(main, argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue()


def run_recipe(*argv) -> tuple[int, str]:
    from bridge_recipes.runner.cli import main

    return _run(main, argv)


def convert(*argv) -> tuple[int, str]:
    from bridge_recipes.hf.cli import main

    return _run(main, [*argv, "--no-progress"])


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Toys A and B (one shape, other weights), a dense toy, a tokenizer folder whose tokenizer.json is
    another file than the toys', and rows built with the toys' tokenizer."""
    from bridge_recipes.data.sft_rows import build_sft_rows

    root = tmp_path_factory.mktemp("round6_resume")
    kw = dict(dtype="float32", tokenizer_json=FIXTURE_TOKENIZER, **CPU_SIZES)
    make_toy(root / "a", "moe", seed=0, **kw, **CPU_MOE_SIZES)
    make_toy(root / "b", "moe", seed=1, **kw, **CPU_MOE_SIZES)
    make_toy(root / "dense", "dense", ffn_hidden_size=128, **kw)
    other = root / "other_tokenizer"
    shutil.copytree(root / "a", other, ignore=shutil.ignore_patterns("*.safetensors*", "config.json"))
    (other / "tokenizer.json").write_text(json.dumps(json.loads((other / "tokenizer.json").read_text()), indent=1))
    build_sft_rows(CONVERSATIONS, root / "a", root / "rows", row_tokens=ROW, progress=False)
    return root


def dry_run_args(work: Path, hf: Path, save: Path, *extra) -> list:
    return [
        "--recipe", LORA, "--scale-down", "4", "--dataset", "sft-rows", f"dataset.path={work / 'rows'}",
        "-sl", ROW, "-gb", "8", "--hf-checkpoint", hf, "--save-dir", save, "--dry-run", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(work, tmp_path_factory):
    """A save folder holding a LoRA checkpoint (step 100) of a run started from toy A, as the launch and
    Megatron leave it (run_identity.json, the tracker, iter_0000100/run_config.yaml); and that run's cfg."""
    from bridge_recipes.runner.arguments import build_parser
    from bridge_recipes.runner.cli import build

    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QWEN35_RECIPES_CACHE", str(cache))
        save = work / "saved"
        args = build_parser().parse_intermixed_args([str(a) for a in dry_run_args(work, work / "a", save)])
        with contextlib.redirect_stdout(io.StringIO()):
            _, cfg = build(args)
    it = saved_runs.iteration_folder(save, 100)
    it.mkdir(parents=True)
    (save / saved_runs.TRACKER).write_text("100")
    peft = {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": cfg.peft.dim, "alpha": cfg.peft.alpha}
    run_config = {"model": {"seq_length": cfg.model.seq_length, "num_layers": cfg.model.num_layers}, "peft": peft}
    (it / saved_runs.RUN_CONFIG).write_text(yaml.safe_dump({**run_config, "checkpoint": {}}))
    saved_runs.write_identity(save, saved_runs.run_identity(cfg, LORA))
    return save, cfg


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN35_RECIPES_CACHE", str(tmp_path / "cache"))


# ----------------------------------------------------------------- 5a: other starting weights


def test_a_resume_from_other_starting_weights_of_the_same_shape_is_refused_naming_both(work, lora_run, cache):
    save, _ = lora_run
    assert saved_runs.read_identity(save)["start"]["path"] == str(work / "a")
    code, out = run_recipe(*dry_run_args(work, work / "b", save))
    assert code == 2 and "Traceback" not in out, out
    line = next(x for x in out.splitlines() if "starting weights:" in x)
    assert str(work / "a") in line and str(work / "b") in line and "--fresh" in line


def test_the_same_weights_copied_elsewhere_resume_and_old_identities_stay_readable(work, lora_run, tmp_path):
    save, cfg = lora_run
    saved = saved_runs.read_identity(save)
    copy = shutil.copytree(work / "a", tmp_path / "a_copy")  # new paths, new file times: the same weights
    cfg.checkpoint.hf_source_path = str(copy)
    try:
        this = saved_runs.run_identity(cfg, LORA)
    finally:
        cfg.checkpoint.hf_source_path = str(work / "a")
    assert this["start"]["path"] == str(copy) and saved_runs.identity_differences(saved, this) == []
    old = {k: v for k, v in saved.items() if k != "start"}  # written before the starting weights were recorded
    assert saved_runs.identity_differences(old, this) == []


# ----------------------------------------------------------------- 5c: a Hugging Face folder as a checkpoint folder


@pytest.mark.parametrize(
    "flag, key",
    [
        ("--load-dir", "checkpoint.load"),
        ("--save-dir", "checkpoint.save"),
        ("--pretrained-checkpoint", "checkpoint.pretrained_checkpoint"),
        (None, "checkpoint.load"),
    ],
)
def test_a_hugging_face_folder_given_as_a_checkpoint_folder_points_at_hf_checkpoint(work, flag, key):
    given = [flag, work / "b"] if flag else [f"{key}={work / 'b'}"]
    code, out = run_recipe("--recipe", LORA, "--dry-run", "--scale-down", "4", *given)
    assert code == 2 and "Traceback" not in out, out
    assert f"{key}={work / 'b'}" in out and f"--hf-checkpoint {work / 'b'}" in out
    assert "loading Megatron-Bridge" not in out  # a look at the folder answers it


def test_a_file_given_as_the_resume_folder_is_refused_before_loading(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    code, out = run_recipe("--recipe", LORA, "--dry-run", "--scale-down", "4", "--load-dir", tmp_path / "notes.txt")
    assert code == 2 and f"checkpoint.load={tmp_path / 'notes.txt'} (--load-dir) is a file" in out, out
    assert "loading Megatron-Bridge" not in out


def test_one_iteration_folder_as_the_resume_folder_resumes_that_step(lora_run):
    from bridge_recipes.runner import checks
    from bridge_recipes.runner.checkpoints import resume_line

    save, cfg = lora_run
    before = cfg.checkpoint.load
    cfg.checkpoint.load = str(saved_runs.iteration_folder(save, 100))  # Megatron-Bridge loads such a folder
    try:
        messages = [p.message for p in checks.errors(checks.check(cfg, 1, LORA))]
        line = resume_line(cfg)
    finally:
        cfg.checkpoint.load = before
    assert messages == [] and line.startswith(f"yes, from step 100 of {cfg.checkpoint.save}/iter_0000100"), line


def test_a_config_files_load_folder_naming_a_hugging_face_folder_is_refused(work, lora_run):
    from bridge_recipes.runner import checks

    _, cfg = lora_run
    before = cfg.checkpoint.load
    cfg.checkpoint.load = str(work / "b")
    try:
        messages = [p.message for p in checks.errors(checks.check(cfg, 1, LORA))]
    finally:
        cfg.checkpoint.load = before
    assert any("Hugging Face folder" in m and f"--hf-checkpoint {work / 'b'}" in m for m in messages), messages


# ----------------------------------------------------------------- 5d: the export against the run it exports


def test_an_export_whose_recipe_and_template_do_not_fit_the_saved_run_is_refused(work, lora_run, tmp_path):
    save, _ = lora_run
    code, out = convert(
        "export", "--megatron", save, "--hf-template", work / "dense", "--recipe", DENSE_SFT, "--scaled",
        "--out", tmp_path / "ex",
    )  # fmt: skip
    assert code == 2 and "Traceback" not in out and "needs a CUDA GPU" not in out, out
    assert "another model family" in out and "full fine-tuning recipe" in out and "model.num_moe_experts" in out
    assert f"--recipe {LORA}" in out and str(work / "a") in out  # the fix: the run's recipe and its weights
    assert not (tmp_path / "ex").exists()


@pytest.mark.parametrize("recipe", [LORA, MOE_SFT], ids=["lora_recipe", "full_recipe"])
def test_a_lora_export_into_other_weights_or_with_a_full_recipe_is_refused(work, lora_run, tmp_path, recipe):
    save, _ = lora_run
    template = work / ("b" if recipe == LORA else "a")
    code, out = convert(
        "export",
        "--megatron",
        save,
        "--hf-template",
        template,
        "--recipe",
        recipe,
        "--scaled",
        "--out",
        tmp_path / "x",
    )
    assert code == 2 and "needs a CUDA GPU" not in out, out
    if recipe == LORA:
        assert f"--hf-template {work / 'b'} holds other weights" in out and str(work / "a") in out
    else:
        assert "full fine-tuning recipe" in out


def test_the_export_the_saved_run_fits_passes_its_checks(work, lora_run, tmp_path):
    save, _ = lora_run
    copy = shutil.copytree(work / "a", tmp_path / "a_copy")
    code, out = convert(
        "export", "--megatron", save, "--hf-template", copy, "--recipe", LORA, "--scaled", "--out", tmp_path / "x"
    )
    assert code == 2 and "the checks passed" in out, out  # on this CPU machine the conversion cannot start


def test_an_export_of_one_iteration_folder_names_the_runs_folder(work, lora_run, tmp_path):
    save, _ = lora_run
    it = saved_runs.iteration_folder(save, 100)
    code, out = convert(
        "export", "--megatron", it, "--hf-template", work / "a", "--recipe", LORA, "--out", tmp_path / "x"
    )
    assert code == 2 and f"--megatron {save} " in out and "iteration folder" in out, out


def test_a_checkpoint_saved_without_an_identity_is_compared_on_its_run_config(work, tmp_path):
    save = tmp_path / "old"
    it = saved_runs.iteration_folder(save, 7)
    it.mkdir(parents=True)
    (save / saved_runs.TRACKER).write_text("7")
    model = {"num_layers": 4, "hidden_size": CPU_SIZES["hidden_size"], "num_moe_experts": 4, "seq_length": ROW}
    (it / saved_runs.RUN_CONFIG).write_text(yaml.safe_dump({"model": model, "checkpoint": {}, "peft": None}))
    code, out = convert(
        "export", "--megatron", save, "--hf-template", work / "dense", "--recipe", "qwen35_27b", "--scaled",
        "--out", tmp_path / "x",
    )  # fmt: skip
    assert code == 2 and "run_config.yaml" in out and "model.num_moe_experts: the run has 4" in out, out


# ----------------------------------------------------------------- 5e, 5f: a tracker naming no saved step


@pytest.fixture
def bad_tracker(lora_run, tmp_path) -> Path:
    save, _ = lora_run
    folder = Path(shutil.copytree(save, tmp_path / "ck"))
    (folder / saved_runs.TRACKER).write_text("200")
    return folder


def test_an_export_of_a_tracker_naming_a_missing_step_names_the_tracker_and_the_steps(work, bad_tracker, tmp_path):
    code, out = convert(
        "export", "--megatron", bad_tracker, "--hf-template", work / "a", "--recipe", LORA, "--scaled",
        "--out", tmp_path / "x",
    )  # fmt: skip
    assert code == 2 and "needs a CUDA GPU" not in out, out
    assert str(bad_tracker / saved_runs.TRACKER) in out and "step 200" in out and "echo 100 >" in out


@pytest.mark.parametrize("flag", ["--save-dir", "--load-dir"])
def test_a_resume_from_a_tracker_naming_a_missing_step_is_refused_before_loading(work, bad_tracker, flag):
    code, out = run_recipe("--recipe", LORA, "--dry-run", "--scale-down", "4", flag, bad_tracker)
    assert code == 2 and "loading Megatron-Bridge" not in out, out
    assert str(bad_tracker / saved_runs.TRACKER) in out and "step 200" in out and "steps saved there: 100" in out
    assert "full fine-tuning" not in out


def test_a_tracker_is_checked_in_every_way_it_can_disagree(bad_tracker):
    from bridge_recipes.runner.checkpoints import given_folder_problem

    with pytest.raises(saved_runs.CheckpointMetadataError, match=r"step 200.*steps saved there: 100"):
        saved_runs.latest_run_config(bad_tracker)
    (bad_tracker / saved_runs.TRACKER).write_text("latest\n")
    assert "not a step number" in saved_runs.tracker_problem(bad_tracker)
    (bad_tracker / saved_runs.TRACKER).unlink()  # finished saves, no tracker: Megatron would start over
    assert f"echo 100 > {bad_tracker / saved_runs.TRACKER}" in saved_runs.tracker_problem(bad_tracker)
    assert given_folder_problem("checkpoint.save", str(bad_tracker), fresh=True) is None  # --fresh leaves it
    pretrained = given_folder_problem("checkpoint.pretrained_checkpoint", str(bad_tracker), fresh=True)
    assert "--pretrained-checkpoint" in pretrained and saved_runs.TRACKER in pretrained  # weights to start from
    assert saved_runs.fresh_folder(bad_tracker) == bad_tracker / "fresh_1"


# ----------------------------------------------------------------- 6: tokenizer overrides


@pytest.mark.parametrize(
    "key, value",
    [
        ("tokenizer.tokenizer_model", "other_tokenizer"),
        ("dataset.tokenizer_path", "other_tokenizer"),
        ("tokenizer.tokenizer_type", "NullTokenizer"),
    ],
)
def test_a_tokenizer_override_that_is_not_the_checkpoints_is_refused(work, tmp_path, cache, key, value):
    value = work / value if value == "other_tokenizer" else value
    code, out = run_recipe(*dry_run_args(work, work / "a", tmp_path / "ck"), f"{key}={value}")
    assert code == 2 and "Traceback" not in out and "checks: ok" not in out, out
    line = next(x for x in out.splitlines() if "error" in x and f"{key}={value}" in x)
    assert str(work / "a") in line and f"drop {key}" in line


def test_rows_are_checked_against_the_checkpoints_own_tokenizer_too(work, lora_run, tmp_path):
    """A tokenizer override with the checkpoint's tokenizer.json but another chat template passes the
    override check; rows rendered with that template are refused against the checkpoint's own."""
    from bridge_recipes.data.packed_rows import dry_run_problems
    from bridge_recipes.data.sft_rows import build_sft_rows

    _, cfg = lora_run
    templated = Path(shutil.copytree(work / "a", tmp_path / "tok", ignore=shutil.ignore_patterns("*.safetensors*")))
    (templated / "chat_template.jinja").write_text(
        (templated / "chat_template.jinja").read_text().replace("<|im_start|>", "<|im_start|> ", 1)
    )
    build_sft_rows(CONVERSATIONS, templated, tmp_path / "rows", row_tokens=ROW, progress=False)
    before = cfg.dataset.path, cfg.tokenizer.tokenizer_model
    cfg.dataset.path, cfg.tokenizer.tokenizer_model = str(tmp_path / "rows"), str(templated)
    try:
        errors, _ = dry_run_problems(cfg)
    finally:
        cfg.dataset.path, cfg.tokenizer.tokenizer_model = before
    assert any("chat template" in e and str(work / "a") in e for e in errors), errors


# ----------------------------------------------------------------- 8f: the adapter folder beside an export


def test_an_adapter_folder_of_the_users_is_named_as_such_and_overwrite_not_offered(work, lora_run, tmp_path):
    save, _ = lora_run
    adapter = tmp_path / "ex-adapter"
    adapter.mkdir()
    (adapter / "notes.txt").write_text("mine")
    argv = ["export", "--megatron", save, "--hf-template", work / "a", "--recipe", LORA, "--scaled"]
    for extra in ([], ["--overwrite"]):
        code, out = convert(*argv, "--out", tmp_path / "ex", *extra)
        assert code == 2 and "Traceback" not in out, out
        assert f"the adapter folder {adapter} beside --out" in out and "notes.txt" in out
        assert "pass --overwrite" not in out and "--overwrite replaces only" in out
    assert (adapter / "notes.txt").read_text() == "mine" and not (tmp_path / "ex").exists()


def test_run_recipe_names_the_adapter_folder_beside_export_hf(tmp_path):
    from bridge_recipes.hf.released import adapter_folder
    from bridge_recipes.hf.run_hooks import check_export_target

    cfg = SimpleNamespace(
        checkpoint=SimpleNamespace(save=str(tmp_path / "run"), load=None, pretrained_checkpoint=None),
        dataset=SimpleNamespace(path=None),
        peft=object(),
    )
    adapter_folder(tmp_path / "ex").mkdir()
    (adapter_folder(tmp_path / "ex") / "notes.txt").write_text("mine")
    with pytest.raises(ValueError) as info:
        check_export_target(cfg, str(tmp_path / "ex"))
    msg = str(info.value)
    assert f"the adapter folder {adapter_folder(tmp_path / 'ex')} beside --export-hf" in msg and "notes.txt" in msg
