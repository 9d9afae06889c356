"""The APEX stand-in on the GPU: Transformer Engine's GEMM accumulates the weight gradient into an
FP32 main gradient as APEX's ``wgrad_gemm_accum_fp32`` does, at the GPT output layer's shape and at an
expert's, and Megatron-Core's own ``ColumnParallelLinear`` builds and trains with fusion on.

    OUT=/path/for/results python3 -m pytest -q -m gpu tests/gpu/test_te_wgrad.py

Writes ``$OUT/te_wgrad.json`` with the largest relative differences against an FP32 reference.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

# BF16 inputs with FP32 accumulation against an FP32 GEMM of the same BF16 values: the difference is
# the order of summation only, far under a BF16 ulp (2^-8) of the result
TOLERANCE = 1e-3
# (tokens, in, out): the 35B-A3B's output layer on a 4,096-token slice of its 248,320 vocabulary,
# and one expert's fc1 (2,048 in, 2 x 512 out) over ~2,048 tokens
SHAPES = [(4096, 2048, 8192), (2048, 2048, 1024)]


def _result(name: str, value) -> None:
    out = Path(os.environ.get("OUT", "/tmp"))
    path = out / "te_wgrad.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[name] = value
    path.write_text(json.dumps(doc, indent=1))


@pytest.mark.parametrize("tokens,fan_in,fan_out", SHAPES)
@pytest.mark.parametrize("grad_dtype", ["float32", "bfloat16"])
def test_the_stand_in_accumulates_like_apex(tokens, fan_in, fan_out, grad_dtype):
    """FP32 main gradients (APEX's wgrad_gemm_accum_fp32) and BF16 ones (wgrad_gemm_accum_fp16, used when
    the gradient buffer is BF16), against the same sums in FP32: BF16 accumulation within a BF16 ulp."""
    import torch

    from bridge_recipes.features import te_wgrad

    dtype = getattr(torch, grad_dtype)
    torch.manual_seed(0)
    x = torch.randn(tokens, fan_in, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, fan_out, device="cuda", dtype=torch.bfloat16)
    start = torch.randn(fan_out, fan_in, device="cuda", dtype=torch.float32).to(dtype)
    main_grad = start.clone()
    accumulate = te_wgrad.wgrad_gemm_accum_fp32 if dtype == torch.float32 else te_wgrad.wgrad_gemm_accum_fp16
    accumulate(x, dy, main_grad)
    accumulate(x, dy, main_grad)  # a second micro batch accumulates again
    reference = start.float() + 2 * (dy.float().t() @ x.float())
    rel = ((main_grad.float() - reference).abs().max() / reference.abs().max()).item()
    _result(f"{tokens}x{fan_in}x{fan_out}_{grad_dtype}", {"max_relative_difference": rel})
    assert main_grad.dtype == dtype and rel < (TOLERANCE if dtype == torch.float32 else 2**-7)


def test_megatrons_column_parallel_linear_trains_with_the_stand_in():
    """The layer that refuses fusion without APEX builds with the stand-in installed, and its weight
    gradient lands in main_grad (the DDP wrapper's buffer) instead of .grad."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import layers

    from bridge_recipes.features import te_wgrad
    from bridge_recipes.features.te_wgrad import serve_as_apex

    assert te_wgrad.self_check() is None  # what the runner checks before it keeps fusion on
    serve_as_apex()
    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29561", world_size=1, rank=0)
    parallel_state.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(1234)  # the weights initialize under its RNG tracker
    try:
        config = ModelParallelConfig(gradient_accumulation_fusion=True, params_dtype=torch.bfloat16)
        layer = layers.ColumnParallelLinear(
            256, 512, config=config, init_method=torch.nn.init.normal_, bias=False, gather_output=True
        ).cuda()
        layer.weight.main_grad = torch.zeros(512, 256, device="cuda", dtype=torch.float32)
        layer.weight.grad_added_to_main_grad = False
        x = torch.randn(64, 1, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out, _ = layer(x)
        out.float().pow(2).sum().backward()
        reference = 2 * out.float().reshape(64, 512).t() @ x.detach().float().reshape(64, 256)
        rel = ((layer.weight.main_grad - reference).abs().max() / reference.abs().max()).item()
        _result("column_parallel_linear", {"max_relative_difference": rel})
        # the gradient reaching the layer (2 x its BF16 output) is exact in BF16: only summation order differs
        assert rel < TOLERANCE and layer.weight.grad_added_to_main_grad
    finally:
        parallel_state.destroy_model_parallel()
