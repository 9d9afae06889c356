"""Config files, edited as users edit them: sections of the wrong kind named before Megatron loads, the
features a file leaves out taken from its recipe (never the dataclass defaults), a saved ``--epochs``
that follows rows rebuilt since, and a ``# recipe:`` line changed to a recipe of another task or GPU
count refused."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

import bridge_recipes
from bridge_recipes.config import files as config_files
from bridge_recipes.recipes import registry
from bridge_recipes.runner.cli import main

LORA = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"  # flash_varlen attention and the chunked loss
SFT = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"
PA = "  packed_attention:\n    _target_: bridge_recipes.features.packed_attention.Config\n"
CL = "  chunked_loss:\n    _target_: bridge_recipes.features.chunked_loss.Config\n    enabled: true\n"


def _run(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue()


@pytest.fixture(scope="module")
def saved() -> str:
    """The H100 LoRA recipe scaled down, as --save-config writes it."""
    cfg = bridge_recipes.build(LORA, scale_down=4)
    return config_files.to_text(cfg, LORA, written_for=True)


def _features(text: str) -> str:
    m = re.search(r"^features:\n(?:  .*\n)+", text, re.M)
    assert m
    return m.group(0)


def _section(text: str, name: str) -> str:
    m = re.search(rf"^{name}:.*\n(?:[ -].*\n)*", text, re.M)
    assert m
    return m.group(0)


# ----------------------------------------------------------------- 1: sections of the wrong kind


@pytest.mark.parametrize(
    "edit,key",
    [
        (lambda b: "features: 5\n", "features"),
        (lambda b: "features:\n- flash_varlen\n- chunked_loss\n", "features"),
        (lambda b: "features: null\n", "features"),
        (
            lambda b: b.replace(PA + "    mode: flash_varlen\n", "  packed_attention: flash_varlen\n"),
            "features.packed_attention",
        ),
        (lambda b: b.replace(PA, "  packed_attention:\n"), "features.packed_attention"),
        (lambda b: b.replace("  _target_: bridge_recipes.features.Features\n", ""), "features"),
        (
            lambda b: b.replace(PA, PA.replace("packed_attention.Config", "chunked_loss.Config")),
            "features.packed_attention",
        ),
        (lambda b: b.replace("    enabled: true\n", "    enabled: maybe\n", 1), "features.chunked_loss.enabled"),
        (lambda b: b.replace("  chunked_loss:\n", "  chunked_los:\n"), "features.chunked_los"),
    ],
    ids=["five", "list", "null", "scalar", "block_no_target", "section_no_target", "other_class", "setting", "typo"],
)
def test_a_features_section_of_the_wrong_kind_is_named_before_megatron_loads(saved, tmp_path, edit, key):
    path = tmp_path / "run.yaml"
    block = _features(saved)
    path.write_text(saved.replace(block, edit(block)))
    code, text = _run("--config-file", path, "--dry-run")
    assert code == 2 and "Traceback" not in text, text[-2000:]
    assert re.search(rf"config file {re.escape(str(path))}: {re.escape(key)}\b", text), text[-2000:]
    assert "loading Megatron-Bridge" not in text


@pytest.mark.parametrize(
    "section,value,words",
    [
        ("ddp", "5", "ddp is 5"),
        ("model", "[1, 2]", "model is [1, 2]"),
        ("rng", "null", "rng is null"),
        ("logger", "{log_interval: 1}", "logger has no _target_"),
        ("env_vars", "[A]", "env_vars is ['A']"),
        ("mixed_precision", "7", "mixed_precision is 7"),
        ("peft", "lora", "peft is 'lora'"),
        ("ddp", None, "the 'ddp' section is missing"),
        ("peft", None, "'peft: null' where the run has none"),
    ],
)
def test_every_section_is_held_to_its_kind(saved, tmp_path, section, value, words):
    path = tmp_path / "run.yaml"
    path.write_text(saved.replace(_section(saved, section), "" if value is None else f"{section}: {value}\n"))
    code, text = _run("--config-file", path, "--dry-run")
    assert code == 2 and words in text and "Traceback" not in text, text[-2000:]
    assert "loading Megatron-Bridge" not in text


@pytest.mark.parametrize(
    "section,edit,words",
    [
        ("train", lambda b: "train:\n  _target_: megatron.bridge.training.config.TrainingConfig\n", "train lacks"),
        (
            "rng",
            lambda b: "rng:\n  _target_: megatron.bridge.training.config.TrainingConfig\n",
            "rng is a TrainingConfig",
        ),
        ("ddp", lambda b: re.sub(r"\n  overlap_grad_reduce: .*", "", b), "ddp lacks overlap_grad_reduce"),
    ],
)
def test_a_section_lacking_fields_or_of_another_class_is_refused(saved, tmp_path, section, edit, words):
    path = tmp_path / "run.yaml"
    block = _section(saved, section)
    path.write_text(saved.replace(block, edit(block)))
    try:
        bridge_recipes.build(LORA, config_file=str(path))
    except ValueError as exc:
        assert f"config file {path}: " in str(exc) and words in str(exc), exc
    else:
        raise AssertionError(f"{section} edited as {words!r} was built")


# ----------------------------------------------------------------- 2: features left out are the recipe's


@pytest.mark.parametrize(
    "edit,missing",
    [
        (lambda t: t.replace(_features(t), ""), "features"),
        (
            lambda t: t.replace(_features(t), "").replace(config_files.CONTAINER, config_files.CONTAINERS[1]),
            "features",
        ),
        (lambda t: t.replace(CL, ""), "features.chunked_loss"),
        (lambda t: t.replace(PA + "    mode: flash_varlen\n", PA), "features.packed_attention.mode"),
    ],
    ids=["section", "plain_container", "block", "setting"],
)
def test_features_a_file_leaves_out_are_its_recipes_said_in_one_line(saved, tmp_path, edit, missing):
    path = tmp_path / "run.yaml"
    path.write_text(edit(saved))
    said: list[str] = []
    cfg = bridge_recipes.build(LORA, config_file=str(path), report=said.append)
    assert cfg.features.packed_attention.mode == "flash_varlen" and cfg.features.chunked_loss.enabled
    assert cfg.features == registry.load(LORA)().features
    lines = [line for line in said if f"has no {missing}:" in line]
    assert len(lines) == 1 and LORA in lines[0], said


def test_a_file_without_features_and_without_its_recipe_is_refused(saved, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(saved.replace(_features(saved), ""))
    with pytest.raises(config_files.ConfigFileError, match=r"has no features.*'# recipe: NAME'"):
        config_files.load(path)


# ----------------------------------------------------------------- 5b: the epochs a file was saved with


def _rows(folder: Path, conversations: int) -> int:
    from bridge_recipes.data.sft_rows import build_sft_rows

    chats = [
        {"messages": [{"role": "user", "content": f"Day {i}?"}, {"role": "assistant", "content": "Sunny. " * 30}]}
        for i in range(conversations)
    ]
    src = folder.parent / f"chats{conversations}.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in chats))
    return build_sft_rows(src, TOKENIZER, folder, row_tokens=256, progress=False, overwrite=True)["rows"]


def test_a_saved_epochs_sets_the_steps_from_the_rows_as_they_are_at_load(tmp_path):
    rows, saved = tmp_path / "rows", tmp_path / "run.yaml"
    first = _rows(rows, 200)
    argv = ["--recipe", SFT, "--dataset", "sft-rows", f"dataset.path={rows}", "-sl", "256", "-gb", "8"]
    code, text = _run(*argv, "--epochs", "2", "--dry-run", "--save-config", saved)
    assert code == 0, text[-2000:]
    assert "# epochs: 2\n" in saved.read_text() and f"train_iters: {2 * first // 8}\n" in saved.read_text()
    again = _rows(rows, 400)
    assert again > first
    code, text = _run("--config-file", saved, "--dry-run", "--world-size", "8")
    assert code == 0, text[-2000:]
    assert re.search(rf"^length +{2 * again // 8} steps .* of {again} rows$", text, re.M), text[-2000:]


def test_a_step_count_on_the_command_line_wins_over_the_files_epochs(tmp_path, capsys):
    from bridge_recipes.runner.arguments import build_parser, take_run_options

    path = tmp_path / "run.yaml"
    path.write_text(config_files.to_text(bridge_recipes.build(SFT), SFT, {"epochs": "2"}, written_for=True))
    args = build_parser().parse_intermixed_args(["--config-file", str(path), "--dry-run"])
    take_run_options(args)
    assert args.epochs == 2.0
    for extra in (["--max-steps", "3"], ["train.train_iters=3"]):
        args = build_parser().parse_intermixed_args(["--config-file", str(path), "--dry-run", *extra])
        take_run_options(args)
        assert args.epochs is None and "'# epochs: 2'" in capsys.readouterr().out
    path.write_text(path.read_text().replace("# epochs: 2", "# epochs: -1"))
    code, text = _run("--config-file", path, "--dry-run")
    assert code == 2 and "'# epochs: -1' is not a number of passes" in text, text[-2000:]
    assert "loading Megatron-Bridge" not in text


# ----------------------------------------------------------------- R5b: the recipe line's task and GPUs


@pytest.mark.parametrize(
    "other",
    ["qwen35_35b_a3b_sft_8gpu_h100_bf16_config", "qwen35_35b_a3b_peft_8gpu_h200_bf16_config"],
    ids=["another_task", "another_gpu_count"],
)
def test_a_recipe_line_naming_another_task_or_gpu_count_is_refused(saved, tmp_path, other):
    path = tmp_path / "run.yaml"
    path.write_text(re.sub(r"^# recipe: .*$", f"# recipe: {other}", saved, count=1, flags=re.M))
    code, text = _run("--config-file", path, "--dry-run")
    assert code == 2 and f"'# recipe: {other}'" in text and "Traceback" not in text, text[-2000:]
    assert LORA in text and "loading Megatron-Bridge" not in text  # the recipe it was saved from is offered


def test_without_the_written_for_line_the_body_tells_the_task(saved, tmp_path):
    path = tmp_path / "run.yaml"
    body = re.sub(r"^# written for: .*\n", "", saved, flags=re.M)
    path.write_text(body.replace(f"# recipe: {LORA}", "# recipe: qwen35_35b_a3b_sft_8gpu_h100_bf16_config"))
    with pytest.raises(config_files.ConfigFileError, match=r"LoRA 'peft' section.*# written for: sft on 8 x h100"):
        config_files.recipe_of(path)
    path.write_text(body.replace(_section(body, "peft"), "peft: null\n"))
    with pytest.raises(config_files.ConfigFileError, match=r"task peft.*'peft: null'"):
        config_files.recipe_of(path)


def test_lora_put_on_an_sft_recipe_on_purpose_loads_again(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(config_files.to_text(bridge_recipes.build(SFT, peft="lora"), SFT, written_for=True))
    assert config_files.recipe_of(path) == SFT
