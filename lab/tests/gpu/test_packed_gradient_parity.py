"""The gradient of a packed row against an FP32 reference of its conversations run alone, on one Hopper GPU.

A row with boundaries is its conversations side by side, so the gradient of its masked loss must be
the sum of their gradients. The reference computes that sum in FP32 from the same weights: the
recipe's model at 4 layers (32 experts for the 35B-A3B) copied into an FP32 twin whose Gated DeltaNet
runs Megatron-Core's PyTorch convolution and chunked recurrence and whose attention runs Transformer
Engine's unfused FP32 path, with TF32 off. Against it, per part of the model (gated attention, Gated
DeltaNet, MTP, experts, the rest), the BF16 paths:

- ``alone``: each conversation alone through the recipe's BF16 kernels (the noise floor);
- ``varlen``: the packed row through Transformer Engine's THD attention kernel;
- ``per_conversation``: the packed row with attention run one conversation at a time
  (``bridge_recipes.features.packed_attention``), the default on GPUs other than A100, H100 and H200;
- ``per_conversation_no_pad``: the same with the row's padding segment cut off;
- ``flash_varlen``: the packed row through one call of PyTorch's variable-length flash attention,
  the default on A100, H100 and H200.

    OUT=/path python3 -m pytest -q -m gpu lab/tests/gpu/test_packed_gradient_parity.py

Writes ``$OUT/packed_gradient_parity.log`` (one JSON line per case and path, every part's errors)
and ``$OUT/packed_gradient_parity.json`` (the summary ``bench.parity`` reads back from the log).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from lab import parity

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT") or REPO / "gpu-out")
NO_AUX = {"moe_aux_loss_coeff": 0.0, "moe_router_load_balancing_type": "none"}
# name: (family, model.* changes); each keeps the recipe's recompute
CASES = {
    "qwen35_27b/no_mtp": ("qwen35_27b", {"mtp_num_layers": None}),
    "qwen35_27b/mtp": ("qwen35_27b", {}),
    "qwen35_35b_a3b/mtp_aux_off": ("qwen35_35b_a3b", NO_AUX),
    "qwen35_35b_a3b/mtp_aux_on": ("qwen35_35b_a3b", {}),
}


def without_padding_segment(batch, meta):
    """The row cut at the end of its last segment with a loss, and its metadata to match."""
    from bridge_recipes.data.packed_rows import packed_seq_keys

    cu = [int(x) for x in batch["cu_seqlens_q"][0]]
    mask = batch["loss_mask"][0]
    while len(cu) > 2 and float(mask[cu[-2] : cu[-1]].sum()) == 0:
        cu.pop()
    end = cu[-1]
    cut = {k: batch[k][:, :end] for k in ("tokens", "labels", "loss_mask", "position_ids")}
    keys = {k: v[None] for k, v in packed_seq_keys(cu).items()}
    new_meta = {k: (v.cuda() if k.startswith("cu_") else v) for k, v in keys.items()}
    return {**batch, **cut, "cu_seqlens_q": keys["cu_seqlens_q"]}, new_meta


def log_line(record: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "packed_gradient_parity.log", "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "params"}))


@pytest.mark.parametrize("case", list(CASES))
def test_packed_row_gradient_against_fp32_reference(row, case, bare_model, gradients):
    from types import SimpleNamespace

    import torch

    from bridge_recipes.features import packed_attention

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # routing installed once; each path below sets its mode (flash_varlen is tested on the GPUs it may run on)
    packed_attention.install(SimpleNamespace(features=SimpleNamespace(packed_attention=packed_attention.Config())))
    family, changes = CASES[case]
    batch, meta = row
    cu = [int(x) for x in batch["cu_seqlens_q"][0]]
    segments = list(zip(cu[:-1], cu[1:]))

    model = bare_model.build(family, changes)
    ref_model = bare_model.build(family, changes, fp32=True)
    gradients.copy_weights(model, ref_model)
    ref_loss, ref = gradients.gradient(ref_model, batch, meta, segments)
    del ref_model
    torch.cuda.empty_cache()

    trimmed = without_padding_segment(batch, meta)
    runs = {  # path: (attention mode, batch, metadata, segments run alone or None for the packed row)
        "alone": ("per_conversation", batch, meta, segments),
        "varlen": ("varlen", batch, meta, None),
        "per_conversation": ("per_conversation", batch, meta, None),
        "per_conversation_no_pad": ("per_conversation", *trimmed, None),
        "flash_varlen": ("flash_varlen", batch, meta, None),
    }
    m = bare_model.model_config(family, changes)
    facts = {
        "model": family,
        "mtp": bool(m.mtp_num_layers),
        "grouped_gemm": bool(getattr(m, "moe_grouped_gemm", False)),
        "aux_loss": bool(getattr(m, "num_moe_experts", None)) and (m.moe_aux_loss_coeff or 0) > 0,
        "recompute": m.recompute_granularity,
    }
    for path, (attention, b, md, segs) in runs.items():
        packed_attention.set_mode(attention)
        loss, grads = gradients.gradient(model, b, md, segs)
        log_line({"case": case, "path": path, **facts, "segments": segments, "loss": loss, "ref_loss": ref_loss,
                  **parity.compare(grads, ref)})  # fmt: skip
        del grads
    del model
    torch.cuda.empty_cache()
    packed_attention.set_mode("per_conversation")

    records = [json.loads(x) for x in (OUT / "packed_gradient_parity.log").read_text().splitlines()]
    summary = parity.summarize(records)
    (OUT / "packed_gradient_parity.json").write_text(json.dumps(summary, indent=1) + "\n")
    mine = next(s for s in summary if s["name"] == case and s["default_path"])
    assert math.isfinite(mine["grad_norm_ratio"]), mine
    assert parity.holds(mine), mine
