"""A launch on a machine without a usable GPU or without a package the training entry points
import exits 2 naming what is missing and how to get it, with no traceback."""

import importlib.util

import pytest

import bridge_recipes
from bridge_recipes.runner import prerequisites
from bridge_recipes.runner.cli import main

SMOKE = "qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config"


def test_a_launch_without_a_gpu_exits_2_naming_it(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--recipe", SMOKE]) == 2
    err = capsys.readouterr().err
    assert "CUDA GPU" in err and "--dry-run" in err and "Traceback" not in err


def test_each_missing_package_is_named_with_its_install_command(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in prerequisites.NEEDED else real(name, *a)
    )
    text = bridge_recipes.build("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")
    vl = bridge_recipes.build("qwen35_vl_35b_a3b_sft_8gpu_h200_bf16_config")
    problems = prerequisites.launch_problems(text)
    assert [p.split()[1] for p in problems] == ["nvidia-resiliency-ext", "tilelang"]
    assert all("scripts/install.sh --gpu" in p for p in problems)
    assert "qwen-vl-utils" in " ".join(prerequisites.launch_problems(vl))


def test_nothing_is_missing_where_everything_is_there(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (10, 0))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name in prerequisites.NEEDED else real(name, *a)
    )
    assert prerequisites.launch_problems(bridge_recipes.build(SMOKE)) == []


@pytest.mark.skipif(
    importlib.util.find_spec("nvidia_resiliency_ext") is not None, reason="the GPU additions are installed"
)
def test_this_machine_names_the_missing_gpu_addition(capsys):
    assert main(["--recipe", SMOKE]) == 2
    err = capsys.readouterr().err
    assert "nvidia-resiliency-ext" in err and "not installed" in err and "scripts/install.sh --gpu" in err
