"""Attention one conversation at a time over a packed row, and the parity measure of its gradients."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch
import torch.nn.functional as F

from bridge_recipes import packed_attention as pa


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
