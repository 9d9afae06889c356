"""Gradient-accumulation fusion without APEX: Transformer Engine's GEMM in place of APEX's
``fused_weight_gradient_mlp_cuda``.

With ``gradient_accumulation_fusion`` each weight-gradient GEMM accumulates into the parameter's FP32
``main_grad`` (cuBLAS with beta = 1) instead of writing a BF16 gradient that Megatron-Core's DDP hook
then adds into ``main_grad`` with a kernel of its own. Megatron-Core 0.19.2 takes that path in two
ways: its Transformer Engine layers pass ``fuse_wgrad_accumulation`` to TE, which does the GEMM itself;
its own linear layers (``tensor_parallel.ColumnParallelLinear``, the GPT output layer among them, and
the deferred embedding gradient) call APEX's kernel and refuse to build without it. This module gives
them the same two functions on Transformer Engine's ``general_gemm``, the call TE's own linear layers
make for their fused weight gradient (``layout="NT"``, ``accumulate=True``, ``out=main_grad``);
:data:`PATCH` has those layers call them where APEX is not installed (``features.te_wgrad.enabled``,
on by default): the name they call through in ``megatron.core.tensor_parallel.layers`` is set to this
module; nothing is registered under APEX's module name. The one Megatron-Core path that imports APEX's
module at call time, the deferred embedding gradient (``model.defer_embedding_wgrad_compute``, which no
recipe sets), is turned off before launch with a line that says so.

Why it matters: unfused, each weight adds its gradient with a kernel launch of its own per micro
batch (each expert's weights are parameters of their own), a large share of the launches of a step
whose pace the host sets; fusion removes those of the GEMM weights.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from bridge_recipes.hardware import installed
from bridge_recipes.patches.contract import Patch, check

KEY = "features.te_wgrad.enabled"
APEX_MODULE = "fused_weight_gradient_mlp_cuda"
# the runner's log line when a run asked for fusion and goes without it (the benchmark reads it back)
FUSION_OFF = "gradient_accumulation_fusion: off"


@dataclass
class Config:
    """Where APEX's fused weight-gradient kernel is not installed, Transformer Engine's GEMM serves in its
    place (``enabled``); off, such a run goes without gradient-accumulation fusion."""

    enabled: bool = True


def turned_off_in(log_text: str) -> bool:
    """Whether a run's log says the runner turned fusion off (a config that asked for none logs nothing)."""
    return FUSION_OFF in log_text


def ran_fused(cfg: Any, log_text: str) -> bool:
    """Whether a run of ``cfg`` accumulated its weight gradients fused: its config asked for fusion and its
    log does not say the runner turned it off."""
    return bool(getattr(cfg.model, "gradient_accumulation_fusion", False)) and not turned_off_in(log_text)


def wgrad_gemm_accum_fp32(total_input: Any, grad_output: Any, main_grad: Any) -> None:
    """``main_grad += grad_output^T @ total_input`` in ``main_grad``'s precision (FP32), one GEMM;
    ``total_input`` is [tokens, in], ``grad_output`` [tokens, out], ``main_grad`` [out, in]."""
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    general_gemm(
        total_input, grad_output, out_dtype=main_grad.dtype, accumulate=True, layout="NT", out=main_grad, grad=True
    )


# APEX's FP16/BF16 form: the same GEMM, accumulating in main_grad's own dtype
wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp32


# BF16 inputs, FP32 accumulation: against FP32 of the same BF16 values only the summation order differs
SELF_CHECK_TOLERANCE = 1e-3


def self_check() -> str | None:
    """Why the stand-in cannot serve on this machine's GPU, or None when it accumulates as it should: one
    small GEMM into an FP32 buffer, twice, against PyTorch in FP32 on the process's own GPU (LOCAL_RANK,
    or the only one it sees). None without a GPU (nothing to check; nothing trains there)."""
    import os

    import torch

    if not torch.cuda.is_available():
        return None
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", rank if rank < torch.cuda.device_count() else 0)
    try:
        with torch.cuda.device(device):
            gen = torch.Generator(device=device).manual_seed(0)
            x = torch.randn(64, 32, device=device, generator=gen).to(torch.bfloat16)
            dy = torch.randn(64, 16, device=device, generator=gen).to(torch.bfloat16)
            main_grad = torch.randn(16, 32, device=device, generator=gen)
            expected = main_grad + 2 * (dy.float().t() @ x.float())
            wgrad_gemm_accum_fp32(x, dy, main_grad)
            wgrad_gemm_accum_fp32(x, dy, main_grad)
            error = ((main_grad - expected).abs().max() / expected.abs().max()).item()
    except Exception as exc:  # any failure of the GEMM means: do not rely on it (the run says why)
        return f"Transformer Engine's GEMM failed ({type(exc).__name__}: {exc})"
    if not error < SELF_CHECK_TOLERANCE:
        return (
            f"Transformer Engine's GEMM accumulated {error:.2e} off an FP32 reference "
            f"(tolerance {SELF_CHECK_TOLERANCE})"
        )
    return None


def wanted(cfg: Any, **run: Any) -> bool:
    """The recipe asks for gradient-accumulation fusion and APEX is not installed."""
    return (
        bool(getattr(cfg.model, "gradient_accumulation_fusion", False)) and not installed.apex_grad_fusion_available()
    )


def launch_change(cfg: Any) -> str | None:
    """Before the launch prints what it runs: where fusion is asked for without APEX and the stand-in is
    switched off or fails its check on this GPU, ``model.gradient_accumulation_fusion`` goes off; the line
    that says so, or None when nothing changes."""
    if not wanted(cfg):
        return None
    defer = ""
    if getattr(cfg.model, "defer_embedding_wgrad_compute", False):  # Megatron-Core imports APEX's module for it
        cfg.model.defer_embedding_wgrad_compute = False
        defer = "; defer_embedding_wgrad_compute: off (Megatron-Core imports APEX's module for it)"
    if not cfg.features.te_wgrad.enabled:
        why = f"{KEY}=false"
    elif not (why := self_check() or ""):
        return defer.removeprefix("; ") or None
    cfg.model.gradient_accumulation_fusion = False
    return f"{FUSION_OFF} (APEX's fused_weight_gradient_mlp_cuda is not installed and {why}){defer}"


def serve_as_apex() -> None:
    """Have Megatron-Core's own linear layers call this module for their fused weight gradient
    (idempotent)."""
    check(PATCH)
    from megatron.core.tensor_parallel import layers

    if not layers._grad_accum_fusion_available:
        layers.fused_weight_gradient_mlp_cuda = sys.modules[__name__]
        layers._grad_accum_fusion_available = True


def install(cfg: Any) -> str:
    """Serve Transformer Engine's GEMM as APEX's kernel; refused where :func:`launch_change` would have
    turned fusion off (the launch calls it before it prints what runs)."""
    if not cfg.features.te_wgrad.enabled or (problem := self_check()):
        raise RuntimeError(
            f"gradient_accumulation_fusion is on without APEX and the stand-in cannot serve "
            f"({problem if cfg.features.te_wgrad.enabled else KEY + '=false'}): the launch turns it off first"
        )
    serve_as_apex()
    return (
        "gradient_accumulation_fusion: on, Megatron's own linear layers through Transformer Engine's GEMM "
        "(APEX's fused_weight_gradient_mlp_cuda is not installed)"
    )


PATCH = Patch(
    name="te_wgrad",
    what="Transformer Engine's GEMM serves as APEX's fused weight-gradient kernel",
    written_for={"megatron-core": ">=0.19,<0.20", "transformer-engine": ">=2.20,<2.21"},
    targets={
        "megatron.core.tensor_parallel.layers._grad_accum_fusion_available": None,
        "transformer_engine.pytorch.cpp_extensions.general_gemm": (
            "A",
            "B",
            "out_dtype",
            "quantization_params",
            "gelu",
            "gelu_in",
            "alpha",
            "beta",
            "accumulate",
            "layout",
            "out",
            "bias",
            "use_split_accumulator",
            "grad",
            "ub",
            "ub_type",
            "extra_output",
            "bulk_overlap",
        ),
    },
    install=install,
    wanted=wanted,
    module=__name__,
)
