"""The Gated DeltaNet warm-up: the shape it warms, the inputs it gives the rule, and when it runs."""

from __future__ import annotations

from types import SimpleNamespace as NS

import torch

import bridge_recipes
from bridge_recipes.features import gdn_warmup

patch = gdn_warmup  # the feature module holds its patch too

LORA = "qwen35_27b_peft_1gpu_h200_bf16_lowmem_config"


def test_the_shape_is_this_ranks_value_heads_and_head_widths():
    m = bridge_recipes.build(LORA).model
    s = gdn_warmup.shape(m)
    assert s == (m.linear_num_value_heads, m.linear_key_head_dim, m.linear_value_head_dim)
    split = NS(linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
               tensor_model_parallel_size=2, context_parallel_size=2)  # fmt: skip
    assert gdn_warmup.shape(split) == (12, 128, 128)
    assert gdn_warmup.shape(NS(linear_num_value_heads=None)) is None


def test_warm_runs_the_rule_forward_and_backward_on_two_sequences_as_megatron_prepares_them():
    calls = []

    def rule(q, k, v, *, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens):
        calls.append({"q": q, "k": k, "v": v, "g": g, "beta": beta, "cu": cu_seqlens})
        assert initial_state is None and not output_final_state and not use_qk_l2norm_in_kernel
        return (q.float().sum(-1, keepdim=True) * v.float() * g[..., None] * beta[..., None].float()), None

    state = torch.random.get_rng_state()
    gdn_warmup.warm(rule, gdn_warmup.Shape(heads=4, key_dim=8, value_dim=16), torch.device("cpu"))
    assert torch.equal(torch.random.get_rng_state(), state)  # the run's random state is untouched
    (c,) = calls
    tokens = 2 * gdn_warmup.SEQUENCE_TOKENS
    assert c["q"].shape == c["k"].shape == (1, tokens, 4, 8) and c["v"].shape == (1, tokens, 4, 16)
    assert c["q"].dtype == c["v"].dtype == c["beta"].dtype == torch.bfloat16 and c["g"].dtype == torch.float32
    assert torch.allclose(c["q"].float().norm(dim=-1), torch.ones(1, tokens, 4), atol=1e-2)
    assert (c["g"] < 0).all() and ((c["beta"] > 0) & (c["beta"] < 1)).all()
    assert c["cu"].dtype == torch.int32 and c["cu"].tolist() == [0, gdn_warmup.SEQUENCE_TOKENS, tokens]
    assert all(c[x].grad is not None for x in ("q", "v", "g", "beta"))  # the backward ran


def test_it_runs_only_when_switched_on_and_hooks_the_model_build_once(monkeypatch):
    assert not patch.wanted(bridge_recipes.build(LORA))
    cfg = bridge_recipes.build(LORA, overrides=[f"{gdn_warmup.KEY}=true"])
    assert patch.wanted(cfg) and cfg.features.gdn_warmup.enabled
    line = patch.install(cfg)
    assert gdn_warmup.KEY in line and patch.install(cfg) == line
    assert cfg.model._pre_wrap_hooks.count(patch.pre_wrap_hook) == 1

    warmed = []
    monkeypatch.setattr(gdn_warmup, "warm", lambda rule, s, device: warmed.append((rule, s, device)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    chunks = [NS(config=cfg.model)]
    assert patch.pre_wrap_hook(chunks) is chunks
    ((rule, s, device),) = warmed
    from megatron.core.ssm.gated_delta_net import gdn

    assert (
        rule is gdn.chunk_gated_delta_rule and s == gdn_warmup.shape(cfg.model) and device == torch.device("cuda", 3)
    )
