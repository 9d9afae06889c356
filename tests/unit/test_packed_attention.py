"""Attention over a packed row (one variable-length call, or one conversation at a time) and the mode a run takes."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch
import torch.nn.functional as F

from bridge_recipes.features import packed_attention as pa


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
    pa.set_mode(pa.DEFAULT_MODE)


def fake_varlen_attn(calls):
    """A CPU stand-in for ``torch.nn.attention.varlen.varlen_attn`` that honours what it is given:
    the boundaries, the longest conversation, the window (causal or not), the scale and fewer key heads."""

    def varlen_attn(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
    ):
        calls.append({"dtype": cu_seq_q.dtype, "max": (max_q, max_k), "window": window_size, "scale": scale})
        assert torch.equal(cu_seq_q, cu_seq_k) and query.is_contiguous() and key.is_contiguous()
        cu = cu_seq_q.tolist()
        assert max_q == max(b - a for a, b in zip(cu[:-1], cu[1:]))
        groups = query.shape[1] // key.shape[1]
        outs = []
        for a, b in zip(cu[:-1], cu[1:]):
            q, k, v = (x[a:b].permute(1, 0, 2) for x in (query, key, value))
            k, v = (x.repeat_interleave(groups, dim=0) for x in (k, v))
            outs.append(
                F.scaled_dot_product_attention(q, k, v, is_causal=tuple(window_size) == (-1, 0), scale=scale).permute(
                    1, 0, 2
                )
            )
        return torch.cat(outs)

    return varlen_attn


def test_one_varlen_call_gives_each_conversation_its_own_causal_attention(monkeypatch):
    import torch.nn.attention.varlen as varlen

    calls = []
    monkeypatch.setattr(varlen, "varlen_attn", fake_varlen_attn(calls))
    torch.manual_seed(0)
    q = torch.randn(300, 4, 8, requires_grad=True)
    k, v = (torch.randn(300, 2, 8, requires_grad=True) for _ in range(2))  # grouped-query: 2 key heads
    bounds = [0, 100, 256, 300]
    cu = torch.tensor(bounds, dtype=torch.int64)
    out = pa.flash_varlen(q, k[:, :, :], v, bounds, cu, scale=0.125)
    assert calls == [{"dtype": torch.int32, "max": (156, 156), "window": (-1, 0), "scale": 0.125}]

    def dense(q_, k_, v_):  # each conversation alone, key heads repeated to the query heads
        k_, v_ = (x.repeat_interleave(2, dim=2) for x in (k_, v_))
        o = F.scaled_dot_product_attention(*(x.permute(1, 2, 0, 3) for x in (q_, k_, v_)), is_causal=True, scale=0.125)
        return o.permute(2, 0, 1, 3).reshape(q_.shape[0], 1, -1)

    alone = pa.per_conversation(dense, q, k, v, bounds)
    assert out.shape == (300, 32) and torch.allclose(out, alone, atol=1e-6)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(alone, (q, k, v), g)):
        assert torch.allclose(a, b, atol=1e-5)


def _run(mode: str) -> NS:
    """A run whose features ask for packed attention in ``mode``."""
    return NS(features=NS(packed_attention=pa.Config(mode)))


def test_the_default_is_one_conversation_at_a_time_and_flash_varlen_only_where_proven():
    assert pa.Config().mode == "per_conversation"
    for proven in pa.FLASH_VARLEN_GPUS + (None,):  # None: no GPU known
        assert pa.problems(pa.Config("flash_varlen"), proven) == []
    for other in ((8, 9), (10, 0)):  # an L40S, a B200: not proven there
        assert pa.problems(pa.Config(), other) == [] and pa.problems(pa.Config("varlen"), other) == []
        (msg,) = pa.problems(pa.Config("flash_varlen"), other, "B200")
        assert pa.KEY in msg and f"{other[0]}.{other[1]}" in msg and "B200" in msg
        assert all(m in msg for m in pa.MODES) and "8.0" in msg and "9.0" in msg
    (msg,) = pa.problems(pa.Config("flash"))
    assert f"{pa.KEY}='flash'" in msg and all(m in msg for m in pa.MODES)


def test_the_patched_attention_routes_packed_calls_by_mode(monkeypatch):
    import torch.nn.attention.varlen as varlen
    from megatron.core.extensions.transformer_engine import TEDotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from bridge_recipes.features import packed_attention as patch

    original_calls = []

    def original(self, query, key, value, attention_mask, attn_mask_type, attention_bias=None,
                 packed_seq_params=None, num_splits=None):  # fmt: skip
        original_calls.append(query.shape)
        return query.reshape(query.shape[0], *query.shape[1:-2], -1)

    monkeypatch.setattr(TEDotProductAttention, "forward", original)
    monkeypatch.setitem(patch._state, "original", None)
    calls = []
    monkeypatch.setattr(varlen, "varlen_attn", fake_varlen_attn(calls))
    monkeypatch.setattr(patch, "_capability", lambda: (9, 0))
    assert "flash-attention" in patch.install(_run("flash_varlen")) and pa.mode() == "flash_varlen"
    try:
        me = NS(softmax_scale=0.5, config=NS(context_parallel_size=1))
        cu = torch.tensor([0, 3, 8], dtype=torch.int32)
        params = NS(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_q_padded=None)
        q, k, v = (torch.randn(8, 2, 4, dtype=torch.bfloat16) for _ in range(3))
        out = TEDotProductAttention.forward(me, q, k, v, None, AttnMaskType.causal, None, params)
        assert out.shape == (8, 8) and calls[-1]["scale"] == 0.5 and not original_calls
        TEDotProductAttention.forward(me, q[:, None], k[:, None], v[:, None], None, AttnMaskType.causal)
        assert len(original_calls) == 1 and len(calls) == 1  # not packed: the original forward
        fp32 = [x.float() for x in (q, k, v)]  # a precision the kernel does not take: one conversation at a time
        assert TEDotProductAttention.forward(me, *fp32, None, AttnMaskType.causal, None, params).shape == (8, 8)
        assert len(original_calls) == 3 and len(calls) == 1
        with pytest.raises(ValueError, match="causal self-attention only"):
            TEDotProductAttention.forward(me, q, k, v, None, AttnMaskType.no_mask, None, params)
        line = patch.install(_run("per_conversation"))  # installed once; the mode follows the config
        assert pa.mode() == "per_conversation" and "one conversation at a time" in line
        monkeypatch.setattr(patch, "_capability", lambda: (8, 9))  # a GPU flash_varlen is not proven on
        with pytest.raises(ValueError, match="not on compute capability 8.9"):
            patch.install(_run("flash_varlen"))
        assert pa.mode() == "per_conversation"
        with pytest.raises(ValueError, match="not a packed-attention mode"):
            patch.install(_run("thd"))
    finally:
        pa.set_mode(pa.DEFAULT_MODE)


def test_the_dry_run_refuses_an_unknown_mode_and_flash_varlen_on_an_unproven_gpu(capsys):
    from bridge_recipes.runner import cli

    recipe = "qwen35_35b_a3b_peft_1gpu_h200_bf16_config"
    assert cli.main(["--recipe", recipe, "--dry-run", f"{pa.KEY}=cudnn"]) == 2
    err = capsys.readouterr().err
    assert f"{pa.KEY}='cudnn'" in err and "flash_varlen" in err and "Traceback" not in err
    h200 = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
    assert cli.main(["--recipe", h200, "--dry-run", f"{pa.KEY}=flash_varlen"]) == 0
    assert "flash_varlen" in capsys.readouterr().out
    blackwell = "qwen35_35b_a3b_sft_8gpu_b200_bf16_config"
    assert cli.main(["--recipe", blackwell, "--dry-run", f"{pa.KEY}=flash_varlen"]) == 2
    err = capsys.readouterr().err
    assert "not on compute capability 10.0 (B200" in err and "per_conversation" in err and "Traceback" not in err


def test_the_old_environment_variable_is_refused_with_the_key_that_replaced_it(capsys, monkeypatch):
    from bridge_recipes.runner import cli

    recipe = "qwen35_35b_a3b_peft_1gpu_h200_bf16_config"
    old = pa.REPLACES_ENV[0]
    assert cli.main(["--recipe", recipe, "--dry-run", f"+env_vars.{old}=flash_varlen"]) == 2
    err = capsys.readouterr().err
    assert old in err and pa.KEY in err and "Traceback" not in err
    monkeypatch.setenv(old, "per_conversation")
    assert cli.main(["--recipe", recipe, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert old in err and pa.KEY in err and "Traceback" not in err


def test_the_gpu_read_is_this_ranks_or_the_first_visible(monkeypatch):
    from bridge_recipes.features import packed_attention as patch

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: asked.append(i) or (9, 0))
    for rank, index in (("1", 1), ("5", 0)):  # one GPU per rank shown: the first visible is its own
        monkeypatch.setenv("LOCAL_RANK", rank)
        assert patch._capability() == (9, 0) and asked[-1] == index
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert patch._capability() is None
