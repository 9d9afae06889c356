"""Scale-down keeps the execution policy and reports every change."""

from bridge_recipes import registry
from bridge_recipes.runner import checks
from bridge_recipes.scaledown import hybrid_pattern, scale_down


def test_keeps_policy_and_shrinks_layout():
    cfg = registry.load("qwen35_27b_sft_8gpu_h200_bf16_config")()
    kept = (
        cfg.model.recompute_granularity,
        cfg.model.recompute_method,
        cfg.optimizer.use_precision_aware_optimizer,
        cfg.model.attention_backend,
        cfg.mixed_precision,
        dict(cfg.env_vars),
        cfg.model.cross_entropy_fusion_impl,
    )
    changes = scale_down(cfg, num_layers=4, global_batch_size=4)
    assert (
        cfg.model.recompute_granularity,
        cfg.model.recompute_method,
        cfg.optimizer.use_precision_aware_optimizer,
        cfg.model.attention_backend,
        cfg.mixed_precision,
        dict(cfg.env_vars),
        cfg.model.cross_entropy_fusion_impl,
    ) == kept
    assert cfg.model.recompute_num_layers == 3  # 12 of 16 layers per stage -> 3 of 4
    assert list(cfg.model.linear_attention_freq) == [1, 1, 1, 0]
    assert checks.errors(checks.check(cfg, 1)) == []
    assert "model.pipeline_model_parallel_size: 4 -> 1" in changes
    assert "model.num_layers: 64 -> 4" in changes


def test_experts_shrink_with_top_k_capped():
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    changes = scale_down(cfg, num_layers=8, num_experts=4)
    assert (cfg.model.num_moe_experts, cfg.model.moe_router_topk, cfg.model.expert_model_parallel_size) == (4, 4, 1)
    assert "model.moe_router_topk: 8 -> 4" in changes
    assert hybrid_pattern(8) == [1, 1, 1, 0, 1, 1, 1, 0]


def test_layers_must_be_a_multiple_of_the_period():
    import pytest

    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    with pytest.raises(ValueError, match="multiple of the GDN/attention period 4"):
        scale_down(cfg, num_layers=6)


def test_flex_dispatcher_falls_back_to_alltoall_on_one_gpu():
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h100_bf16_config")()
    changes = scale_down(cfg)
    assert (
        cfg.model.moe_token_dispatcher_type == "alltoall"
        and "model.moe_token_dispatcher_type: flex -> alltoall" in changes
    )
