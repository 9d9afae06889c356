"""Attention one conversation at a time over a packed row, and the parity measure of its gradients."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest
import torch
import torch.nn.functional as F

from bridge_recipes import packed_attention as pa
from bridge_recipes.bench import parity


def causal(q, k, v):
    """Causal attention on ``[s, 1, heads, dim]`` tensors, output ``[s, 1, heads * dim]`` (TE's sbhd)."""
    o = F.scaled_dot_product_attention(*(x.permute(1, 2, 0, 3) for x in (q, k, v)), is_causal=True)
    return o.permute(2, 0, 1, 3).reshape(q.shape[0], 1, -1)


def test_each_conversation_attends_to_itself_alone_forward_and_backward():
    torch.manual_seed(0)
    q, k, v = (torch.randn(300, 2, 8, requires_grad=True) for _ in range(3))
    bounds = [0, 100, 100, 256, 300]  # an empty segment, and one (156) that is not a multiple of PAD_TO
    lengths = []

    def call(q_, k_, v_):
        lengths.append(q_.shape[0])
        return causal(q_, k_, v_)

    out = pa.per_conversation(call, q, k, v, bounds)
    alone = torch.cat(
        [
            causal(q[s:e, None], k[s:e, None], v[s:e, None]).reshape(e - s, -1)
            for s, e in ((0, 100), (100, 256), (256, 300))
        ]
    )
    assert out.shape == (300, 16) and torch.allclose(out, alone, atol=1e-6)
    assert lengths == [128, 256, 128]  # padded at the end to a multiple of PAD_TO, empty ones skipped
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(alone, (q, k, v), g)):
        assert torch.allclose(a, b, atol=1e-5)
    cross = F.scaled_dot_product_attention(*(x.permute(1, 0, 2)[None] for x in (q, k, v)), is_causal=True)
    assert not torch.allclose(out[150:], cross[0].permute(1, 0, 2).reshape(300, -1)[150:], atol=1e-3)


def test_boundaries_refuse_padding_between_conversations():
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)
    assert pa.boundaries(NS(cu_seqlens_q=cu, cu_seqlens_q_padded=None, cu_seqlens_kv=cu.clone())) == [0, 5, 9]
    with pytest.raises(ValueError, match="padding between conversations"):
        pa.boundaries(NS(cu_seqlens_q=cu, cu_seqlens_q_padded=torch.tensor([0, 8, 16]), cu_seqlens_kv=cu))
    with pytest.raises(ValueError, match="same boundaries"):
        pa.boundaries(NS(cu_seqlens_q=cu, cu_seqlens_q_padded=None, cu_seqlens_kv=torch.tensor([0, 4, 9])))
    # read once a micro batch: later calls with the same parameters do not read the device again
    params = NS(cu_seqlens_q=cu, cu_seqlens_q_padded=None, cu_seqlens_kv=cu)
    assert pa.boundaries(params) == [0, 5, 9]
    params.cu_seqlens_kv = torch.tensor([0, 4, 9])  # not read again: the kept copy answers
    assert pa.boundaries(params) == [0, 5, 9]
    params.cu_seqlens_q = torch.tensor([0, 3, 9], dtype=torch.int32)  # new boundaries are read
    with pytest.raises(ValueError, match="same boundaries"):
        pa.boundaries(params)
    with pytest.raises(ValueError, match="not one of"):
        pa.set_mode("thd")
    pa.set_mode("varlen")
    assert pa.mode() == "varlen"
    pa.set_mode("per_conversation")


def _grads(**scale):
    names = {
        "decoder.layers.3.self_attention.linear_qkv.weight": "attention",
        "decoder.layers.0.self_attention.in_proj.weight": "gdn",
        "decoder.layers.0.mlp.experts.linear_fc1.weight0": "experts",
        "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight": "mtp",
        "embedding.word_embeddings.weight": "rest",
    }
    torch.manual_seed(1)
    ref = {n: torch.randn(4, 4) for n in names}
    return ref, {n: t * scale.get(names[n], 1.0) for n, t in ref.items()}, names


def test_compare_measures_each_part_against_the_reference():
    ref, grads, names = _grads(attention=1.5)
    for n, part in names.items():
        assert parity.part_of(n) == part
    r = parity.compare(grads, ref)
    assert r["max_rel_err"]["attention"] == pytest.approx(0.5) and r["max_rel_err"]["gdn"] == 0.0
    assert r["params"][0] == ("decoder.layers.3.self_attention.linear_qkv.weight", pytest.approx(0.5))
    assert r["ref_grad_norm"] == pytest.approx(math.sqrt(sum(float(t.pow(2).sum()) for t in ref.values())))
    ref, grads, _ = _grads()
    grads["decoder.layers.3.self_attention.linear_qkv.weight"][0, 0] = float("nan")
    broken = parity.compare(grads, ref)
    assert math.isnan(broken["max_rel_err"]["attention"]) and broken["max_rel_err"]["gdn"] == 0.0
    del grads["embedding.word_embeddings.weight"]
    assert parity.compare(grads, ref)["missing"] == ["embedding.word_embeddings.weight"]


def _record(case, path, grads, ref):
    return {"case": case, "path": path, "model": "m", "mtp": True, "grouped_gemm": True, **parity.compare(grads, ref)}


def test_summary_holds_a_path_to_the_noise_floor_of_the_conversations_alone():
    ref, noise, _ = _grads(attention=1.01, gdn=1.01)
    _, good, _ = _grads(attention=1.02)
    _, bad, _ = _grads(attention=1.5)
    nan = {n: t * float("nan") for n, t in ref.items()}
    records = [
        _record("c", "alone", noise, ref),
        _record("c", "per_conversation", good, ref),
        _record("c", "varlen", bad, ref),
        _record("c", "broken", nan, ref),
    ]
    cases = {c["path"]: c for c in parity.summarize(records)}
    assert set(cases) == {"per_conversation", "varlen", "broken"}  # the noise path is the floor, not a case
    assert cases["per_conversation"]["default_path"] and not cases["varlen"]["default_path"]
    assert cases["per_conversation"]["noise_floor"] == pytest.approx(0.01, rel=1e-4)
    assert cases["per_conversation"]["holds"] and not cases["varlen"]["holds"]
    assert cases["broken"]["grad_norm_ratio"] is None and not cases["broken"]["holds"]
    assert cases["broken"]["max_rel_err_attention"] is None and cases["broken"]["max_rel_err_gdn"] is None
    assert parity.summarize(records[1:]) == []  # no floor, no verdict
    lo, hi = parity.NORM_RATIO
    base = {"max_rel_err_attention": 0.01, "noise_floor": 0.01}
    assert parity.holds({**base, "grad_norm_ratio": lo}) and not parity.holds({**base, "grad_norm_ratio": hi + 1e-3})
