"""LoRA on a frozen base stored in FP8 (``bridge_recipes.features.fp8_base``) against an FP32 reference.

The recipe's model at 4 layers (MTP head on; 32 grouped experts for the 35B-A3B) is built three
times with the same LoRA adapters (rank 32 on the recipes' targets, both matrices random): an FP32
reference, a BF16 base and an FP8 base (row-wise FP8 weights), the last run both ways it can multiply:
BF16 GEMMs on the dequantized weights (the recipes' default) and FP8 forward GEMMs with the
dequantized BF16 backward. All three hold the same base weights: the FP8 model's, dequantized, so what is
compared is the computation, not the rounding of the weights to FP8 (a choice of the recipe, as
QLoRA's 4-bit base is). On the first packed row of the real-format evidence, each conversation run
alone and cut to a multiple of 16 tokens (the FP32 reference has no packed-sequence path): the masked loss's
relative error and the adapters' gradient error against FP32, the BF16 base's gradient error being
the noise floor (``holds`` judges the default, BF16 compute; the FP8-compute figures sit beside
it); and that the FP8 weights stay one byte (no transpose kept after the backward).
The figures go to ``$OUT/lora_fp8_base_parity.json`` (``lab/results/lora_fp8_base_parity.json``).

    python3 -m pytest -q -m gpu lab/tests/gpu/test_fp8_base_parity.py
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from lab.lora_parity import adapter_vector, against_fp32, rel, with_lora

pytestmark = pytest.mark.gpu

FAMILIES = ("qwen35_35b_a3b", "qwen35_27b")
FP8_BASE = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param": True, "first_last_layers_bf16": False}
# what "holds" means, fixed before the first run: the loss within 1% of FP32 and the adapters'
# gradient within 10% (relative norm of the difference) of FP32's
LOSS_REL_ERR_MAX = 0.01
ADAPTER_GRAD_ERR_MAX = 0.10
FP8_TOKENS = 16
RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def dequantized_backward():
    """Megatron-Core's FP8 recipe with the dequantized backward, as the runner installs it; the figures
    written at the end."""
    from megatron.core import fp8_utils

    from bridge_recipes.features import fp8_base

    saved = fp8_utils.get_fp8_recipe
    fp8_utils.get_fp8_recipe = fp8_base.with_dequantized_backward(saved)
    yield
    fp8_utils.get_fp8_recipe = saved
    out = Path(os.environ.get("OUT", "/tmp")) / "lora_fp8_base_parity.json"
    out.write_text(json.dumps({"cases": list(RESULTS.values())}, indent=1) + "\n")


@contextlib.contextmanager
def bf16_compute():
    """Megatron-Core's FP8 context factory without run-time autocast, as the runner installs it for BF16
    compute."""
    from bridge_recipes.features import fp8_base

    replaced = fp8_base.drop_fp8_autocast()
    assert replaced, "no Megatron module binds get_fp8_context"
    try:
        yield
    finally:
        for module, original in replaced:
            module.get_fp8_context = original


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_base_gradients_are_close_to_fp32(family, row, bare_model, gradients):
    import torch

    from bridge_recipes.features import fp8_base

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    batch, meta = row
    # each conversation of the row alone (the FP32 reference runs no packed sequence), for all three, cut
    # to a multiple of 16 tokens: an FP8 GEMM takes a multiple of 8 rows (a packed row's 8,192 are)
    cu = [int(x) for x in batch["cu_seqlens_q"][0]]
    segments = [(s, s + (e - s) // FP8_TOKENS * FP8_TOKENS) for s, e in zip(cu[:-1], cu[1:]) if e - s >= FP8_TOKENS]
    changes = {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}
    reference = with_lora(bare_model.build(family, changes, fp32=True))
    bf16 = with_lora(bare_model.build(family, changes))
    with torch.no_grad():  # row-wise FP8 weights, no BF16 copy kept (fp8_base.build_without_grad)
        fp8 = with_lora(bare_model.build(family, {**changes, **FP8_BASE}))
    count, size, _ = fp8_base.fp8_weights(fp8)
    assert count > 0, "no weight of the FP8-base model is an FP8 tensor"
    gradients.copy_weights(bf16, fp8)  # the base quantized to FP8, the adapters copied
    gradients.copy_weights(fp8, reference)  # every model on the FP8 model's weights
    gradients.copy_weights(fp8, bf16)

    ref_loss, ref = gradients.gradient(reference, batch, meta, segments)
    bf16_loss, bf16_grads = gradients.gradient(bf16, batch, meta, segments)
    fp8_loss, fp8_grads = gradients.gradient(fp8, batch, meta, segments)
    with bf16_compute():
        bf16c_loss, bf16c_grads = gradients.gradient(fp8, batch, meta, segments)
    assert set(fp8_grads) == set(bf16_grads) == set(ref) and all("adapter" in n for n in ref), sorted(ref)[:4]
    _, _, transposed = fp8_base.fp8_weights(fp8)

    r = adapter_vector(ref)
    case = {
        "model": family,
        "layers": 4,
        "fp8_weights": count,
        "fp8_weight_gb": round(size / 1e9, 4),
        "loss_fp32": ref_loss,
        "loss_bf16_base": bf16_loss,
        "compute": "bf16",
        "loss_fp8_base": bf16c_loss,
        **against_fp32((ref_loss, ref), (bf16c_loss, bf16c_grads), (bf16_loss, bf16_grads), "bf16_base"),
        "loss_rel_err_fp8_compute": abs(fp8_loss - ref_loss) / abs(ref_loss),
        "adapter_grad_err_fp8_compute": rel(adapter_vector(fp8_grads), r),
        "weights_with_transpose_after_backward": len(transposed),
        "criterion": f"loss_rel_err <= {LOSS_REL_ERR_MAX} and adapter_grad_err <= {ADAPTER_GRAD_ERR_MAX}",
    }
    case["holds"] = case["loss_rel_err"] <= LOSS_REL_ERR_MAX and case["adapter_grad_err"] <= ADAPTER_GRAD_ERR_MAX
    RESULTS[family] = case
    print(json.dumps(case))
    assert not transposed, f"FP8 weights holding a transpose after the backward: {transposed[:3]}"
    assert case["holds"], case
