"""Boundary proof on one GPU: with conversation boundaries, the second conversation of a packed row
does not see the first; without them, it does.

A 4-layer Qwen3.5-27B stack (3 Gated DeltaNet layers and 1 gated-attention layer, real widths,
random weights, BF16; MTP off) runs forward on two rows that differ only in their first
conversation. The rows come from scripts/build_sft_rows.py's library (boundaries mode, the
fixture tokenizer's chat template), the sample from the sft-rows dataset, and the packed-sequence
parameters from Megatron-Bridge's own batch path (collate, ``_packed_metadata_for_forward``,
``get_packed_seq_params``), so the whole chain of ``--dataset sft-rows`` is exercised.

    OUT=/path/for/results python3 -m pytest -q -m gpu tests/gpu/test_packed_boundaries.py

Writes ``$OUT/packed_boundaries.json`` with the measured logit differences.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "qwen35_chat_tokenizer"
ROW = 1024
# The same kernels on the same tokens: BF16 noise bound, relative to the logits' scale.
SAME_TOLERANCE = 1e-2
# The conversation run alone goes through other kernels (dense attention and GDN instead of the
# varlen THD ones), so its logits may differ by rounding: 4 BF16 ulps (8 significant bits) at
# the logits' scale.
ALONE_ULPS = 4


def bf16_ulp(x: float) -> float:
    import math

    return 2.0 ** (math.floor(math.log2(x)) - 7)


def conversations(first_topic: str) -> list[dict]:
    first = [
        {"role": "user", "content": f"Tell me about {first_topic} " * 20},
        {"role": "assistant", "content": f"Here is a long answer about {first_topic}. " * 20},
    ]
    second = [
        {"role": "user", "content": "What is the weather in Paris today?"},
        {"role": "assistant", "content": "It is sunny and 21 degrees in Paris. " * 8},
    ]
    # The builder's seed-42 permutation of two conversations reads the second record first.
    return [{"messages": second}, {"messages": first}]


def build_rows(tmp: Path, first_topic: str) -> Path:
    from bridge_recipes.data.sft_rows import build_sft_rows

    src = tmp / f"{first_topic.replace(' ', '-')}.jsonl"
    src.write_text("".join(json.dumps(c) + "\n" for c in conversations(first_topic)))
    out = tmp / f"rows-{first_topic.replace(' ', '-')}"
    build_sft_rows(src, TOKENIZER, out, row_tokens=ROW, progress=False)
    return out


def batch_of(folder: Path):
    import torch.utils.data
    from megatron.bridge.training.gpt_step import _packed_metadata_for_forward
    from megatron.bridge.training.utils.packed_seq_utils import get_packed_seq_params

    from bridge_recipes.data.packed_rows import PackedRowsDataset

    ds = PackedRowsDataset(folder, ROW, 1)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=1)))
    meta = {k: (v.cuda() if k.startswith("cu_") else v) for k, v in _packed_metadata_for_forward(batch).items()}
    return batch, get_packed_seq_params(meta)


@pytest.fixture(scope="module")
def model():
    import torch
    from megatron.core import parallel_state, tensor_parallel

    from bridge_recipes.models.qwen35 import build_provider
    from bridge_recipes.recipes.scaledown import hybrid_pattern

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl", world_size=1, rank=0)
    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    provider = build_provider(
        "qwen35_27b", num_layers=4, mtp_num_layers=None, seq_length=ROW, gradient_accumulation_fusion=False
    )
    if isinstance(provider.linear_attention_freq, list):
        provider.linear_attention_freq = hybrid_pattern(4, 4)
    provider.bf16, provider.params_dtype = True, torch.bfloat16
    provider.finalize()
    m = provider.provide(pre_process=True, post_process=True).cuda().eval()
    yield m
    parallel_state.destroy_model_parallel()


def logits(model, batch, packed):
    import torch

    with torch.no_grad():
        out = model(
            input_ids=batch["tokens"].cuda(),
            position_ids=batch["position_ids"].cuda()
            if packed is not None
            else torch.arange(ROW, device="cuda").unsqueeze(0),
            attention_mask=None,
            packed_seq_params=packed,
        )
    return out.float()[0]  # [s, vocab]


def logits_alone(model, tokens):
    """The conversation run by itself: a row of its own length, positions from 0, no packing."""
    import torch

    with torch.no_grad():
        out = model(
            input_ids=tokens.cuda(),
            position_ids=torch.arange(tokens.shape[1], device="cuda").unsqueeze(0),
            attention_mask=None,
        )
    return out.float()[0]


def test_second_conversation_does_not_see_the_first_with_boundaries(model, tmp_path):
    a_rows, b_rows = build_rows(tmp_path, "item 1234"), build_rows(tmp_path, "item 5678")
    a, a_packed = batch_of(a_rows)
    b, b_packed = batch_of(b_rows)
    cu = a["cu_seqlens_q"][0].tolist()
    assert cu == b["cu_seqlens_q"][0].tolist() and len(cu) == 4, cu  # first, second, padding
    first, second = slice(cu[0], cu[1]), slice(cu[1], cu[2])
    assert not a["tokens"][0][first].equal(b["tokens"][0][first])  # the first conversations differ
    assert a["tokens"][0][second].equal(b["tokens"][0][second])  # the second is the same

    with_a, with_b = logits(model, a, a_packed)[second], logits(model, b, b_packed)[second]
    plain_a, plain_b = logits(model, a, None)[second], logits(model, b, None)[second]
    alone = logits_alone(model, a["tokens"][:, second])
    scale = float(with_a.abs().max())
    result = {
        "row_tokens": ROW,
        "cu_seqlens": cu,
        "logit_scale": scale,
        "boundaries_max_abs_diff": float((with_a - with_b).abs().max()),
        "no_boundaries_max_abs_diff": float((plain_a - plain_b).abs().max()),
        "boundaries_vs_alone_max_abs_diff": float((with_a - alone).abs().max()),
    }
    out = Path(os.environ.get("OUT") or tmp_path)
    (out / "packed_boundaries.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    assert result["boundaries_max_abs_diff"] <= SAME_TOLERANCE * scale
    assert result["boundaries_vs_alone_max_abs_diff"] <= ALONE_ULPS * bf16_ulp(scale)  # as if it were alone
    assert result["no_boundaries_max_abs_diff"] > 10 * max(result["boundaries_max_abs_diff"], SAME_TOLERANCE * scale)
