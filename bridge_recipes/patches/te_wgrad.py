"""Megatron-Core's own linear layers get APEX's ``fused_weight_gradient_mlp_cuda`` from
``bridge_recipes.te_wgrad`` (Transformer Engine's GEMM) where APEX is missing: the module serves under
that name in ``sys.modules`` and in ``megatron.core.tensor_parallel.layers``, which tried the import
once when it was first imported. Gradient-accumulation fusion then stays on without APEX."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from bridge_recipes import installed, te_wgrad
from bridge_recipes.patches.contract import Patch, check


def wanted(cfg: Any, **run: Any) -> bool:
    """The recipe asks for gradient-accumulation fusion and APEX is not installed."""
    return (
        bool(getattr(cfg.model, "gradient_accumulation_fusion", False)) and not installed.apex_grad_fusion_available()
    )


def serve_as_apex() -> ModuleType:
    """Make ``bridge_recipes.te_wgrad`` Megatron-Core's ``fused_weight_gradient_mlp_cuda``; returns the
    module now serving the name (idempotent)."""
    check(PATCH)
    sys.modules.setdefault(te_wgrad.APEX_MODULE, te_wgrad)
    from megatron.core.tensor_parallel import layers

    if not layers._grad_accum_fusion_available:
        layers.fused_weight_gradient_mlp_cuda = sys.modules[te_wgrad.APEX_MODULE]
        layers._grad_accum_fusion_available = True
    return sys.modules[te_wgrad.APEX_MODULE]


def install(cfg: Any) -> str:
    """After a check of Transformer Engine's GEMM on this GPU, serve it as APEX's kernel; should the
    check fail, turn ``model.gradient_accumulation_fusion`` off as without a stand-in."""
    problem = te_wgrad.self_check()
    if problem:
        cfg.model.gradient_accumulation_fusion = False
        return f"{te_wgrad.FUSION_OFF} (APEX's fused_weight_gradient_mlp_cuda is not installed and {problem})"
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
)
