"""Optimizer state per rank: bytes per parameter of the master copy and the Adam moments, the
distributed optimizer's sharding, and the share offloaded to the host."""

from __future__ import annotations

from typing import Any

from bridge_recipes.plan.dims import FP32
from bridge_recipes.plan.layout import Layout
from bridge_recipes.plan.params import Params
from bridge_recipes.plan.precision import _dtype_bytes, effective_precision


def te_owns_master(opt: Any, fp8_recipe: str | None) -> bool:
    """Megatron's ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``: TE's FusedAdam keeps the
    master weights; otherwise Megatron keeps FP32 shards itself."""
    main = _dtype_bytes(getattr(opt, "main_params_dtype", None))
    return bool(opt.use_precision_aware_optimizer) and (
        main != 4 or fp8_recipe in (None, "delayed") or bool(getattr(opt, "optimizer_cpu_offload", False))
    )


def optimizer_bytes_per_param(cfg: Any) -> float:
    """Master copy + exp_avg + exp_avg_sq, before sharding (``bridge_recipes.plan.memory``'s docstring)."""
    opt = cfg.optimizer
    moments = moment_bytes_per_param(cfg)
    if getattr(opt, "optimizer_cpu_offload", False) or not opt.use_precision_aware_optimizer:
        return FP32 + moments  # FP32 master + moments (HybridDeviceOptimizer keeps FP32 copies on both sides)
    main = _dtype_bytes(getattr(opt, "main_params_dtype", None))
    if not te_owns_master(opt, effective_precision(cfg)["fp8_recipe"]):
        return FP32 + moments
    if main == 4:
        return (2 if getattr(opt, "store_param_remainders", True) else 4) + moments
    return main + moments


def moment_bytes_per_param(cfg: Any) -> float:
    """exp_avg + exp_avg_sq of :func:`optimizer_bytes_per_param`: the part the first optimizer step
    allocates (the master copy exists from the start)."""
    opt = cfg.optimizer
    if getattr(opt, "optimizer_cpu_offload", False) or not opt.use_precision_aware_optimizer:
        return 2 * FP32
    return _dtype_bytes(opt.exp_avg_dtype) + _dtype_bytes(opt.exp_avg_sq_dtype)


def optimizer_shard_params(p: Params, par: Layout, distributed: bool) -> float:
    if not distributed:
        return p.total
    return p.dense / par.dense_dp + p.expert / par.expert_dp


def offload_fraction(cfg: Any) -> float:
    opt = cfg.optimizer
    if not getattr(opt, "optimizer_cpu_offload", False):
        return 0.0
    return float(getattr(opt, "optimizer_offload_fraction", 0.0) or 0.0)
