"""An export that fails after training: one message, the checkpoint kept, a retry command that runs.

The export at the end of ``run_recipe.py --export-hf`` runs in a child process
(``python -m bridge_recipes.hf.run_hooks export``); here that child fails in each way it can
(bad input, the adapter folder after the merged one, anything inside the conversion), and the
parent's message and exit status are checked, as is ``convert_checkpoint.py export``, the retry.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge_recipes.hf import exporter
from bridge_recipes.hf import run_hooks as training
from bridge_recipes.hf.cli import build_parser
from bridge_recipes.hf.cli import main as convert_main
from bridge_recipes.hf.files import EXPORT_FAILED, AdapterExportError, HfCheckpointError

RECIPE = "qwen35_35b_a3b_peft_1gpu_h100_bf16_config"


def saved_run(tmp_path: Path) -> SimpleNamespace:
    save = tmp_path / "ckpt"
    (save / "iter_0000048").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("48\n")
    return SimpleNamespace(checkpoint=SimpleNamespace(save=str(save)), model=SimpleNamespace())


@pytest.mark.parametrize("text_only", [False, True])
def test_a_failed_export_keeps_the_checkpoint_and_names_the_command_that_retries_it(
    tmp_path, monkeypatch, capsys, text_only
):
    cfg = saved_run(tmp_path)
    out, template = tmp_path / "export", tmp_path / "hf folder"
    out.mkdir()  # the merged folder an adapter failure leaves
    monkeypatch.setattr(training, "text_model", lambda cfg: True)
    monkeypatch.setattr(subprocess, "run", lambda cmd, env: SimpleNamespace(returncode=EXPORT_FAILED))
    rc = training.export_after_training(cfg, str(out), str(template), text_only, recipe=RECIPE, scaled=True)
    assert rc == EXPORT_FAILED
    err = capsys.readouterr().err
    assert cfg.checkpoint.save in err and "48" in err
    retry = shlex.split(err.strip().splitlines()[-1].split(": ", 1)[1])
    assert retry[:4] == ["python", "-m", "bridge_recipes.hf.cli", "export"]
    args = build_parser().parse_args(retry[3:])
    assert (args.megatron, args.hf_template, args.out, args.recipe) == (
        cfg.checkpoint.save,
        str(template),
        str(out),
        RECIPE,
    )
    assert args.scaled and args.overwrite and args.export_text_only is text_only


def test_the_run_ends_with_the_exports_status_only_when_the_export_fails(tmp_path, monkeypatch, capsys):
    cfg = saved_run(tmp_path)
    monkeypatch.setattr(training, "text_model", lambda cfg: False)
    monkeypatch.setattr(subprocess, "run", lambda cmd, env: SimpleNamespace(returncode=0))
    assert training.export_after_training(cfg, str(tmp_path / "x"), str(tmp_path), recipe=RECIPE) == 0
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (HfCheckpointError("bad folder"), 2),
        (AdapterExportError("merged written, adapter not (OSError: disk full)"), EXPORT_FAILED),
        (RuntimeError("CUDA error: out of memory"), 1),
    ],
)
def test_the_export_child_reports_one_line_and_no_traceback(error, status, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(exporter, "export_checkpoint", fail)
    assert training.main(["export", "ckpt", "template", "out", "--text-model"]) == status
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and str(error) in err
    if status == 1:  # the stack is kept in the file the line names
        stack = Path(err.split("(stack: ")[1].rstrip(")\n"))
        assert "RuntimeError" in stack.read_text()
        stack.unlink()


@pytest.mark.parametrize(
    ("error", "status"),
    [(AdapterExportError("adapter folder not written"), EXPORT_FAILED), (MemoryError("host memory"), 1)],
)
def test_convert_checkpoint_export_fails_the_same_way(error, status, monkeypatch, capsys, tmp_path):
    seen = {}

    def fail(*args, **kwargs):
        seen.update(kwargs)
        raise error

    monkeypatch.setattr(exporter, "export_checkpoint", fail)
    megatron = tmp_path / "ckpt"
    argv = ["export", "--megatron", str(megatron), "--hf-template", str(tmp_path), "--recipe", RECIPE]
    assert convert_main([*argv, "--out", str(tmp_path / "o"), "--export-text-only", "--no-progress"]) == status
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{megatron} is unchanged" in err and seen["text_only"] is True
    if status == 1:
        Path(err.split("(stack: ")[1].rstrip(")\n")).unlink()
