"""LoRA adapters fused with their base linears against an FP32 reference.

With ``model.use_transformer_engine_op_fuser`` Megatron-Bridge wraps each adapted linear of a model without
experts in ``TEFusedLoRALinear``: Transformer Engine's op fuser runs the base GEMM and the adapter's two, the
second accumulating into the base output, with no separate add. The 27B at 4 layers (MTP head on) is built
three times with the same weights and adapters (rank 32 on the recipes' targets, both matrices random): an
FP32 reference, the BF16 model as the recipes run it, and the BF16 model with the fused adapters. On the
first packed row of the real-format evidence, each conversation run alone (the FP32 reference has no
packed-sequence path): the masked loss's relative error and the adapters' gradient error against FP32, the
unfused model's gradient error being the noise floor. The figures go to
``$OUT/lora_fused_adapters_parity.json``.

    python3 -m pytest -q -m gpu lab/tests/gpu/test_fused_lora_parity.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lab.lora_parity import against_fp32, with_lora

pytestmark = pytest.mark.gpu

FAMILY = "qwen35_27b"
# what "holds" means, fixed before the first run: the loss within 1% of FP32 and the fused adapters'
# gradient error within 1.5x the unfused model's
LOSS_REL_ERR_MAX = 0.01
NOISE_FLOOR_FACTOR = 1.5


def test_fused_adapters_match_the_unfused_ones_against_fp32(row, bare_model, gradients):
    import torch
    from megatron.bridge.peft.lora_layers import TEFusedLoRALinear

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    batch, meta = row
    cu = [int(x) for x in batch["cu_seqlens_q"][0]]
    segments = list(zip(cu[:-1], cu[1:]))
    changes = {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}
    reference = with_lora(bare_model.build(FAMILY, changes, fp32=True))
    unfused = with_lora(bare_model.build(FAMILY, changes))
    fused = with_lora(bare_model.build(FAMILY, {**changes, "use_transformer_engine_op_fuser": True}))
    wrapped = sum(isinstance(m, TEFusedLoRALinear) for m in fused.modules())
    assert wrapped > 0, "no adapted linear of the op-fuser model is a TEFusedLoRALinear"
    assert not any(isinstance(m, TEFusedLoRALinear) for m in unfused.modules())
    gradients.copy_weights(unfused, fused)
    gradients.copy_weights(unfused, reference)

    ref = gradients.gradient(reference, batch, meta, segments)
    unfused_run = gradients.gradient(unfused, batch, meta, segments)
    fused_run = gradients.gradient(fused, batch, meta, segments)
    names = (set(fused_run[1]), set(unfused_run[1]), set(ref[1]))
    assert names[0] == names[1] == names[2] and all("adapter" in n for n in ref[1]), sorted(ref[1])[:4]

    case = {
        "model": FAMILY,
        "layers": 4,
        "fused_linears": wrapped,
        "loss_fp32": ref[0],
        "loss_unfused": unfused_run[0],
        "loss_fused": fused_run[0],
        **against_fp32(ref, fused_run, unfused_run, "unfused"),
        "criterion": f"loss_rel_err <= {LOSS_REL_ERR_MAX} and adapter_grad_err <= {NOISE_FLOOR_FACTOR} x noise_floor",
    }
    floor = case["noise_floor"]
    case["holds"] = case["loss_rel_err"] <= LOSS_REL_ERR_MAX and case["adapter_grad_err"] <= NOISE_FLOOR_FACTOR * floor
    out = Path(os.environ.get("OUT", "/tmp")) / "lora_fused_adapters_parity.json"
    out.write_text(json.dumps({"cases": [case]}, indent=1) + "\n")
    print(json.dumps(case))
    assert case["holds"], case
