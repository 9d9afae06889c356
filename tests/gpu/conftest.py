"""What the GPU tests share: the recipes' models at 4 layers as bare Megatron-Core models."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from bridge_recipes.data.synthetic_chat import EVIDENCE_ROW_TOKENS

ROW = EVIDENCE_ROW_TOKENS
# family: (SFT recipe, routed experts at 4 layers)
FAMILIES = {
    "qwen35_35b_a3b": ("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", 32),
    "qwen35_27b": ("qwen35_27b_sft_8gpu_h200_bf16_config", None),
}


def model_config(family: str, changes: dict, fp32: bool = False):
    import torch

    from bridge_recipes import registry
    from bridge_recipes.runner.launch import prepare_for_registry_install
    from bridge_recipes.scaledown import scale_down

    recipe, experts = FAMILIES[family]
    cfg = registry.load(recipe)()
    scale_down(cfg, num_layers=4, num_experts=experts, global_batch_size=1, seq_length=ROW)
    prepare_for_registry_install(cfg)
    m = cfg.model
    m.gradient_accumulation_fusion = False  # a bare model: gradients in .grad, no DDP main_grad
    for field, value in changes.items():
        setattr(m, field, value)
    if fp32:
        m.bf16 = False
        m.params_dtype = torch.float32
        m.pipeline_dtype = torch.float32
        m.deterministic_mode = True  # Megatron-Core's PyTorch Gated DeltaNet instead of the Triton kernels
        m.cross_entropy_loss_fusion = False
    m.finalize()
    return m


def build(family: str, changes: dict, fp32: bool = False):
    import torch
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    m = model_config(family, changes, fp32)
    torch.manual_seed(1234)
    model_parallel_cuda_manual_seed(1234)
    old = os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO")
    if fp32:  # Megatron-Core's TE attention asks for it in deterministic mode (the FP32 path is unfused)
        os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = "0"
    try:
        model = m.provide(pre_process=True, post_process=True).cuda().train()
    finally:
        if fp32:
            if old is None:
                os.environ.pop("NVTE_ALLOW_NONDETERMINISTIC_ALGO")
            else:
                os.environ["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] = old
    return model


@pytest.fixture(scope="session")
def bare_model() -> SimpleNamespace:
    """``build(family, model changes, fp32=False)`` and its ``model_config``."""
    return SimpleNamespace(build=build, model_config=model_config)
