"""Megatron-Core's own linear layers call ``bridge_recipes.te_wgrad``'s weight-gradient functions
(Transformer Engine's GEMM) where APEX's ``fused_weight_gradient_mlp_cuda`` is missing: the name those
layers call through, in ``megatron.core.tensor_parallel.layers`` (which tried the import once when it
was first imported), is set to this package's module. Gradient-accumulation fusion then stays on
without APEX. Nothing is registered under APEX's module name: the one Megatron-Core path that imports
it at call time, the deferred embedding gradient (``model.defer_embedding_wgrad_compute``, which no
recipe sets), is turned off with a log line."""

from __future__ import annotations

from typing import Any

from bridge_recipes import installed, te_wgrad
from bridge_recipes.patches.contract import Patch, check


def wanted(cfg: Any, **run: Any) -> bool:
    """The recipe asks for gradient-accumulation fusion and APEX is not installed."""
    return (
        bool(getattr(cfg.model, "gradient_accumulation_fusion", False)) and not installed.apex_grad_fusion_available()
    )


def serve_as_apex() -> None:
    """Have Megatron-Core's own linear layers call ``bridge_recipes.te_wgrad`` for their fused weight
    gradient (idempotent)."""
    check(PATCH)
    from megatron.core.tensor_parallel import layers

    if not layers._grad_accum_fusion_available:
        layers.fused_weight_gradient_mlp_cuda = te_wgrad
        layers._grad_accum_fusion_available = True


def install(cfg: Any) -> str:
    """After a check of Transformer Engine's GEMM on this GPU, have Megatron-Core's layers call it; should
    the check fail, turn ``model.gradient_accumulation_fusion`` off as without a stand-in."""
    problem = te_wgrad.self_check()
    if problem:
        cfg.model.gradient_accumulation_fusion = False
        cfg.model.defer_embedding_wgrad_compute = False  # Megatron-Core refuses it without fusion
        return f"{te_wgrad.FUSION_OFF} (APEX's fused_weight_gradient_mlp_cuda is not installed and {problem})"
    serve_as_apex()
    line = (
        "gradient_accumulation_fusion: on, Megatron's own linear layers through Transformer Engine's GEMM "
        "(APEX's fused_weight_gradient_mlp_cuda is not installed)"
    )
    if getattr(cfg.model, "defer_embedding_wgrad_compute", False):
        cfg.model.defer_embedding_wgrad_compute = False
        line += "; defer_embedding_wgrad_compute: off (Megatron-Core imports APEX's module for it)"
    return line


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
