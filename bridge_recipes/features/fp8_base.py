"""LoRA on a frozen base stored in FP8: one byte a base weight instead of two.

A LoRA recipe whose mixed precision keeps the parameters in FP8 (``fp8_param``) and trains adapters
(``cfg.peft``) has Transformer Engine build every TE linear's weight as an FP8 tensor of row-wise
data and one scale (per-tensor current scaling). How the base multiplies is
``features.fp8_base.gemms`` (:class:`Config`, read by the planner as well):

- ``bf16`` (the default): every GEMM runs in BF16 on the weight dequantized for it, forward and
  backward; the activations are never rounded to FP8, so the adapters' gradients are those of a BF16
  base holding the same (FP8-rounded) weights. Transformer Engine keeps a recomputed layer's
  dequantized weights for that layer's backward only.
- ``fp8``: the forward multiplies in FP8 (activations rounded to E4M3 per tensor); the backward, which
  needs no weight gradient of a frozen base, computes the input gradient in BF16 from the weight
  dequantized for that GEMM alone (the recipe's ``backward_override="dequantized"``). Faster GEMMs,
  but the adapters' gradients drift further from FP32 than a BF16 base's.

The adapters, their gradients and their optimizer state stay BF16/FP32, outside FP8 (Megatron-Bridge
runs them with FP8 off). A checkpoint holds the adapters only, and ``--export-hf`` merges them into the
Hugging Face checkpoint's own BF16 weights: the base is never exported from its FP8 copy (QLoRA's
adapters are merged the same way).

Three things of the upstream stack would undo the saving or the choice; :data:`PATCH` (the runner, in
the training process) deals with them:

- Transformer Engine builds an FP8 weight with its column-wise (transposed) copy as well, and keeps
  a CPU copy of the BF16 values (``preserve_high_precision_init_val``), whenever gradients are
  enabled while the model is built, as they are in Megatron-Bridge's setup: 2 bytes per weight on the
  GPU and 2 on the host. The model is built with gradients off instead (nothing in the build
  differentiates), which gives row-wise data only and no host copy.
- Without the dequantized backward, Transformer Engine makes each weight's transpose in its first
  backward and keeps it on the parameter. Megatron-Core builds the layers' FP8 recipe without it,
  and Transformer Engine's environment switch (``NVTE_BACKWARD_OVERRIDE``) would also reach the
  delayed-scaling recipe it makes for code run with FP8 off, which refuses it: the recipe
  Megatron-Core makes is given the override instead (:func:`with_dequantized_backward`). A
  pre-wrap hook checks the built model: every FP8 weight row-wise only.
- Megatron-Core runs each layer in FP8 autocast whenever its configuration says FP8, which
  ``fp8_param`` requires; for BF16 compute its context factory gives FP8 weight creation at build time
  and no autocast at run time (:func:`without_fp8_autocast`).

The upstream versions those patches were written for, and the check of what moved, are the patch's
(docs/patches.md). FP8 needs a GPU with FP8 tensor cores (Ada, Hopper, Blackwell): :func:`problems`
refuses it on another.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

from bridge_recipes.patches.contract import Patch, check, register_pre_wrap_hook_once

KEY = "features.fp8_base.gemms"
REPLACES_ENV = ("BRIDGE_RECIPES_FP8_BASE_COMPUTE", KEY)  # the environment variable this key replaced
GEMMS = ("bf16", "fp8")
BACKWARD = "dequantized"
LOG = "[run_recipe]"
# Transformer Engine's notice for every module that dequantizes FP8 weights outside FP8 autocast
TE_NOTICE = "You are using quantized weights without quantized compute"


@dataclass
class Config:
    """How a LoRA run's frozen base stored in FP8 multiplies: ``gemms`` ``bf16`` (on the weight dequantized
    for each GEMM) or ``fp8`` (FP8 forward GEMMs, the backward dequantized). The base is stored in FP8
    where the mixed precision keeps the parameters in FP8 (``bridge_recipes.recipes.qwen.policy.fp8_frozen_base``)."""

    gemms: str = "bf16"


def applies(cfg: Any) -> bool:
    """A LoRA run on a base stored in FP8 (the planner's definition)."""
    from bridge_recipes.plan.precision import fp8_frozen_base

    return fp8_frozen_base(cfg)


def uses_fp8(cfg: Any) -> bool:
    """Whether the run stores or multiplies anything in FP8 (its mixed precision asks for FP8)."""
    from bridge_recipes.plan.precision import mixed_precision_config

    return bool(getattr(mixed_precision_config(cfg), "fp8", None))


def describe(cfg: Any) -> str | None:
    """The summary's precision for a LoRA run on an FP8 base: storage and GEMMs, as they run; None for
    another run."""
    if not applies(cfg):
        return None
    storage = "FP8 base storage (one byte a frozen weight, per-tensor scale)"
    if cfg.features.fp8_base.gemms == "bf16":
        return f"{storage}, BF16 GEMMs on the dequantized FP8 base ({KEY}=bf16); adapters BF16"
    return f"{storage}, FP8 forward GEMMs, backward on the dequantized FP8 base ({KEY}=fp8); adapters BF16"


def gemms_problem(gemms: Any) -> str | None:
    """Why ``gemms`` is not one of :data:`GEMMS`, with the choices; None when it is."""
    if gemms in GEMMS:
        return None
    return f"{KEY}={gemms!r}: an FP8 base multiplies in one of {', '.join(GEMMS)}; set {KEY}=bf16 (the default) or fp8"


def problems(cfg: Any, capability: tuple[int, int] | None = None, gpu: str | None = None) -> list[str]:
    """Why a run's FP8 cannot run, with the fix: FP8 on a GPU of ``capability`` without FP8 tensor cores
    (``gpu``: its name; None when no GPU is known), GEMMs of another precision than :data:`GEMMS`, FP8
    GEMMs asked of a run that holds nothing in FP8 (the setting would change nothing), and, for a LoRA run
    on an FP8 base, a scaling recipe without the dequantized backward (the upstream code is checked with
    the patch's contract)."""
    from bridge_recipes.hardware.gpus import FP8_CAPABILITY, has_fp8

    out = []
    if capability is not None and uses_fp8(cfg) and not has_fp8(capability):
        on = f"compute capability {capability[0]}.{capability[1]}" + (f" ({gpu})" if gpu else "")
        out.append(
            f"mixed_precision asks for FP8, which {on} has no tensor cores for (FP8 needs compute capability "
            f"{FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} or later); set mixed_precision=bf16_mixed, or use a recipe "
            "written for an H100, H200 or 48 GB Ada card"
        )
    gemms = cfg.features.fp8_base.gemms
    if problem := gemms_problem(gemms):
        return [*out, problem]
    if not applies(cfg):
        if gemms != Config.gemms and not uses_fp8(cfg):
            out.append(
                f"{KEY}={gemms} sets how a LoRA base stored in FP8 multiplies, and this run stores and multiplies "
                f"nothing in FP8 (its mixed precision has no FP8), so it would change nothing; drop it ({KEY}="
                f"{Config.gemms}), or use a recipe with an FP8 base (run_recipe.py --list --filter fp8base)"
            )
        return out
    from bridge_recipes.plan.precision import mixed_precision_config

    recipe = getattr(mixed_precision_config(cfg), "fp8_recipe", None)
    if recipe != "tensorwise":
        out.append(
            f"mixed_precision.fp8_recipe={recipe!r} with FP8 base weights: the frozen base needs per-tensor current "
            "scaling (tensorwise), the recipe whose backward can dequantize; set mixed_precision.fp8_recipe=tensorwise"
        )
    return out


def build_without_grad(factory: Any) -> Any:
    """``factory`` run with gradients off (idempotent)."""
    if getattr(factory, "builds_without_grad", False):
        return factory

    @functools.wraps(factory)
    def without_grad(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return factory(*args, **kwargs)

    without_grad.builds_without_grad = True  # type: ignore[attr-defined]
    return without_grad


def with_dequantized_backward(get_recipe: Any) -> Any:
    """``get_recipe`` (Megatron-Core's ``get_fp8_recipe(config)``) whose per-tensor current-scaling recipes
    take the input gradient from the dequantized weight (idempotent)."""
    if getattr(get_recipe, "dequantizes_backward", False):
        return get_recipe

    @functools.wraps(get_recipe)
    def dequantizing(*args: Any, **kwargs: Any) -> Any:
        import dataclasses

        from transformer_engine.common.recipe import Float8CurrentScaling

        recipe = get_recipe(*args, **kwargs)
        if isinstance(recipe, Float8CurrentScaling) and recipe.backward_override != BACKWARD:
            recipe = dataclasses.replace(recipe, backward_override=BACKWARD)
        return recipe

    dequantizing.dequantizes_backward = True  # type: ignore[attr-defined]
    return dequantizing


def without_fp8_autocast(get_context: Any) -> Any:
    """``get_context`` (Megatron-Core's ``get_fp8_context(config, layer_no, is_init)``) that still gives
    FP8 weight creation (``is_init``) but no FP8 autocast: the layers run their GEMMs in BF16 on the
    dequantized FP8 weights (idempotent)."""
    if getattr(get_context, "without_autocast", False):
        return get_context

    @functools.wraps(get_context)
    def context(config: Any, layer_no: int = -1, is_init: bool = False) -> Any:
        if not is_init:
            return contextlib.nullcontext()
        return get_context(config, layer_no, is_init)

    context.without_autocast = True  # type: ignore[attr-defined]
    return context


def drop_fp8_autocast() -> list[tuple[Any, Any]]:
    """Megatron-Core's ``get_fp8_context`` replaced by :func:`without_fp8_autocast` in ``fp8_utils`` and in
    every loaded Megatron module that imported it by name (the transformer block, full recompute, the MTP
    block); the (module, original) pairs replaced, for an undo. Idempotent: a second call replaces none."""
    import sys

    from megatron.core import fp8_utils, recompute  # noqa: F401  (loaded before the sweep)
    from megatron.core.transformer import multi_token_prediction, transformer_block  # noqa: F401

    original = fp8_utils.get_fp8_context
    if getattr(original, "without_autocast", False):
        return []
    wrapped = without_fp8_autocast(original)
    replaced = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "megatron" and getattr(module, "get_fp8_context", None) is original:
            module.get_fp8_context = wrapped  # type: ignore[attr-defined]
            replaced.append((module, original))
    return replaced


def fp8_weights(model: Any) -> tuple[int, int, list[str]]:
    """(FP8 weights, their bytes, names of those holding column-wise data as well) over the model
    chunks ``model``."""
    from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor

    count, size, bad = 0, 0, []
    for chunk in model if isinstance(model, list) else [model]:
        for name, p in chunk.named_parameters():
            if not isinstance(p, Float8Tensor):
                continue
            count += 1
            data = p._data
            size += data.numel() * data.element_size() if data is not None else 0
            if getattr(p, "_transpose", None) is not None:
                bad.append(name)
    return count, size, bad


def check_hook(model: list) -> list:
    """Pre-wrap hook: the model's FP8 weights hold row-wise data only (the PEFT hook, after it, freezes them)."""
    count, size, bad = fp8_weights(model)
    if bad:
        raise RuntimeError(
            f"{len(bad)} FP8 base weight(s) hold an FP8 transpose as well, 2 bytes per weight ({', '.join(bad[:3])})"
        )
    print(f"{LOG} FP8 base: {count} weights in FP8, {size / 1e9:.2f} GB, row-wise only", flush=True)
    return model


BUILT = "FP8 base: the model is built with gradients off (row-wise FP8 weights)"


def wanted(cfg: Any, **run: Any) -> bool:
    return applies(cfg)


def install(cfg: Any) -> str:
    """In the training process, before setup builds the model (idempotent)."""
    check(PATCH)
    import warnings

    from megatron.bridge.models import model_provider
    from megatron.core import fp8_utils

    model_provider._create_model = build_without_grad(model_provider._create_model)
    fp8_utils.get_fp8_recipe = with_dequantized_backward(fp8_utils.get_fp8_recipe)
    register_pre_wrap_hook_once(cfg, check_hook)
    if cfg.features.fp8_base.gemms == "bf16":
        drop_fp8_autocast()
        warnings.filterwarnings("ignore", message=TE_NOTICE)
        return f"{BUILT}, GEMMs in BF16 on the dequantized weights ({KEY}=bf16)"
    return f"{BUILT}, FP8 forward GEMMs, the backward {BACKWARD} ({KEY}=fp8)"


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
    module=__name__,
)
