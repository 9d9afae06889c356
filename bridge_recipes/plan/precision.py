"""The mixed-precision settings the plan reads: the preset's overrides of the recipe's optimizer and
DDP fields, and whether weights are stored, cached or cast in FP8."""

from __future__ import annotations

from typing import Any

from bridge_recipes.plan.params import lora_targets

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a torch dtype or its name; 4 (FP32) when unset or unknown."""
    name = str(dtype).replace("torch.", "") if dtype is not None else ""
    return DTYPE_BYTES.get(name, 4)


def mixed_precision_config(cfg: Any) -> Any:
    """The recipe's mixed-precision preset as an object (None when it cannot be resolved)."""
    mp = cfg.mixed_precision
    if isinstance(mp, str):
        try:
            from megatron.bridge.training.mixed_precision import get_mixed_precision_config

            return get_mixed_precision_config(mp)
        except (ImportError, KeyError, ValueError):
            return None
    return mp


def effective_precision(cfg: Any) -> dict[str, Any]:
    """Fields the mixed-precision preset overwrites on the optimizer and DDP configs at
    setup (``MixedPrecisionConfig.setup``): it wins over what the recipe set there."""
    out = {
        "fp8_recipe": getattr(cfg.optimizer, "fp8_recipe", None),
        "grad_reduce_in_fp32": getattr(cfg.ddp, "grad_reduce_in_fp32", True),
        "fp8": getattr(getattr(cfg, "model", None), "fp8", None),
    }
    mp = mixed_precision_config(cfg)
    for key in out:
        if mp is not None and hasattr(mp, key):
            out[key] = getattr(mp, key)
    return out


def fp8_parameters(mp: Any) -> bool:
    """Whether a mixed-precision config trains in FP8 with the parameters stored in FP8 (``fp8_param``,
    which ``fp8_param_gather`` sets at finalize)."""
    return bool(getattr(mp, "fp8", None)) and bool(getattr(mp, "fp8_param", None) or mp.fp8_param_gather)


def fp8_base_gemms(cfg: Any) -> str:
    """How an FP8 base multiplies, ``bf16`` (on the dequantized weights) or ``fp8``: the run's
    ``features.fp8_base.gemms`` (``bridge_recipes.features.fp8_base``)."""
    return cfg.features.fp8_base.gemms


def fp8_frozen_base(cfg: Any) -> bool:
    """LoRA on a base stored in FP8 (``bridge_recipes.features.fp8_base``): every TE linear's frozen weight is one
    byte, row-wise only, and the backward dequantizes one GEMM's weight at a time."""
    if lora_targets(cfg) is None:
        return False
    mp = mixed_precision_config(cfg)
    return mp is not None and fp8_parameters(mp)


def _fp8_bf16_parameters(cfg: Any) -> bool:
    """FP8 GEMMs on BF16 parameters: Transformer Engine makes the FP8 weights it multiplies with."""
    mp = mixed_precision_config(cfg)
    return mp is not None and bool(getattr(mp, "fp8", None)) and not fp8_parameters(mp)


def caches_fp8_weights(cfg: Any) -> bool:
    """Transformer Engine keeps FP8 copies of BF16 weights between micro batches: FP8 GEMMs, BF16
    parameters and Megatron-Core's parameter transpose cache on (its default). With FP8 parameters the
    parameter is that copy, and with ``disable_parameter_transpose_cache`` each weight is cast when used."""
    return _fp8_bf16_parameters(cfg) and not getattr(cfg.model, "disable_parameter_transpose_cache", False)


def casts_fp8_weights_per_use(cfg: Any) -> bool:
    """FP8 GEMMs on BF16 parameters with the transpose cache off: each TE linear casts its weight in
    every forward and keeps that copy for the backward."""
    return _fp8_bf16_parameters(cfg) and bool(getattr(cfg.model, "disable_parameter_transpose_cache", False))
