"""Scale-down keeps the execution policy and reports every change."""

import re

from bridge_recipes.recipes import registry
from bridge_recipes.recipes.scaledown import hybrid_pattern, scale_down
from bridge_recipes.runner import checks


def _changed(changes: list[str]) -> dict[str, str]:
    """The changes scale_down reports (``field: old -> new``) by field."""
    return dict(change.split(": ", 1) for change in changes if ": " in change)


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
    changed = _changed(changes)
    assert changed["model.pipeline_model_parallel_size"] == "4 -> 1" and changed["model.num_layers"] == "64 -> 4"


def test_experts_shrink_with_top_k_capped():
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    changes = scale_down(cfg, num_layers=8, num_experts=4)
    assert (cfg.model.num_moe_experts, cfg.model.moe_router_topk, cfg.model.expert_model_parallel_size) == (4, 4, 1)
    assert _changed(changes)["model.moe_router_topk"] == "8 -> 4"
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
        and _changed(changes)["model.moe_token_dispatcher_type"] == "flex -> alltoall"
    )


# --- shrinking to several GPUs --------------------------------------------------------------

import pytest  # noqa: E402

from bridge_recipes.plan.layout import layout_of, stage_layers  # noqa: E402
from bridge_recipes.recipes.scaledown import fit_layout  # noqa: E402


def _sizes(cfg):
    m = cfg.model
    return (
        m.tensor_model_parallel_size,
        m.pipeline_model_parallel_size,
        m.context_parallel_size,
        m.expert_model_parallel_size,
        m.expert_tensor_parallel_size or 1,
        m.virtual_pipeline_model_parallel_size,
        m.num_layers_in_first_pipeline_stage,
        m.num_layers_in_last_pipeline_stage,
    )


@pytest.mark.parametrize("name", sorted(registry.discover()))
def test_at_its_own_size_a_recipe_keeps_its_whole_layout(name):
    cfg = registry.load(name)()
    gpus = registry.find(name).meta.gpus
    fit = fit_layout(cfg, gpus, cfg.model.num_layers, None)
    assert (fit.tp, fit.pp, fit.cp, fit.ep, fit.etp, fit.vpp, fit.first, fit.last) == _sizes(cfg)


@pytest.mark.parametrize("name", sorted(registry.discover()))
@pytest.mark.parametrize("gpus", [2, 4])
def test_a_scaled_layout_passes_the_checks_on_its_gpus(name, gpus):
    cfg = registry.load(name)()
    experts = 16 if cfg.model.num_moe_experts else None
    scale_down(cfg, num_layers=min(8, cfg.model.num_layers), num_experts=experts, global_batch_size=8, gpus=gpus)
    assert checks.errors(checks.check(cfg, gpus)) == []
    assert layout_of(cfg, gpus).dp * layout_of(cfg, gpus).model_parallel == gpus


def test_moe_policy_on_two_gpus_keeps_expert_parallelism():
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    changes = scale_down(cfg, num_layers=4, num_experts=64, global_batch_size=8, gpus=2)
    assert layout_of(cfg, 2).label() == "TP1 PP1 EP2 ETP1 DP2"
    assert _changed(changes)["model.expert_model_parallel_size"] == "8 -> 2"


def test_expert_parallelism_wins_over_pipeline_stages_then_tp_with_sp():
    """slime's H100 layout (TP2 SP PP2 CP2 EP4) on two GPUs: EP first, then TP with SP."""
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h100_bf16_config")()
    scale_down(cfg, num_layers=4, num_experts=64, global_batch_size=8, gpus=2)
    assert layout_of(cfg, 2).label(show_sp=True) == "TP2 SP PP1 EP2 ETP1 DP1"


def test_dense_pipeline_keeps_stages_and_recomputed_share():
    cfg = registry.load("qwen35_27b_sft_8gpu_h200_bf16_config")()
    changes = scale_down(cfg, num_layers=8, global_batch_size=8, gpus=2)
    assert layout_of(cfg, 2).label() == "TP1 PP2 DP1" and stage_layers(cfg) == [4, 4]
    assert cfg.model.recompute_num_layers == 3  # 12 of the largest stage's 17 -> 3 of 4
    assert _changed(changes)["model.pipeline_model_parallel_size"] == "4 -> 2"


def test_uneven_split_is_scaled_in_proportion():
    """16/17/17/14 of 64 layers: 32 layers keep a heavier first and a lighter last stage."""
    cfg = registry.load("qwen35_27b_sft_8gpu_h200_bf16_config")()
    scale_down(cfg, num_layers=32, global_batch_size=8, gpus=4)
    assert stage_layers(cfg) == [9, 8, 8, 7]
    assert checks.errors(checks.check(cfg, 4)) == []


@pytest.mark.parametrize("gpus", [0, -1])
def test_gpu_count_must_be_positive(gpus):
    cfg = registry.load("qwen35_35b_a3b_sft_8gpu_h200_bf16_config")()
    with pytest.raises(ValueError, match=f"gpus={gpus}"):
        scale_down(cfg, num_layers=4, gpus=gpus)


def test_runner_scales_to_the_gpus_it_is_given(capsys):
    from bridge_recipes.runner.cli import main

    argv = ["--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "--dry-run", "--scale-down", "4"]
    assert main([*argv, "--scale-experts", "64", "--gpus", "2", "-gb", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^world size +2 +-> +TP1 PP1 EP2 ETP1 DP2$", out, re.M), out
    assert main(["--recipe", "qwen35_35b_a3b_sft_8gpu_h200_bf16_config", "--dry-run", "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"--gpus 2\b.*needs --scale-down\b", err), err
