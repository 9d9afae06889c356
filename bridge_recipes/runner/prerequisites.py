"""What a training launch needs from the machine, checked before the training stack is imported:
a CUDA GPU that torch can use, and the packages the training entry points import (the GPU
additions of ``scripts/install.sh --gpu``). Each missing piece is named with how to get it, so a
launch on the wrong machine ends in one message and exit status 2, not in an import traceback.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

GPU_INSTALL = "bash scripts/install.sh --gpu (or: .venv/bin/pip install --no-deps -r requirements/gpu.lock)"

# module -> (package, why the launch needs it); the packages of pyproject's gpu extra
NEEDED: dict[str, tuple[str, str]] = {
    "nvidia_resiliency_ext": ("nvidia-resiliency-ext", "Megatron-Bridge's pretrain()/finetune() import it"),
    "qwen_vl_utils": ("qwen-vl-utils", "Megatron-Bridge's Qwen-VL collate imports it"),
    "tilelang": ("tilelang", "flash-linear-attention runs the Gated DeltaNet backward with it on Hopper"),
}


def _needed_modules(cfg: Any, gpu_major: int | None) -> list[str]:
    from bridge_recipes.models.qwen35 import is_vlm

    out = ["nvidia_resiliency_ext"]
    if is_vlm(cfg):
        out.append("qwen_vl_utils")
    if gpu_major == 9:
        out.append("tilelang")
    return out


def gpu_problem() -> tuple[str | None, int | None]:
    """(why no GPU is usable, or None; the first GPU's compute-capability major, or None)."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA; install the stack with {GPU_INSTALL}", None
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return (
            f"no usable CUDA GPU{hint}: training needs one; launch on a GPU machine "
            "(here, --dry-run and --plan check the config without one)",
            None,
        )
    return None, torch.cuda.get_device_capability(0)[0]


def launch_problems(cfg: Any) -> list[str]:
    """What this machine lacks for training ``cfg``: one line per missing piece (empty: it can)."""
    problem, major = gpu_problem()
    problems = [problem] if problem else []
    for module in _needed_modules(cfg, major):
        if importlib.util.find_spec(module) is None:
            package, why = NEEDED[module]
            problems.append(f"package {package} is not installed ({why}); install it with {GPU_INSTALL}")
    return problems
