"""Candidate policies against the published H200 SFT policies: what each changes, the proxy ratio
predicted before it runs, and the memory planner's verdict at full scale.

A candidate is its published recipe plus a few overrides. It is measured side by side with the
published policy in one command (``scripts/benchmark.py --candidate NAME --proxy-layers 4``, the
one-GPU proxy at the recipe's per-GPU shard), and only a candidate that fits at full scale by the
planner (with its framework overhead) and whose loss curve agrees with the published policy's can
become a recipe. ``docs/performance_candidates.md`` is :func:`candidates_table` (a test rebuilds it).

Predictions (written 2026-11-30; 35b_te_ce_block20, 35b_bf16_moments_te_ce_block10,
35b_no_recompute_cpu_adam, 27b_fused_swiglu, 27b_split_17_18_18_11,
27b_te_ce_fused_swiglu_block10_fp8_current, 35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion,
27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params, its _cached form, 35b_grad_accum_fusion, 35b_te_op_fuser and
35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2, its _block30 form and the _mbs4 one on
2026-12-01; each before it ran)
are tokens/s ratios on the proxy, candidate over published. Their basis, where it is a
measurement, is the one-GPU proxy of the 35B-A3B H200 policy (4 layers, 32 experts, 8 micro
batches of 8,192 tokens): full recompute 2.74 s a step, no recompute 2.20 s, FP8 block scaling
3.22 s with recompute, as reported with the request for these candidates (2026-11-30; not a
result file of this repository). This repository's own measurement of the recompute pair agrees:
1.522 against 1.227 s a step, 1.24x (2026-11-29, docs/tuning_notes.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_recipes.installed import OP_FUSER_ENV

# the published policies the candidates change (their perf counterparts run on mock data)
PUBLISHED = {
    "qwen35_35b_a3b": "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
    "qwen35_27b": "qwen35_27b_sft_8gpu_h200_bf16_config",
}
# Proxy step times of the 35B-A3B policy (seconds, 4 layers, measured side by side): the basis of
# the recompute predictions below.
PROXY_FULL_RECOMPUTE_S = 2.74
PROXY_NO_RECOMPUTE_S = 2.20


def _block_recompute_prediction(recomputed_fraction: float) -> float:
    """Recompute time scales with the layers recomputed: t = t_none + f x (t_full - t_none)."""
    t = PROXY_NO_RECOMPUTE_S + recomputed_fraction * (PROXY_FULL_RECOMPUTE_S - PROXY_NO_RECOMPUTE_S)
    return round(PROXY_FULL_RECOMPUTE_S / t, 3)


# The overrides the fast policies combine (each the override form of a block in bridge_recipes.qwen.policy)
_BF16_MOMENTS = ("optimizer.exp_avg_dtype=bfloat16", "optimizer.exp_avg_sq_dtype=bfloat16")
_TE_CE = "model.cross_entropy_fusion_impl=te"
_FUSED_SWIGLU = "model.bias_activation_fusion=true"
_ROUTER_FUSION = "model.moe_router_fusion=true"
# FP8 with per-tensor current scaling, parameters in BF16, Transformer Engine's FP8 weight cache on
# (bridge_recipes.qwen.policy.fp8_current_scaling); the weight-copy form turns the cache off
_FP8_CURRENT_BF16_PARAMS = (
    "mixed_precision=bf16_with_fp8_current_scaling_mixed",
    "mixed_precision.fp8_param_gather=false",
    "model.disable_parameter_transpose_cache=false",
)
# What the fast 35B-A3B policy and its variants share: the memory they free, then spend on recompute
_BF16_MOMENTS_TE_CE = (*_BF16_MOMENTS, _TE_CE)
# The fast 35B-A3B recipes' kernels and optimizer precision (the override form of the recipe module's
# _fast_35b_a3b_kernels), before each spends the memory on recompute or rows
_FAST_35B_KERNELS = (*_BF16_MOMENTS_TE_CE, _FUSED_SWIGLU, _ROUTER_FUSION)


@dataclass(frozen=True)
class Candidate:
    name: str
    model: str  # key of PUBLISHED
    overrides: tuple[str, ...]
    change: str
    predicted_ratio: float  # proxy tokens/s, candidate / published, written before the run
    basis: str
    proxy_gpus: int = 1  # 2 for what only exists across GPUs (expert-parallel communication)
    full_scale_only: bool = False  # no proxy has it (a pipeline split): measured at the recipe's own scale
    proxy_layers: int = 4  # the proxy depth the prediction is for
    # what the published policy's arm sets where the recipe's default changed since the earlier runs
    published_overrides: tuple[str, ...] = ()

    @property
    def recipe(self) -> str:
        return PUBLISHED[self.model]

    @property
    def mock_recipe(self) -> str:
        return self.recipe.replace("_config", "_mock_config")

    def proxy_overrides(self, proxy_layers: int | None) -> list[str]:
        """The overrides at the proxy's depth (one GPU, ``proxy_layers`` layers): a block recompute
        count keeps its fraction of the full recipe's stage, as the scale-down does."""
        if not proxy_layers:
            return list(self.overrides)
        import bridge_recipes
        from bridge_recipes.layout import stage_layers
        from bridge_recipes.scaledown import scaled_block_recompute

        stage = max(stage_layers(bridge_recipes.build(self.recipe)))
        out = []
        for o in self.overrides:
            key, _, value = o.partition("=")
            if key == "model.recompute_num_layers" and value.isdigit():
                o = f"{key}={scaled_block_recompute(int(value), stage, proxy_layers)}"
            out.append(o)
        return out


CANDIDATES: tuple[Candidate, ...] = (
    Candidate(
        "35b_block30",
        "qwen35_35b_a3b",
        ("model.recompute_method=block", "model.recompute_num_layers=30"),
        "block recompute of the first 30 of 40 layers instead of full uniform recompute of all 40",
        _block_recompute_prediction(30 / 40),
        "a quarter of the recompute time saved: 2.20 + 0.75 x (2.74 - 2.20) s",
    ),
    Candidate(
        "35b_te_ce_block20",
        "qwen35_35b_a3b",
        (
            _TE_CE,
            "model.recompute_method=block",
            "model.recompute_num_layers=20",
        ),
        "Transformer Engine's fused cross entropy (a BF16 copy of the logits instead of FP32: the loss working "
        "set 28.5 -> 12.2 GB) spent on recomputing 20 instead of all 40 layers",
        _block_recompute_prediction(20 / 40),
        "half of the recompute time saved: 2.20 + 0.5 x (2.74 - 2.20) s; the cross entropy taken as equally fast. "
        "Megatron-Core 0.19.2 warns that TE's fused cross entropy has known stability issues: the loss-curve "
        "check decides",
    ),
    Candidate(
        "35b_bf16_moments_te_ce_block10",
        "qwen35_35b_a3b",
        (
            *_BF16_MOMENTS_TE_CE,
            "model.recompute_method=block",
            "model.recompute_num_layers=10",
        ),
        "Adam's two moments in BF16 (the optimizer state 53.3 -> 35.5 GB a GPU) and Transformer Engine's cross "
        "entropy (16.3 GB), spent on recomputing 10 instead of all 40 layers",
        _block_recompute_prediction(10 / 40),
        "three quarters of the recompute time saved: 2.20 + 0.25 x (2.74 - 2.20) s; the optimizer step and the cross "
        "entropy taken as equally fast. Two numerics changes at once (BF16 moments; TE's cross entropy, which "
        "Megatron-Core 0.19.2 warns about): the loss-curve check decides",
    ),
    Candidate(
        "35b_bf16_moments_te_ce_block8",
        "qwen35_35b_a3b",
        (
            *_BF16_MOMENTS_TE_CE,
            "model.recompute_method=block",
            "model.recompute_num_layers=8",
        ),
        "35b_bf16_moments_te_ce_block10 with 8 instead of 10 layers recomputed, the planner's last step with "
        "room (149.3 GB; 7 plans at 150.7)",
        1.40,
        "on the 4-layer proxy 8 of 40 layers round to the 1 of 4 that 35b_bf16_moments_te_ce_block10 measured "
        "1.40x with; at full scale two more layers freed of recompute at 15.0 ms a layer a micro batch "
        "(bench.predict.split_saving of the two measured candidates) give about 6,570 tokens/s/GPU against "
        "block 10's 6,425 (+2.2%), which only an 8-GPU run can show",
    ),
    Candidate(
        "35b_bf16_moments_te_ce_fused_swiglu_block5",
        "qwen35_35b_a3b",
        (
            *_BF16_MOMENTS_TE_CE,
            _FUSED_SWIGLU,
            "model.recompute_method=block",
            "model.recompute_num_layers=5",
        ),
        "35b_bf16_moments_te_ce_block10 with Megatron-Core's fused SwiGLU in the experts and the shared expert "
        "(the recipes inherit the unfused default), whose smaller saved activations buy block recompute of 5 "
        "instead of 10 layers at the same planned peak (145.9 GB)",
        1.41,
        "on the 4-layer proxy 5 of 40 layers round to the 1 of 4 that 35b_bf16_moments_te_ce_block10 measured "
        "1.40x with, and the fused SwiGLU adds ~1% (27b_fused_swiglu's basis); at full scale five more layers "
        "freed of recompute at 15.0 ms a layer a micro batch give about 6,800 tokens/s/GPU (+5.8% on block 10's "
        "6,425), which a 16-layer proxy (2 against 4 layers recomputed) or an 8-GPU run can show",
    ),
    Candidate(
        "35b_bf16_moments_te_ce_fused_swiglu_block5_router_fusion",
        "qwen35_35b_a3b",
        (*_FAST_35B_KERNELS, "model.recompute_method=block", "model.recompute_num_layers=5"),
        "35b_bf16_moments_te_ce_fused_swiglu_block5 with Transformer Engine's fused router (35b_router_fusion): "
        "the two measured separately, each passing the loss check; the memory unchanged (145.9 GB planned)",
        1.31,
        "on the 16-layer proxy, where 35b_bf16_moments_te_ce_fused_swiglu_block5 measured 600.6 against 726.4 ms "
        "a micro batch (1.21x): the fused router saved 16.3 ms a micro batch over 4 fully recomputed layers "
        "(35b_router_fusion), 1.36 ms a router pass (forward, recomputed forward, backward); 2 layers of 3 passes "
        "and 14 of 2 save 46.2 ms: 726.4 / 554.4",
        proxy_layers=16,
    ),
    Candidate(
        "35b_selective",
        "qwen35_35b_a3b",
        (
            "model.recompute_granularity=selective",
            "model.recompute_method=null",
            "model.recompute_num_layers=null",
            "model.recompute_modules=[moe_act,layernorm]",
        ),
        "selective recompute of the expert activation and the norms instead of full recompute",
        1.2,
        "most of full recompute's cost is the attention, Gated DeltaNet and expert GEMMs, which "
        "selective recompute does not repeat: close to no recompute (1.25x)",
    ),
    Candidate(
        "35b_router_fusion",
        "qwen35_35b_a3b",
        (_ROUTER_FUSION,),
        "Transformer Engine's fused router (softmax, top-k, scores) instead of the unfused one",
        1.01,
        "the router is a 256-way top-k over 8,192 tokens a layer: a few kernels of a step's hundreds",
    ),
    Candidate(
        "35b_grad_accum_fusion",
        "qwen35_35b_a3b",
        ("model.gradient_accumulation_fusion=true",),
        "gradient-accumulation fusion on: each weight-gradient GEMM accumulates into the FP32 main gradient "
        "(Megatron-Core's own linear layers through Transformer Engine's GEMM, bridge_recipes.te_wgrad), "
        "against the published policy as every earlier proxy run ran it on a host without APEX, fusion off",
        1.05,
        "the 16-layer traces (2026-12-01): the unfused adds are 10,312 launches a step (one a weight a micro "
        "batch), 124 ms of GPU time, on a host that sets the pace at 72-75 us a kernel launched; fusion removes "
        "those of the GEMM weights, about 9,260 (by the model's structure ~130 weights a micro batch, the norms, "
        "the convolution, gates, the router and the embedding, keep theirs); each add taken as ~30 us of host "
        "time (a hook and one small op, under the step's average): 0.28 s of the published policy's 6.10 s "
        "step: 6.10 / 5.82",
        proxy_layers=16,
        published_overrides=("model.gradient_accumulation_fusion=false",),
    ),
    Candidate(
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2",
        "qwen35_35b_a3b",
        (*_FAST_35B_KERNELS, "train.micro_batch_size=2"),
        "the fast recipe's kernels and optimizer precision with the published full recompute, two 8,192-token rows a "
        "micro batch instead of one (a GPU's 16 rows a step in 8 micro batches at full scale; the memory the moments "
        "and the cross entropy free pays for the second row: 110.9 GB planned), so each launch carries twice the "
        "tokens",
        1.5,
        "the 16-layer traces: the step is the host's, 63.9 us a kernel plus 0.71 s (the two policies' 6.10 and 4.70 s "
        "against 84,392 and 62,488 kernels), the GPU busy for 3.17 s of the published 6.10. With fusion the published "
        "policy launches 9,391 kernels a micro batch (less the 1,158 adds): host 8 x 9,391 x 63.9 us + 0.71 = 5.51 s. "
        "Two rows a micro batch halve the launches (4 x 9,391: 3.11 s; the fast kernels' fewer launches not counted) "
        "while the GPU's work stays (3.17 - 0.12 s of adds = 3.05 s): with host and GPU overlapped 5.51 / 3.11 = "
        "1.77x; the experts' token counts, copied to the host at every MoE layer, make each wait for the other once "
        "they are about equal, taken as a fifth of the GPU's time exposed: 5.51 / (3.11 + 0.61) = 1.48, 1.5x",
        proxy_layers=16,
    ),
    Candidate(
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs2_block30",
        "qwen35_35b_a3b",
        (
            *_FAST_35B_KERNELS,
            "train.micro_batch_size=2",
            "model.recompute_method=block",
            "model.recompute_num_layers=30",
        ),
        "two rows a micro batch as in the candidate before, with block recompute of 30 of the 40 layers instead of "
        "full recompute: the last 10 keep their activations (141.3 GB planned at full scale; the 16-layer proxy "
        "keeps 4 of 16)",
        1.95,
        "the two-rows pair (1 x H200, 2026-12-01): 3.679 against 6.769 s a step at 16 layers, a step the host "
        "sets; a layer's launches are its forward, its recomputed forward and its backward (taken as two forwards), "
        "so a layer kept saves a quarter of its launches; the layers hold 87.0% of the host's step (its model: 0.71 "
        "of the published policy's 5.51 s is fixed). 4 of 16 layers kept: 3.679 x 0.870 x 4/16 x 1/4 = 0.200 s, "
        "3.479 s against 6.769: 1.95x (1.06x the two-rows candidate; at full scale 10 of 40 kept, the same share)",
        proxy_layers=16,
    ),
    Candidate(
        "35b_bf16_moments_te_ce_fused_swiglu_router_fusion_mbs4",
        "qwen35_35b_a3b",
        (*_FAST_35B_KERNELS, "train.micro_batch_size=4"),
        "four 8,192-token rows a micro batch with the two-rows candidate's kernels, precision and full recompute (a "
        "GPU's 16 rows a step in 4 micro batches at full scale, 139.7 GB planned; the proxy's 8 rows in 2)",
        1.93,
        "the two-rows pair (1 x H200, 2026-12-01): 3.679 s a step at 16 layers, the host's pace; the host's model "
        "(63.9 us a kernel, 9,391 kernels a micro batch, 0.71 s fixed) gives 3.11 s at two rows and 1.91 at four, "
        "so the host's share of the step becomes 3.679 x 1.91 / 3.11 = 2.26 s, under the GPU's 3.05 s: the step "
        "becomes the GPU's, plus the host's launches it waits for after each MoE layer's copy of the token "
        "counts, taken as a fifth of them (the two-rows prediction's share): 3.05 + 2.26 / 5 = 3.51 s against "
        "6.769: 1.93x (1.05x the two-rows candidate)",
        proxy_layers=16,
    ),
    Candidate(
        "35b_te_op_fuser",
        "qwen35_35b_a3b",
        ("model.use_transformer_engine_op_fuser=true", f"+env_vars.{OP_FUSER_ENV}=1"),
        "the routed experts' FC1, SwiGLU scaled by the routing probabilities and FC2 as one Transformer Engine "
        "op-fuser chain (Megatron-Core 0.19.2's fused GroupedMLP; Megatron-Bridge's GB200/GB300 Qwen3 MoE "
        "benchmarks set it) instead of three modules and the unfused activation and scaling. Megatron-Core builds "
        "the chain for SwiGLU experts only with the environment's opt-in to Transformer Engine's fused grouped MLP "
        "(the first attempt, without it, stopped at model build, 2026-12-01); that fused kernel is Blackwell's "
        "(compute capability 10), so on Hopper the chain's ops run one by one, as the basis assumes",
        1.02,
        "the 16-layer traces put the step at the host's pace (54 us of host time a weight's add, from the fusion "
        "pair); on Hopper with cuBLAS 13.1 the expert GEMMs stay one launch an expert (Transformer Engine's single "
        "grouped GEMM needs cuBLASLt 13.4+), so what goes is the activation and scaling's own kernels, ~4 launches "
        "a MoE layer a pass: 5 MoE layers (4 and MTP's) x 3 passes (forward, recomputed forward, backward) x 4 x "
        "54 us = 3.2 ms of the published policy's ~280 ms proxy micro batch (2.06-2.36 s a step with fusion), "
        "1.2%, and about as much again for the three modules' Python and autograd nodes one chain replaces: 1.02x",
    ),
    Candidate(
        "35b_fp8_current",
        "qwen35_35b_a3b",
        ("mixed_precision=bf16_with_fp8_current_scaling_mixed",),
        "FP8 GEMMs with per-tensor current scaling instead of BF16",
        0.92,
        "FP8 block scaling measured 0.85x with recompute at these GEMM shapes (32 experts a GPU, "
        "~1,000 tokens an expert); per-tensor scaling quantizes more cheaply, the shapes stay small",
    ),
    Candidate(
        "35b_shared_expert_overlap",
        "qwen35_35b_a3b",
        ("model.moe_shared_expert_overlap=true",),
        "the shared expert's GEMMs overlapped with the token dispatch (alltoall), recompute unchanged",
        1.03,
        "on the EP2 proxy the all-to-all is ~8% of a step (EP2 at 0.92 of one GPU per GPU, "
        "evidence/two_gpu); the shared expert (512 wide) can hide about a third of it",
        proxy_gpus=2,
    ),
    Candidate(
        "35b_dispatch_wgrad_overlap",
        "qwen35_35b_a3b",
        ("model.overlap_dispatch_backward_with_experts_wgrad=true",),
        "the backward token dispatch overlapped with the experts' weight-gradient GEMMs",
        1.02,
        "hides part of the backward all-to-all (half of the ~8%) behind the expert wgrad GEMMs",
        proxy_gpus=2,
    ),
    Candidate(
        "35b_no_recompute_cpu_adam",
        "qwen35_35b_a3b",
        (
            "model.recompute_granularity=null",
            "model.recompute_method=null",
            "model.recompute_num_layers=null",
            "optimizer.optimizer_cpu_offload=true",
            "optimizer.optimizer_offload_fraction=0.9",
            "optimizer.overlap_cpu_optimizer_d2h_h2d=true",
        ),
        "no recompute, with 90% of the optimizer state and its step on the host (the fraction the planner needs "
        "to fit no recompute) instead of full recompute with the optimizer on the GPU",
        0.81,
        "full scale, per GPU and step (28.1 s published: 16 micro batches x 8,192 tokens / 4,663.1): no recompute "
        "saves 28.1 x (1 - 1/1.25) = 5.6 s; Adam on the host for 0.9 x 6.61e9 parameters at ~0.5e9 a second (a "
        "GPU's share of a node's cores) adds ~12 s, the 36 GB of gradient and weight copies over PCIe (~1.4 s) "
        "overlapped: 28.1 / (28.1 - 5.6 + 12) = 0.81; the proxy's optimizer scales with its layers like its compute",
    ),
    Candidate(
        "27b_fused_swiglu",
        "qwen35_27b",
        (_FUSED_SWIGLU,),
        "Megatron-Core's fused SwiGLU kernel instead of the unfused chunk, SiLU and product (the recipes inherit "
        "Megatron-Bridge's default, off)",
        1.01,
        "the unfused SwiGLU moves ~5 F elements a token forward (F = 17,408): 1.43 GB a layer a micro batch, "
        "~5.3 GB with backward and the recomputed forwards, 1.1 ms at 4.8 TB/s, ~19 ms of a stage's ~780 ms "
        "micro batch (2.4%); the fused kernel halves it. It also keeps 2 F fewer elements a token (0.57 GB a "
        "layer a micro batch): at full scale block recompute 11 instead of 12 then fits (146.2 GB), which a "
        "4-layer proxy cannot show",
    ),
    Candidate(
        "27b_split_17_18_18_11",
        "qwen35_27b",
        (
            "model.num_layers_in_first_pipeline_stage=17",
            "model.num_layers_in_last_pipeline_stage=11",
            "model.recompute_num_layers=14",
        ),
        "PP4 stages of 17/18/18/11 layers with block recompute of 14 instead of 16/17/17/14 with 12: the last "
        "stage, which also runs the output layer and MTP, gives 3 layers to the others",
        1.10,
        "training FLOPs per token of the slowest stage (bench.stages): published 61.0 G on the last stage "
        "against 47.6-49.9 G on the others; candidate 51.4-54.0 G on every stage: a 1.13x balance bound. Less, "
        "since the DeltaNet recurrence and attention core moved to the middle stages run below GEMM efficiency; "
        "more, since the vocabulary's cross entropy stays on the last stage",
        full_scale_only=True,
    ),
    Candidate(
        "27b_fp8_current",
        "qwen35_27b",
        ("mixed_precision=bf16_with_fp8_current_scaling_mixed",),
        "FP8 GEMMs with per-tensor current scaling instead of BF16",
        1.1,
        "dense GEMMs of 5,120 x 17,408 over 8,192 tokens gain from FP8 on Hopper, less the "
        "quantization kernels and the parts that stay BF16 (Gated DeltaNet, attention)",
    ),
    Candidate(
        "27b_te_ce_fused_swiglu_block10",
        "qwen35_27b",
        (_TE_CE, _FUSED_SWIGLU, "model.recompute_num_layers=10"),
        "27b_te_ce_fused_swiglu spending the memory both free on block recompute of 10 instead of 12 of each "
        "stage's 16 layers (149.8 GB planned; 9 plans at 158.6)",
        1.18,
        "on the 479 ms proxy micro batch (2 of 4 layers recomputed instead of 3): the cross entropy's 54.2 ms "
        "(the 35B-A3B's, bench.predict.split_saving), the fused SwiGLU's 1% (4.8 ms) and one layer's recompute, "
        "its forward of 0.79 GFLOPs a token (a third of the 4 layers' 9.51 G of training FLOPs) x 8,192 tokens "
        "at the proxy's 472 TFLOP/s, 13.8 ms: 479 / 406",
    ),
    Candidate(
        "27b_te_ce_fused_swiglu_block10_fp8_current",
        "qwen35_27b",
        (
            _TE_CE,
            _FUSED_SWIGLU,
            "model.recompute_num_layers=10",
            "mixed_precision=bf16_with_fp8_current_scaling_mixed",
        ),
        "the fast 27B policy (27b_te_ce_fused_swiglu_block10) with its layers' GEMMs in FP8 with per-tensor current "
        "scaling (the output layer and the model's first and last layers stay BF16: 2 of the 4-layer proxy's)",
        1.22,
        "the fast policy measured 1.12x (419 against 470 ms a proxy micro batch); of its ~175 ms in the 4 layers "
        "(the small-head proxy's 200 ms a micro batch less its embedding, head and loss) about three quarters are "
        "GEMMs, taken 1.3x faster in FP8 net of the amax and cast kernels: ~30 ms saved, and ~8 ms in the MTP "
        "layer; the head, the loss, Gated DeltaNet's recurrence and the attention core unchanged: 470 / 381",
    ),
    Candidate(
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params",
        "qwen35_27b",
        (
            _TE_CE,
            _FUSED_SWIGLU,
            "model.recompute_num_layers=10",
            *_FP8_CURRENT_BF16_PARAMS[:-1],
            "model.disable_parameter_transpose_cache=true",
        ),
        "27b_te_ce_fused_swiglu_block10_fp8_current with the parameters in BF16 (the preset stores them in FP8, "
        "from which a fine-tuning run's master weights would be filled) and each weight cast to FP8 when it is "
        "used instead of cached between micro batches (the cache would add 2 bytes a parameter): the FP8 fast "
        "recipe's first precision, before it took the cache",
        1.23,
        "the FP8-parameter form measured 401.1 against 482.9 ms a proxy micro batch (1.20x on mock rows); its "
        "optimizer step's 86.8 ms more (the FP8 cast of the parameters), 10.8 ms a micro batch, goes; casting "
        "the 3 FP8 layers' ~1.1 G weights in each forward and recomputed forward (4 bytes a parameter moved, "
        "~1.6 ms) comes: 482.9 / 391.9",
    ),
    Candidate(
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params_cached",
        "qwen35_27b",
        (
            _TE_CE,
            _FUSED_SWIGLU,
            "model.recompute_num_layers=10",
            *_FP8_CURRENT_BF16_PARAMS,
        ),
        "27b_te_ce_fused_swiglu_block10_fp8_current_bf16_params with Transformer Engine's FP8 weight cache on: "
        "each weight cast in the first micro batch of a step only instead of in every forward and recomputed "
        "forward; the same FP8 weights, so the same numerics. 2 bytes a parameter of the FP8 layers held for "
        "the step instead of a copy a micro batch in flight: at the FP8 fast recipe's 16/19/19/10 with block "
        "recompute of 14, 145.2 GB planned against 142.8: the FP8 fast recipe's precision",
        1.24,
        "the two chat-rows pairs' forward-backward micro batches (each optimizer step's extra taken out): FP8 "
        "parameters 377.6 ms, BF16 parameters cast when used 382.3, 1.18 ms for each of the 4 casts a micro "
        "batch (3 FP8 layers, one of them recomputed); cached, at most 4 casts a step instead of 32: 4.1 ms a micro "
        "batch less: 469.3 / 378.2",
    ),
    Candidate(
        "27b_te_ce",
        "qwen35_27b",
        (_TE_CE,),
        "Transformer Engine's fused cross entropy instead of the native kernel (the last stage's loss working "
        "set 28.5 -> 12.2 GB, 145.8 -> 143.5 GB planned)",
        1.13,
        "the 35B-A3B's two measured candidates put TE's cross entropy at 54.2 ms a micro batch saved "
        "(bench.predict.split_saving) over the same 248,320-entry vocabulary, 8,192-token rows and one MTP "
        "layer; the 27B's 4-layer proxy spends 479 ms a micro batch (3.834 s / 8, 2026-12-01): 479 / 425. At "
        "full scale it lands on the last pipeline stage, the slowest",
    ),
    Candidate(
        "27b_te_ce_fused_swiglu",
        "qwen35_27b",
        (_TE_CE, _FUSED_SWIGLU),
        "27b_te_ce and 27b_fused_swiglu together (with both, block recompute of 10 of 16 plans at 149.8 GB at "
        "full scale, which a 4-layer proxy cannot show)",
        1.14,
        "their two predictions multiplied: 1.13 x 1.01",
    ),
    Candidate(
        "27b_bf16_moments_fast_split_17_18_18_11",
        "qwen35_27b",
        (
            _TE_CE,
            _FUSED_SWIGLU,
            *_BF16_MOMENTS,
            "model.recompute_num_layers=10",
            "model.num_layers_in_first_pipeline_stage=17",
            "model.num_layers_in_last_pipeline_stage=11",
        ),
        "the fast 27B policy (TE cross entropy, fused SwiGLU, block recompute 10) with Adam's moments in BF16, "
        "whose 11 GB a GPU buy a 17-layer first stage: 17/18/18/11 instead of 16/18/18/12 (147.5 GB planned; "
        "fp32 moments plan 163.8)",
        1.22,
        "the calibrated predictor's stages (bench.predict, with MTP) 747 / 784 / 784 / 813 ms against the fast "
        "recipe's 711 / 784 / 784 / 849, with the measured 36.1 ms loss saving and 1% SwiGLU "
        "(bench.predict.pipeline_candidate_estimate): about 2,520 tokens/s/GPU against the published layout's "
        "2,064.8 with MTP, 1.22x (the fast recipe's 2,420: 1.04x)",
        full_scale_only=True,
    ),
    Candidate(
        "27b_block11",
        "qwen35_27b",
        ("model.recompute_num_layers=11",),
        "block recompute of 11 instead of 12 of each stage's 16 layers",
        1.02,
        "one layer in 16 not recomputed: 1/16 of a recompute share like the 35B-A3B's 20%",
    ),
    Candidate(
        "27b_vpp2_block6",
        "qwen35_27b",
        ("model.virtual_pipeline_model_parallel_size=2", "model.recompute_num_layers=6"),
        "two virtual stages a GPU (8 layers a chunk), 6 of each chunk's 8 layers recomputed",
        1.01,
        "the 1F1B bubble of 3 / 64 micro batches halves (4.7% -> 2.3% of the step), the same "
        "recomputed share (12 of 16), more pipeline messages",
    ),
)


def find(name: str) -> Candidate:
    for c in CANDIDATES:
        if c.name == name:
            return c
    raise ValueError(f"--candidate {name!r} is not known; choose one of {', '.join(c.name for c in CANDIDATES)}")


def full_scale_verdict(candidate: Candidate) -> dict[str, Any]:
    """The planner at the recipe's own GPU count: fits (with its overhead), the peak, and whether
    the planner models every part of the candidate's policy (``exact``), and whether it recomputes
    selectively (``selective``: counted module by module, checked on one measured pair only)."""
    import bridge_recipes
    from bridge_recipes.plan.memory import SELECTIVE_MODULES, plan_memory, selective_modules

    cfg = bridge_recipes.build(candidate.recipe, overrides=list(candidate.overrides))
    gpus = bridge_recipes.registry.find(candidate.recipe).meta.gpus
    plan = plan_memory(cfg, gpus, gpu="h200")
    modules = selective_modules(cfg.model)
    return {
        "fits": plan.fits,
        "peak_gb": round(plan.peak_gb, 1),
        "capacity_gb": round(plan.gpu_memory_gb, 1),
        "exact": modules <= SELECTIVE_MODULES,
        "selective": bool(modules),
    }


# Each measured candidate: STEM.yaml and STEM_against.yaml (the candidate and its published policy,
# one command), STEM_ratio.json, with STEM from result_stem (its depth, its data); logs in docs/evidence/candidates/.
RESULTS = Path(__file__).resolve().parents[2] / "results" / "candidates"


def result_stem(name: str, layers: int = 4, rows: bool = False) -> str:
    """The file stem of a candidate's measurement at a proxy depth: NAME at 4 layers, NAME_16_layers at 16;
    ``_rows`` after either where both runs trained the recipe itself on packed chat rows (``--rows``)."""
    stem = name if layers == 4 else f"{name}_{layers}_layers"
    return f"{stem}_rows" if rows else stem


def parse_stem(stem: str) -> tuple[str, int, bool]:
    """(candidate, proxy layers, on chat rows) of a result stem (:func:`result_stem`'s inverse)."""
    rows = stem.endswith("_rows")
    stem = stem.removesuffix("_rows")
    name, sep, layers = stem.rpartition("_layers")[0].rpartition("_")
    if stem.endswith("_layers") and sep and layers.isdigit():
        return name, int(layers), rows
    return stem, 4, rows


def measured_arms(name: str) -> list[tuple[int, bool]]:
    """The (proxy layers, on chat rows) a candidate was measured at (each a ratio file), shallowest and
    mock rows first."""
    stems = [parse_stem(p.name.removesuffix("_ratio.json")) for p in RESULTS.glob(f"{name}*_ratio.json")]
    return sorted((layers, rows) for n, layers, rows in stems if n == name)


def measured(name: str, layers: int = 4, rows: bool = False) -> dict | None:
    """The ratio file of a candidate's side-by-side proxy measurement at ``layers`` (on chat rows where
    ``rows``), or None before it ran."""
    path = RESULTS / f"{result_stem(name, layers, rows)}_ratio.json"
    return json.loads(path.read_text()) if path.is_file() else None


def measured_cell(name: str) -> str:
    """The table's "measured" cell: the proxy ratio at each depth measured, its loss-curve check and date."""
    from bridge_recipes.bench.result import read_result

    cells = []
    for layers, rows in measured_arms(name):
        ratio = measured(name, layers, rows)
        date = read_result(RESULTS / f"{result_stem(name, layers, rows)}.yaml")["result"]["measured"]
        curves = ratio["loss_curves"]
        check = (
            ("loss check passed" if curves["passed"] else "LOSS CHECK FAILED")
            if curves["compared"]
            else "no loss check"
        )
        depth = "" if layers == 4 else f" at {layers} layers"
        data = " on chat rows" if rows else ""
        cells.append(f"{ratio['tokens_per_s_ratio']:.2f}x{depth}{data}, {check} ({date})")
    return "; ".join(cells) or "not yet"


def candidates_table() -> str:
    """docs/performance_candidates.md's table: each candidate, its prediction and its verdict."""
    lines = [
        "| candidate | model | change | predicted proxy ratio | basis | proxy GPUs | full scale (planner) "
        "| measured |",
        "|---|---|---|---:|---|---:|---|---|",
    ]
    for c in CANDIDATES:
        v = full_scale_verdict(c)
        verdict = f"{'fits' if v['fits'] else 'DOES NOT FIT'}: {v['peak_gb']} of {v['capacity_gb']} GB"
        if not v["exact"]:
            verdict = f"not known (recompute modules the planner does not model): {verdict}"
        elif v["selective"]:
            verdict += " (selective recompute counted module by module; its one measured check: docs/memory_plan.md)"
        gpus = "full scale" if c.full_scale_only else c.proxy_gpus
        depth = "" if c.proxy_layers == 4 else f" at {c.proxy_layers} layers"
        lines.append(
            f"| {c.name} | {c.model} | {c.change} | {c.predicted_ratio:.2f}x{depth} | {c.basis} | {gpus} | {verdict} "
            f"| {measured_cell(c.name)} |"
        )
    return "\n".join(lines) + "\n"
