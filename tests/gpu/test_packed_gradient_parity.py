"""The gradient of a packed row against an FP32 reference of its conversations run alone, on one H200.

A row with boundaries is its conversations side by side, so the gradient of its masked loss must be
the sum of their gradients. The reference computes that sum in FP32 from the same weights: the
recipe's model at 4 layers (32 experts for the 35B-A3B) copied into an FP32 twin whose Gated DeltaNet
runs Megatron-Core's PyTorch convolution and chunked recurrence and whose attention runs Transformer
Engine's unfused FP32 path, with TF32 off. Against it, per part of the model (gated attention, Gated
DeltaNet, MTP, experts, the rest), the BF16 paths:

- ``alone``: each conversation alone through the recipe's BF16 kernels (the noise floor);
- ``varlen``: the packed row through Transformer Engine's THD attention kernel;
- ``per_conversation``: the packed row with attention run one conversation at a time
  (``bridge_recipes.packed_attention``), the SFT default;
- ``per_conversation_no_pad``: the same with the row's padding segment cut off.

    OUT=/path python3 -m pytest -q -m gpu tests/gpu/test_packed_gradient_parity.py

Writes ``$OUT/packed_gradient_parity.log`` (one JSON line per case and path, every part's errors)
and ``$OUT/packed_gradient_parity.json`` (the summary ``bench.parity`` reads back from the log).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from bridge_recipes.bench import parity
from bridge_recipes.data.synthetic_chat import EVIDENCE_ROW_TOKENS, build_evidence_rows

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
OUT = Path(os.environ.get("OUT") or REPO / "gpu-out")
ROW = EVIDENCE_ROW_TOKENS
NO_AUX = {"moe_aux_loss_coeff": 0.0, "moe_router_load_balancing_type": "none"}
# name: (family, model.* changes); each keeps the recipe's recompute
CASES = {
    "qwen35_27b/no_mtp": ("qwen35_27b", {"mtp_num_layers": None}),
    "qwen35_27b/mtp": ("qwen35_27b", {}),
    "qwen35_35b_a3b/mtp_aux_off": ("qwen35_35b_a3b", NO_AUX),
    "qwen35_35b_a3b/mtp_aux_on": ("qwen35_35b_a3b", {}),
}


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
def test_packed_row_gradient_against_fp32_reference(row, case, bare_model):
    import torch

    from bridge_recipes import packed_attention

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    packed_attention.install()
    family, changes = CASES[case]
    batch, meta = row
    cu = [int(x) for x in batch["cu_seqlens_q"][0]]
    segments = list(zip(cu[:-1], cu[1:]))

    model = bare_model.build(family, changes)
    ref_model = bare_model.build(family, changes, fp32=True)
    copy_weights(model, ref_model)
    ref_loss, ref = gradient(ref_model, batch, meta, segments)
    del ref_model
    torch.cuda.empty_cache()

    trimmed = without_padding_segment(batch, meta)
    runs = {  # path: (attention mode, batch, metadata, segments run alone or None for the packed row)
        "alone": ("per_conversation", batch, meta, segments),
        "varlen": ("varlen", batch, meta, None),
        "per_conversation": ("per_conversation", batch, meta, None),
        "per_conversation_no_pad": ("per_conversation", *trimmed, None),
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
        loss, grads = gradient(model, b, md, segs)
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
