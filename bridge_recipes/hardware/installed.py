"""What the installed stack provides, probed without importing it (a registry install differs
from an NGC container: APEX, for one, is usually absent)."""

from __future__ import annotations

import importlib.util

# Megatron-Core 0.19.2 builds the routed experts as one Transformer Engine op-fuser chain
# (model.use_transformer_engine_op_fuser) for SwiGLU only with this above 0 in the environment: the
# opt-in to Transformer Engine's fused grouped MLP, a Blackwell (compute capability 10) kernel.
OP_FUSER_ENV = "NVTE_CUTEDSL_FUSED_GROUPED_MLP"


def apex_grad_fusion_available() -> bool:
    """APEX's fused weight-gradient kernel, which Megatron's own linear layers call for
    gradient-accumulation fusion (``bridge_recipes.features.te_wgrad`` serves without it)."""
    return importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None


def training_stack_problem(command: str) -> str | None:
    """Why ``command`` cannot run here: the light install (rows, inspection, --list) has no Megatron."""
    if all(importlib.util.find_spec(m) is not None for m in ("torch", "megatron.core", "megatron.bridge")):
        return None
    return (
        f"{command} needs the training stack (torch, Megatron-Core, Megatron-Bridge), which this environment "
        "lacks (the light install builds and inspects rows and lists recipes); run bash scripts/install.sh"
    )
