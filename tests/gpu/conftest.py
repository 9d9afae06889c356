"""What the GPU tests share: the recipes' models at 4 layers as bare Megatron-Core models."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge_recipes.data.synthetic_chat import EVIDENCE_ROW_TOKENS, build_evidence_rows

ROW = EVIDENCE_ROW_TOKENS
TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "qwen35_chat_tokenizer"
# family: (SFT recipe, routed experts at 4 layers)
FAMILIES = {
    "qwen35_35b_a3b": ("qwen35_35b_a3b_sft_8gpu_h200_bf16_config", 32),
    "qwen35_27b": ("qwen35_27b_sft_8gpu_h200_bf16_config", None),
}


def model_config(family: str, changes: dict, fp32: bool = False):
    import torch

    from bridge_recipes.recipes import registry
    from bridge_recipes.recipes.scaledown import scale_down
    from bridge_recipes.runner.launch import prepare

    recipe, experts = FAMILIES[family]
    cfg = registry.load(recipe)()
    scale_down(cfg, num_layers=4, num_experts=experts, global_batch_size=1, seq_length=ROW)
    prepare(cfg)
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


@pytest.fixture(scope="module")
def row(tmp_path_factory):
    """The first row of the real-format evidence with boundaries, on the GPU."""
    import torch.utils.data
    from megatron.bridge.training.gpt_step import _packed_metadata_for_forward

    from bridge_recipes.data.packed_rows import PackedRowsDataset
    from bridge_recipes.hf.parity import init_single_gpu

    init_single_gpu()
    folder = tmp_path_factory.mktemp("rows") / "boundaries"
    build_evidence_rows(folder, TOKENIZER, "boundaries")
    batch = next(iter(torch.utils.data.DataLoader(PackedRowsDataset(folder, ROW, 1), batch_size=1)))
    meta = {k: (v.cuda() if k.startswith("cu_") else v) for k, v in _packed_metadata_for_forward(batch).items()}
    return batch, meta


def copy_weights(src, dst) -> None:
    """``dst``'s parameters and floating buffers set to ``src``'s values (same names)."""
    import torch

    src_p = dict(src.named_parameters())
    src_b = dict(src.named_buffers())
    with torch.no_grad():
        for n, p in dst.named_parameters():
            p.copy_(src_p[n].to(p.dtype))
        for n, b in dst.named_buffers():
            if n in src_b and b.is_floating_point() and b.shape == src_b[n].shape:
                b.copy_(src_b[n].to(b.dtype))


def gradient(model, batch, meta, segments) -> tuple[float, dict]:
    """FP32 copies of the gradients of the row's masked loss: packed (``segments`` None) or as each
    segment's conversation alone, gradients summed."""
    import torch
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    model.zero_grad(set_to_none=True)
    tokens, labels, mask = (batch[k][0].cuda() for k in ("tokens", "labels", "loss_mask"))

    def step(t, lab, m, position_ids, packed_seq_params):
        out = model(
            input_ids=t[None],
            position_ids=position_ids[None],
            attention_mask=None,
            labels=lab[None],
            loss_mask=m[None],
            packed_seq_params=packed_seq_params,
        )
        loss = (out.float().view(-1) * m.float()).sum()
        loss.backward()
        return float(loss)

    if segments is None:
        loss = step(tokens, labels, mask, batch["position_ids"][0].cuda(), get_packed_seq_params(dict(meta)))
    else:
        loss = 0.0
        for s, e in segments:
            if mask[s:e].sum() > 0:
                loss += step(tokens[s:e], labels[s:e], mask[s:e], torch.arange(e - s, device="cuda"), None)
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss, grads


@pytest.fixture(scope="session")
def gradients() -> SimpleNamespace:
    """``copy_weights(src, dst)`` and ``gradient(model, batch, meta, segments)``."""
    return SimpleNamespace(copy_weights=copy_weights, gradient=gradient)
