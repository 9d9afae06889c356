"""LoRA on a frozen base stored in FP8 (``bridge_recipes.fp8_base`` holds the logic): Megatron-Bridge's
model factory (``model_provider._create_model``) runs with gradients off, so Transformer Engine builds
row-wise FP8 weights only; Megatron-Core's FP8 recipe factory (``fp8_utils.get_fp8_recipe``) gives
per-tensor current scaling the dequantized backward; for BF16 compute (the default) its FP8 context
factory (``get_fp8_context``, and each Megatron module's binding of it) gives no autocast at run time; a
pre-wrap hook checks the built model."""

from __future__ import annotations

from typing import Any

from bridge_recipes import fp8_base
from bridge_recipes.patches.contract import Patch, check, register_pre_wrap_hook_once

BUILT = "FP8 base: the model is built with gradients off (row-wise FP8 weights)"


def wanted(cfg: Any, **run: Any) -> bool:
    return fp8_base.applies(cfg)


def install(cfg: Any) -> str:
    """In the training process, before setup builds the model (idempotent)."""
    check(PATCH)
    import warnings

    from megatron.bridge.models import model_provider
    from megatron.core import fp8_utils

    model_provider._create_model = fp8_base.build_without_grad(model_provider._create_model)
    fp8_utils.get_fp8_recipe = fp8_base.with_dequantized_backward(fp8_utils.get_fp8_recipe)
    register_pre_wrap_hook_once(cfg, fp8_base.check_hook)
    how = fp8_base.compute(getattr(cfg, "env_vars", None))
    if how == "bf16":
        fp8_base.drop_fp8_autocast()
        warnings.filterwarnings("ignore", message=fp8_base.TE_NOTICE)
        return f"{BUILT}, GEMMs in BF16 on the dequantized weights"
    return f"{BUILT}, FP8 forward GEMMs, the backward {fp8_base.BACKWARD}"


PATCH = Patch(
    name="fp8_base",
    what="LoRA's frozen base at one byte per weight: built without gradients, dequantized backward",
    written_for={
        "megatron-bridge": ">=0.6,<0.7",
        "megatron-core": ">=0.19,<0.20",
        "transformer-engine": ">=2.20,<2.21",
    },
    targets={
        "megatron.bridge.models.model_provider._create_model": ("model_provider", "model_type", "pg_collection"),
        "megatron.core.fp8_utils.get_fp8_recipe": ("config",),
        "megatron.core.fp8_utils.get_fp8_context": ("config", "layer_no", "is_init"),
        "megatron.core.transformer.transformer_block.get_fp8_context": ("config", "layer_no", "is_init"),
        "megatron.core.recompute.get_fp8_context": ("config", "layer_no", "is_init"),
        "megatron.core.transformer.multi_token_prediction.get_fp8_context": ("config", "layer_no", "is_init"),
        "transformer_engine.pytorch.module.linear.Linear._get_weight_tensors": ("self",),
        "transformer_engine.pytorch.module.grouped_linear.GroupedLinear._get_weight_tensors": ("self",),
        "transformer_engine.common.recipe.Float8CurrentScaling.backward_override": None,
        "transformer_engine.pytorch.tensor.float8_tensor.Float8Tensor.__new__": (
            "cls",
            "args",
            "data",
            "fp8_scale_inv",
            "fp8_dtype",
            "fake_dtype",
            "data_transpose",
            "quantizer",
            "transpose_invalid",
            "kwargs",
        ),
    },
    install=install,
    wanted=wanted,
)
