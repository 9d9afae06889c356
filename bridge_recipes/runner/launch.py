"""Hand a checked config to Megatron-Bridge's pretrain / finetune with the right forward step.

Two differences between a registry install and an NGC container stop a run; each is handled
here when it applies and reported in one log line:
- ``initialize_megatron`` runs ``make`` to compile the dataset index helpers, but the
  megatron-core wheel ships the compiled ``helpers_cpp`` and no Makefile: the compile step is
  skipped when the compiled module imports.
- ``gradient_accumulation_fusion`` (on by default) needs APEX's
  ``fused_weight_gradient_mlp_cuda`` for Megatron-Core's own linear layers: without APEX
  ``bridge_recipes.te_wgrad`` serves it with Transformer Engine's GEMM.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge_recipes.common import is_vlm
from bridge_recipes.installed import apex_grad_fusion_available

LOG = "[run_recipe]"


def _log(msg: str) -> None:
    print(f"{LOG} {msg}", flush=True)


def dataset_helpers_prebuilt() -> bool:
    """The wheel's compiled helpers import and there is no Makefile to build them with."""
    spec = importlib.util.find_spec("megatron.core.datasets")
    folder = Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None
    if folder is None or (folder / "Makefile").exists():
        return False
    try:
        importlib.import_module("megatron.core.datasets.helpers_cpp")
        return True
    except ImportError:
        return False


def skip_helper_compile_if_prebuilt() -> bool:
    if not dataset_helpers_prebuilt():
        return False
    import megatron.bridge.training.initialize as init

    init.compile_helpers = lambda: None
    _log("dataset helpers: using the compiled helpers_cpp shipped in the megatron-core wheel (no Makefile to run)")
    return True


def grad_fusion_without_apex(cfg: Any) -> bool:
    """Keep the recipe's ``gradient_accumulation_fusion`` where APEX is missing: Transformer Engine's
    GEMM stands in for APEX's kernel (``bridge_recipes.te_wgrad``), after a check of it on this GPU;
    should the check fail, fusion is turned off as without a stand-in. True when the stand-in was
    installed."""
    if not getattr(cfg.model, "gradient_accumulation_fusion", False) or apex_grad_fusion_available():
        return False
    from bridge_recipes import te_wgrad

    problem = te_wgrad.self_check()
    if problem:
        cfg.model.gradient_accumulation_fusion = False
        _log(f"{te_wgrad.FUSION_OFF} (APEX's fused_weight_gradient_mlp_cuda is not installed and {problem})")
        return False
    te_wgrad.install()
    _log(
        "gradient_accumulation_fusion: on, Megatron's own linear layers through Transformer Engine's GEMM "
        "(APEX's fused_weight_gradient_mlp_cuda is not installed)"
    )
    return True


def flash_attn_available() -> bool:
    return any(importlib.util.find_spec(m) is not None for m in ("flash_attn", "flash_attn_interface"))


def fall_back_from_flash_without_flash_attn(cfg: Any) -> bool:
    """TE's flash backend needs the flash-attn package; without it TE's own (cuDNN) attention runs."""
    from megatron.core.transformer.enums import AttnBackend

    if getattr(cfg.model, "attention_backend", None) != AttnBackend.flash or flash_attn_available():
        return False
    cfg.model.attention_backend = AttnBackend.auto
    _log(
        "attention_backend: flash -> auto (flash-attn is not installed; Transformer Engine picks its fused attention)"
    )
    return True


def fault_tolerance_off_without_ft_launcher(cfg: Any) -> bool:
    """NVRx fault tolerance talks to the rank monitors ft_launcher starts; under plain torchrun
    there are none, so it is turned off rather than failing at setup."""
    from bridge_recipes.resilience import launched_by_ft_launcher

    if not (cfg.ft and cfg.ft.enable_ft_package) or launched_by_ft_launcher():
        return False
    cfg.ft.enable_ft_package = False
    _log(
        "fault tolerance: off (not launched by ft_launcher; launch with ft_launcher to enable heartbeats and timeouts)"
    )
    return True


def prepare_for_registry_install(cfg: Any) -> None:
    """Apply the registry-install adjustments that apply (each logs one line)."""
    fault_tolerance_off_without_ft_launcher(cfg)
    grad_fusion_without_apex(cfg)
    fall_back_from_flash_without_flash_attn(cfg)
    skip_helper_compile_if_prebuilt()


def forward_step_for(cfg: Any) -> Callable:
    """VL models feed images through vlm_step; text models use gpt_step's step with the loss mask
    also given to the model, so their MTP loss counts only supervised tokens (bridge_recipes.train_step)."""
    if is_vlm(cfg):
        from megatron.bridge.training.vlm_step import forward_step
    else:
        from bridge_recipes.train_step import forward_step
    return forward_step


def entry_point_name(cfg: Any, task: str, lora_from_random_init: bool = False) -> str:
    """``finetune`` for SFT/PEFT starting from weights; ``pretrain`` otherwise (random init, and a
    LoRA benchmark from random weights: :mod:`bridge_recipes.bench.random_lora`)."""
    if lora_from_random_init:
        return "pretrain"
    if task in ("sft", "peft") and (cfg.checkpoint.pretrained_checkpoint or cfg.peft is not None):
        return "finetune"
    return "pretrain"


def entry_point_for(cfg: Any, task: str, lora_from_random_init: bool = False) -> Callable:
    name = entry_point_name(cfg, task, lora_from_random_init)
    if name == "finetune":
        from megatron.bridge.training.finetune import finetune

        return finetune
    if lora_from_random_init:
        from bridge_recipes.bench import random_lora

        _log(random_lora.log_line(random_lora.install(cfg)))
    elif task in ("sft", "peft"):
        _log("no checkpoint.pretrained_checkpoint: fine-tuning recipe runs from random init through pretrain()")
    from megatron.bridge.training.pretrain import pretrain

    return pretrain


def attention_per_conversation_on_packed_rows(cfg: Any) -> bool:
    """Rows with conversation boundaries train with attention run one conversation at a time
    (``bridge_recipes.packed_attention``): each conversation's gradient is then the one it has alone."""
    if not getattr(cfg.dataset, "enable_offline_packing", False) or is_vlm(cfg):
        return False
    from bridge_recipes import packed_attention

    packed_attention.install()
    _log("packed rows: attention runs one conversation at a time (bridge_recipes.packed_attention)")
    return True


def loss_a_chunk_at_a_time(cfg: Any) -> bool:
    """Where the environment switches it on, the model's losses take the output layer a chunk of
    tokens at a time, never the whole logits (``bridge_recipes.chunked_loss``)."""
    from bridge_recipes import chunked_loss

    if is_vlm(cfg) or not chunked_loss.enabled(cfg.env_vars):
        return False
    cfg.model.register_pre_wrap_hook(chunked_loss.pre_wrap_hook)
    vocab = cfg.model.vocab_size or 0
    _log(
        f"loss: the output layer and cross entropy {chunked_loss.chunk_tokens(vocab) if vocab else 'a chunk'} "
        f"tokens at a time ({chunked_loss.ENV}=1; bridge_recipes.chunked_loss)"
    )
    return True


def init_independent_of_warmup_shapes() -> None:
    """Keep the CUDA random state through Megatron-Bridge's JIT warm-up (idempotent).

    ``setup()`` seeds the generators, then warms the fused kernels up on ``torch.rand`` tensors of
    ``model.seq_length`` x ``train.micro_batch_size`` tokens, then builds the model. Left alone, the
    initial weights of one seed change with the sequence length and micro batch, so two layouts of
    the same rows cannot be compared from the same start; restored, they depend on the seed alone."""
    import torch
    from megatron.bridge.training import initialize

    warmup = initialize._warmup_jit_function
    if getattr(warmup, "keeps_rng", False):
        return

    def keeping_rng(*args: Any, **kwargs: Any) -> None:
        state = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
        try:
            warmup(*args, **kwargs)
        finally:
            if state is not None:
                torch.cuda.set_rng_state(state)

    keeping_rng.keeps_rng = True  # type: ignore[attr-defined]
    initialize._warmup_jit_function = keeping_rng


def lora_on_fp8_base(cfg: Any) -> bool:
    """A LoRA run on a base stored in FP8 builds it one byte per weight (``bridge_recipes.fp8_base``)."""
    from bridge_recipes import fp8_base

    if not fp8_base.install(cfg):
        return False
    _log(f"FP8 base: the model is built with gradients off (row-wise FP8 weights), the backward {fp8_base.BACKWARD}")
    return True


def run(cfg: Any, task: str, lora_from_random_init: bool = False) -> None:
    prepare_for_registry_install(cfg)
    init_independent_of_warmup_shapes()
    attention_per_conversation_on_packed_rows(cfg)
    loss_a_chunk_at_a_time(cfg)
    lora_on_fp8_base(cfg)
    step = forward_step_for(cfg)
    entry = entry_point_for(cfg, task, lora_from_random_init)
    _log(f"starting {entry.__name__}() with {step.__module__}.forward_step")
    entry(cfg, step)
