"""Memory planner (bridge_recipes.plan.memory) against the real recipes: the measured H200 peaks
of docs/memory_plan.md, the published facts about 8 x H200 layouts (docs/sources.md), and its component rules."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bridge_recipes.plan import memory as M
from bridge_recipes.plan.layout import Layout
from bridge_recipes.recipes import registry
from bridge_recipes.recipes.scaledown import scale_down

REPO = Path(__file__).resolve().parents[2]
H200_GB = 139.79 * 2**30 / 1e9  # what the test host's H200 reports to torch (139.80 GiB), a printed step below
SFT_35B = "qwen35_35b_a3b_sft_8gpu_h200_bf16_config"
SFT_27B = "qwen35_27b_sft_8gpu_h200_bf16_config"
LONGCTX = "qwen35_35b_a3b_sft_8gpu_h200_bf16_longctx_config"


def build(name: str, **shrink):
    cfg = registry.load(name)()
    if shrink:
        scale_down(cfg, **shrink)
    return cfg


# --- components --------------------------------------------------------------------------------


def test_gpu_memory_is_the_device_reported_bytes_in_1e9_units():
    assert M.gpu_memory("h200") == pytest.approx(H200_GB) == pytest.approx(150.098, abs=1e-3)
    assert M.gpu_memory("NVIDIA-H200") == M.gpu_memory(None) == M.gpu_memory("h200")
    with pytest.raises(KeyError, match="unknown GPU"):
        M.gpu_memory("v100")
    assert M.plan_memory(build(SFT_35B), 8, gpu_memory_gb=100).fits is False


def test_pipeline_keeps_pp_minus_stage_micro_batches_in_flight():
    par = SimpleNamespace(pp=4, vpp=None)
    assert [M.micro_batches_in_flight(r, par, 64) for r in range(4)] == [4, 3, 2, 1]
    assert M.micro_batches_in_flight(0, par, 2) == 2
    interleaved = SimpleNamespace(pp=4, vpp=2)  # (4-0-1) x 2 + (2-1) x 4 + 1 = 11 chunks
    assert M.micro_batches_in_flight(0, interleaved, 64) == 11 / 2


def test_recompute_policy_orders_saved_activations():
    def activations(method, layers):
        cfg = build(SFT_27B)
        cfg.model.recompute_granularity = "full" if method else None
        cfg.model.recompute_method, cfg.model.recompute_num_layers = method, layers
        return M.plan_memory(cfg, 8).stages[0].activations_gb

    full, block12, block10, none = (
        activations("uniform", 1),
        activations("block", 12),
        activations("block", 10),
        activations(None, None),
    )
    assert full < block12 < block10 < none


def _selective(name: str, modules: list[str]):
    cfg = build(name)
    cfg.model.recompute_granularity = "selective"
    cfg.model.recompute_method = cfg.model.recompute_num_layers = None
    cfg.model.recompute_modules = modules
    return cfg


def _none(name: str):
    cfg = build(name)
    cfg.model.recompute_granularity = cfg.model.recompute_method = cfg.model.recompute_num_layers = None
    return cfg


def test_selective_recompute_keeps_less_than_none_and_more_than_full():
    """35B-A3B EP8: each added module keeps less; the whole MoE block keeps less than its
    activation and norm; none of them approaches full recompute."""

    def acts(cfg):
        return M.plan_memory(cfg, 8).stages[0].activations_gb

    none, full = acts(_none(SFT_35B)), acts(build(SFT_35B))
    act_norm = acts(_selective(SFT_35B, ["moe_act", "layernorm"]))
    more = acts(_selective(SFT_35B, ["moe_act", "layernorm", "gdn_norm_out", "shared_experts"]))
    moe = acts(_selective(SFT_35B, ["moe"]))
    assert full < moe < more < act_norm < none


def test_selective_module_savings_term_by_term():
    """What each module discards, against the activation terms: the MoE activation's
    intermediates (all but the fc1 output: four moe_ffn per routed token copy with the unfused
    SwiGLU this recipe runs, one with the fused kernel), the pre-MLP norm output (hidden per
    token), the gated norm output of a GDN layer; the dense MLP's fused norm has nothing for
    "layernorm" to discard."""
    cfg = build(SFT_35B)
    par = M.parallel_layout(cfg, 8)
    d, tok = M.model_dims(cfg.model), M.micro_batch_tokens(cfg, par)
    one = lambda mods, gdn=True, moe=True: M.selective_saving_elems(d, par, tok, gdn, moe, frozenset(mods))  # noqa: E731
    assert one(["moe_act"]) == (1 if d.fused_swiglu else 4) * d.moe_ffn * M.routed_tokens(d, tok)
    fused = M.ModelDims(**{**d.__dict__, "fused_swiglu": True})
    assert M.selective_saving_elems(
        fused, par, tok, True, True, frozenset(["moe_act"])
    ) == d.moe_ffn * M.routed_tokens(d, tok)
    assert one(["layernorm"]) == d.hidden * tok.resid
    assert one(["gdn_norm_out"]) == d.gdn_v * tok.seq / par.tp and one(["gdn_norm_out"], gdn=False) == 0
    assert one(["layernorm"], moe=False) == 0
    assert one(["moe", "moe_act"]) == one(["moe"]) == M.moe_activation_elems(d, par, tok) - d.hidden * tok.resid
    assert one([]) == 0


def test_no_selective_set_fits_the_35b_ep8_layout():
    """With 8,192-token rows the Gated DeltaNet and attention activations alone exceed what the
    35B-A3B EP8 layout leaves free: the smallest selective set (the whole MoE block, its norm
    and the GDN output norm) plans above the H200's memory, while block recompute of 30 of 40
    layers fits."""
    best = M.plan_memory(_selective(SFT_35B, ["moe", "layernorm", "gdn_norm_out"]), 8, gpu="h200")
    assert not best.fits and 150 < best.peak_gb < 170
    assert any(re.match(r"selective recompute\b.*\bgdn_norm_out, layernorm, moe\b", n) for n in best.notes)


def test_unmodelled_recompute_modules_are_named_in_the_notes():
    cfg = _selective(SFT_35B, ["moe_act"])
    cfg.model.recompute_modules = ["moe_act", "mla_up_proj"]
    notes = M.plan_notes(cfg, M.parallel_layout(cfg, 8))
    assert any("mla_up_proj not modelled" in n for n in notes)


def test_cross_entropy_kinds_keep_different_logits():
    """Native fused: FP32 softmax kept per loss plus a 10L working set (14L with MTP); TE: BF16
    copies (6L); unfused: 10L."""

    def logits(kind):
        cfg = build(SFT_35B, num_layers=4, num_experts=32, global_batch_size=4)
        cfg.model.cross_entropy_loss_fusion = kind != "unfused"
        cfg.model.cross_entropy_fusion_impl = "te" if kind == "te" else "native"
        return M.plan_memory(cfg, 1).stages[0].logits_gb

    L = 8192 * 248_320 / 1e9
    assert logits("te") == pytest.approx(6 * L)
    assert logits("unfused") == pytest.approx(10 * L)
    assert logits("native") == pytest.approx(14 * L)


def test_logits_only_on_the_last_stage_and_split_by_tp_and_cp():
    plan = M.plan_memory(build(SFT_27B), 8)
    assert [s.logits_gb > 0 for s in plan.stages] == [False, False, False, True]
    longctx = M.plan_memory(build(LONGCTX), 8).stages[0].logits_gb  # seq 32768 / CP2, vocab / TP2
    assert longctx == pytest.approx(plan.stages[-1].logits_gb)


def test_distributed_optimizer_shards_experts_over_the_expert_data_parallel_group():
    cfg = build(SFT_35B)
    par = M.parallel_layout(cfg, 8)
    assert (par.dense_dp, par.expert_dp) == (8, 1)
    sharded = M.plan_memory(cfg, 8).stages[0].optimizer_gb
    cfg.optimizer.use_distributed_optimizer = False
    assert M.plan_memory(cfg, 8).stages[0].optimizer_gb > sharded


def test_cpu_offload_fraction_moves_optimizer_state_to_the_host():
    def stage(offload, fraction):
        cfg = build(LONGCTX)
        cfg.optimizer.optimizer_cpu_offload, cfg.optimizer.optimizer_offload_fraction = offload, fraction
        return M.plan_memory(cfg, 8).stages[0]

    on_gpu, half, host = stage(False, 0.0), stage(True, 0.5), stage(True, 1.0)
    assert on_gpu.host_optimizer_gb == 0 and on_gpu.optimizer_gb > 40
    assert half.optimizer_gb == pytest.approx(0.5 * on_gpu.optimizer_gb)
    assert host.optimizer_gb == 0
    assert host.host_optimizer_gb == pytest.approx(on_gpu.optimizer_gb * 16 / 12)  # + FP32 grad copies
    assert host.total_gb < half.total_gb < on_gpu.total_gb


def _optimizer_cfg(**opt):
    base = dict(
        use_precision_aware_optimizer=True,
        main_params_dtype=torch.float32,
        exp_avg_dtype=torch.float32,
        exp_avg_sq_dtype=torch.float32,
        store_param_remainders=True,
        optimizer_cpu_offload=False,
        optimizer_offload_fraction=0.0,
        fp8_recipe=None,
    )
    base.update(opt)
    return SimpleNamespace(
        optimizer=SimpleNamespace(**base), ddp=SimpleNamespace(grad_reduce_in_fp32=True), mixed_precision=None
    )


def test_optimizer_bytes_per_parameter():
    assert M.optimizer_bytes_per_param(_optimizer_cfg(use_precision_aware_optimizer=False)) == 12
    # bf16_mixed leaves fp8_recipe='tensorwise': Megatron keeps FP32 master shards
    assert M.optimizer_bytes_per_param(_optimizer_cfg(fp8_recipe="tensorwise")) == 12
    # TE owns the master: a 16-bit remainder beside the BF16 weight, or a BF16 copy
    assert M.optimizer_bytes_per_param(_optimizer_cfg()) == 10
    assert M.optimizer_bytes_per_param(_optimizer_cfg(main_params_dtype=torch.bfloat16, fp8_recipe="tensorwise")) == 10
    assert (
        M.optimizer_bytes_per_param(_optimizer_cfg(exp_avg_dtype=torch.bfloat16, exp_avg_sq_dtype=torch.bfloat16)) == 6
    )


def test_recipes_resolve_the_mixed_precision_preset():
    prec = M.effective_precision(build(SFT_35B))
    assert prec["fp8_recipe"] == "tensorwise" and prec["grad_reduce_in_fp32"] is True
    cfg = build(SFT_35B, num_layers=4, num_experts=32, global_batch_size=4)
    cfg.model.gradient_accumulation_fusion = False  # no placeholder gradients beside the weights
    plan = M.plan_memory(cfg, 1).stages[0]
    params = 1_700_601_408
    assert (plan.weights_gb, plan.grads_gb, plan.optimizer_gb) == pytest.approx(
        (2 * params / 1e9, 4 * params / 1e9, 12 * params / 1e9)
    )


def test_world_size_must_divide_the_layout():
    with pytest.raises(ValueError, match="not divisible"):
        M.plan_memory(build(SFT_27B), 6)


@pytest.mark.parametrize("name", [SFT_27B, SFT_35B])
def test_planner_and_catalog_count_the_same_parameters(name):
    """The planner's per-rank formulas (split TP-sharded/replicated, dense/expert) and the
    catalog's count (split matrices/vectors, total/active) cut one model differently; on one
    rank holding everything they must sum to the same total."""
    from bridge_recipes.bench.harness import model_spec
    from bridge_recipes.models.params import count_parameters

    cfg = registry.load(name)()
    one_rank = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, dp=1, vpp=None, world=1, sp=False)
    planned = M.stage_params(M.model_dims(cfg.model), one_rank, list(range(cfg.model.num_layers)), 0)
    assert planned.total == count_parameters(model_spec(cfg)).total


def test_lora_plan_keeps_frozen_weights_without_gradients_or_optimizer_state():
    from bridge_recipes.recipes.base import use_lora

    sft = build(SFT_35B)
    lora = build(SFT_35B)
    use_lora(lora)
    full, frozen = M.plan_memory(sft, 8).stages[0], M.plan_memory(lora, 8).stages[0]
    d, par = M.model_dims(lora.model), M.parallel_layout(lora, 8)
    adapters = M.lora_params(d, par, list(range(lora.model.num_layers)), frozenset(lora.peft.target_modules), 32)
    # the attention layer's adapters by hand: 35B-A3B hidden 2048, 16 gated query heads + 2 KV groups of 256
    attn = d.layer_pattern.index(0)
    qkv = 32 * (2048 + 16 * 256 * 2 + 2 * 2 * 256)
    proj = 32 * (16 * 256 + 2048)
    fcs = 2 * 32 * ((2048 + 2 * 512) + (512 + 2048))  # routed experts (one shared adapter) and shared expert
    assert M.lora_params(d, par, [attn], frozenset(lora.peft.target_modules), 32) == qkv + proj + fcs
    # the frozen base has no main gradients, so none of fusion's placeholder gradients either
    placeholders = M.fused_wgrad_placeholder_bytes(sft, d, par, list(range(sft.model.num_layers)), 0)
    assert round(placeholders / 1e9, 2) == 1.13
    assert frozen.weights_gb == pytest.approx(full.weights_gb - placeholders / 1e9 + 2 * adapters / 1e9)
    assert frozen.grads_gb == pytest.approx(4 * adapters / 1e9)  # FP32 main grads of the adapters alone
    assert frozen.optimizer_gb < 0.01 * full.optimizer_gb and frozen.total_gb < full.total_gb - 60
    assert any("LoRA" in n for n in M.plan_memory(lora, 8).notes)


def test_lora_lets_a_model_fit_one_gpu_where_its_sft_does_not():
    from bridge_recipes.recipes.base import use_lora

    cfg = build("qwen35_27b_peft_1gpu_h200_bf16_lowmem_config")
    assert M.plan_memory(cfg, 1).fits
    cfg.peft = None  # the same layout, every weight trained
    assert not M.plan_memory(cfg, 1).fits
    use_lora(cfg)
    assert M.plan_memory(cfg, 1).fits


def test_the_fast_27b_lora_recipe_spends_the_room_it_frees_on_recompute():
    """TE's cross entropy and the fused SwiGLU shrink the one-GPU LoRA plan; the fast 27B recipe spends
    that on layers that keep their activations: within two layers of as many as leave 9% of the GPU free by
    the planner (with the framework's overhead); three more would leave less."""
    base = build("qwen35_27b_peft_1gpu_h200_bf16_lowmem_config")
    fast = build("qwen35_27b_peft_1gpu_h200_bf16_config")
    assert fast.model.recompute_method == "block" and fast.model.recompute_num_layers < fast.model.num_layers
    assert (fast.model.cross_entropy_fusion_impl, fast.model.bias_activation_fusion) == ("te", True)
    planned = M.plan_memory(fast, 1, gpu="h200")
    assert planned.peak_gb <= 0.91 * planned.gpu_memory_gb
    assert planned.peak_allocated_gb > M.plan_memory(base, 1, gpu="h200").peak_allocated_gb
    fast.model.recompute_num_layers -= 3
    assert M.plan_memory(fast, 1, gpu="h200").peak_gb > 0.91 * planned.gpu_memory_gb


def test_the_fast_35b_a3b_lora_recipe_spends_the_room_it_frees_on_rows():
    """The fast 35B-A3B recipe spends the room on rows per micro batch instead: every layer recomputed,
    as many 8,192-token rows as fit by the planner with the framework's overhead; a fifth does not."""
    fast = build("qwen35_35b_a3b_peft_1gpu_h200_bf16_config")
    assert (fast.model.recompute_method, fast.model.recompute_num_layers) == ("block", fast.model.num_layers)
    assert (fast.model.cross_entropy_fusion_impl, fast.model.bias_activation_fusion) == ("te", True)
    rows = fast.train.micro_batch_size
    assert rows > 1 and M.plan_memory(fast, 1, gpu="h200").fits
    fast.train.micro_batch_size = rows + 1
    assert not M.plan_memory(fast, 1, gpu="h200").fits


def test_fp8_with_bf16_parameters_counts_transformer_engines_weight_cache():
    """With FP8 GEMMs and BF16 parameters TE keeps an FP8 copy and transpose of each FP8 layer's weights
    between micro batches (2 bytes per parameter): on the FP8 fast 27B recipe's layout 7.7-14.5 GB a stage
    more than with the transpose cache off; FP8 parameters (the preset as it is) or the cache off cache
    nothing. The model's first and last layers stay BF16 and cache nothing. Measured on the 27B proxy
    (1 x H200): 101.55 GB allocated, 101.87 planned (tests/unit/test_results_consistency.py)."""
    import bridge_recipes
    from bridge_recipes.plan.memory import (
        fp8_weight_cache_bytes,
        model_dims,
        parallel_layout,
        plan_memory,
        stage_chunks,
    )

    def plan(name, overrides=()):
        return plan_memory(bridge_recipes.build(name, overrides=list(overrides)), 8, gpu="h200")

    fast = "qwen35_27b_sft_8gpu_h200_fp8cs_fast_config"
    cached = plan(fast)
    copies = plan(fast, ["model.disable_parameter_transpose_cache=true"])
    fp8_params = plan(
        "qwen35_27b_sft_8gpu_h200_bf16_fast_config",
        ["mixed_precision=bf16_with_fp8_current_scaling_mixed", "model.recompute_num_layers=10"],
    )
    assert copies.fits and round(copies.peak_gb, 1) == 143.7 and round(fp8_params.peak_gb, 1) == 150.7
    extra = [round(c.weights_gb - r.weights_gb, 1) for c, r in zip(cached.stages, copies.stages)]
    assert extra == [11.4, 14.5, 14.5, 7.7] and cached.fits and round(cached.peak_gb, 1) == 146.1
    assert any("cached FP8" in n and "disable_parameter_transpose_cache=true" in n for n in cached.notes)
    assert not any("cached" in n for n in copies.notes)
    cfg = bridge_recipes.build(fast)
    par = parallel_layout(cfg, 8)
    d, first = model_dims(cfg.model), stage_chunks(cfg, par)[0][0]
    # the first stage's 16 layers less layer 0 (BF16), at 2 bytes per parameter
    assert fp8_weight_cache_bytes(cfg, d, par, first, 0) == fp8_weight_cache_bytes(cfg, d, par, first[1:], 0)
    assert fp8_weight_cache_bytes(cfg, d, par, first[:1], 0) == 0


def test_fp8_weights_cast_when_used_are_kept_once_a_micro_batch_in_flight():
    """With the transpose cache off each TE linear of an FP8 layer keeps the FP8 weight it cast (data and
    transpose, 2 bytes per parameter) for its backward, one copy each micro batch: a layer that keeps its
    activations holds one per micro batch in flight, a recomputed layer one while it is rebuilt. On the
    BF16 fast recipe's layout (16/18/18/12, block recompute of 10) that plans 170.7 GB; on the FP8 fast
    recipe's (14 layers of each stage recomputed) its second stage keeps 5 layers of 19 for 3 micro
    batches in flight, 11.4 GB of copies. No copies with FP8 parameters, the cache on (the recipe), or
    BF16."""
    import bridge_recipes
    from bridge_recipes.plan.memory import (
        fp8_weight_copies,
        layer_params,
        model_dims,
        parallel_layout,
        plan_memory,
        stage_chunks,
    )

    fast, off = "qwen35_27b_sft_8gpu_h200_fp8cs_fast_config", "model.disable_parameter_transpose_cache=true"
    cfg = bridge_recipes.build(fast, overrides=[off])
    par, d = parallel_layout(cfg, 8), model_dims(cfg.model)
    chunks = stage_chunks(cfg, par)
    second = chunks[1]
    copies = fp8_weight_copies(cfg, d, par, second, 1)
    kept = second[0][14:]
    assert len(second[0]) == 19 and len(kept) == 5
    assert copies.saved == sum(2 * layer_params(d, par, i).total for i in kept)
    assert copies.rebuilt == max(2 * layer_params(d, par, i).total for i in second[0][:14])
    plan = plan_memory(cfg, 8, gpu="h200")
    bf16 = plan_memory(
        bridge_recipes.build(
            "qwen35_27b_sft_8gpu_h200_bf16_fast_config",
            overrides=["model.num_layers_in_last_pipeline_stage=10", "model.recompute_num_layers=14"],
        ),
        8,
        gpu="h200",
    )
    assert plan.stages[1].in_flight == 3
    assert round(plan.stages[1].activations_gb - bf16.stages[1].activations_gb, 1) == 11.4
    assert any("cast when used" in n for n in plan.notes)
    bf16_layout = bridge_recipes.build(
        fast, overrides=[off, "model.num_layers_in_last_pipeline_stage=12", "model.recompute_num_layers=10"]
    )
    at_bf16_layout = plan_memory(bf16_layout, 8, gpu="h200")
    assert round(at_bf16_layout.peak_gb, 1) == 170.7 and not at_bf16_layout.fits
    # the MTP layer on the last stage keeps its copy (MTP is recomputed only under uniform recompute)
    last = fp8_weight_copies(cfg, d, par, chunks[3], 3)
    assert last.saved > sum(2 * layer_params(d, par, i).total for i in chunks[3][0][14:])
    # uniform recompute of 2 keeps nothing and rebuilds two layers at once (the MTP layer is recomputed too)
    uniform = bridge_recipes.build(
        fast, overrides=[off, "model.recompute_method=uniform", "model.recompute_num_layers=2"]
    )
    two = fp8_weight_copies(uniform, d, par, second, 1)
    pair = [2 * layer_params(d, par, i).total for i in second[0]]
    assert two.saved == 0 and two.rebuilt == max(a + b for a, b in zip(pair[::2], pair[1::2]))
    assert fp8_weight_copies(uniform, d, par, chunks[3], 3).saved == 0
    for other in (
        bridge_recipes.build(fast),
        bridge_recipes.build("qwen35_27b_sft_8gpu_h200_bf16_fast_config"),
        bridge_recipes.build(
            "qwen35_27b_sft_8gpu_h200_bf16_fast_config",
            overrides=["mixed_precision=bf16_with_fp8_current_scaling_mixed"],
        ),
    ):
        none = fp8_weight_copies(other, d, par, second, 1)
        assert none.saved == none.rebuilt == 0


def test_no_change_is_named_when_none_fits(monkeypatch):
    from bridge_recipes.plan import peak

    monkeypatch.setattr(peak, "GPU_MEMORY_GB", {**peak.GPU_MEMORY_GB, "h200": 1.0})
    text, fits = M.plan_report(build(SFT_27B), 8, "h200")
    assert not fits and "changes that fit" not in text
    assert re.search(r"no usual change\b.*\bmicro batch 1\b.*\(-pp\)", text), text
