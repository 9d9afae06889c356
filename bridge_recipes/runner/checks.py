"""Layout checks run before any process group exists, each saying what to change.

They catch what otherwise fails minutes into a launch (or at ``initialize_model_parallel``):
a world size the parallel sizes do not divide, layers that do not split over pipeline stages
(including uneven first/last stages and virtual stages), heads and GDN heads that tensor
parallelism cannot split, experts that expert parallelism cannot split, an expert group that
does not tile the data-parallel group, sequence lengths that context or sequence parallelism
cannot split, and a global batch that micro batches and data parallelism do not divide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_recipes.config.datasets import rows_per_sequence
from bridge_recipes.models.qwen35 import is_vlm
from bridge_recipes.plan.layout import divides, layout_of, model_shape, rule_problems, stage_layers


@dataclass(frozen=True)
class Problem:
    severity: str  # error | warning
    message: str
    layout: bool = False  # the parallel layout over the GPUs breaks it (another GPU count or -tp/-pp/... fixes it)

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


def check(cfg: Any, world_size: int, recipe: str | None = None) -> list[Problem]:
    """The problems of ``cfg`` on ``world_size`` GPUs; ``recipe`` (its name), when given, is compared
    with that of a checkpoint the run would resume."""
    from bridge_recipes.config.values import value_problems

    # The layout arithmetic below divides by the parallel sizes: out-of-range values stop here.
    bad_values = value_problems(cfg, world_size)
    if bad_values:
        return [Problem("error", msg) for msg in bad_values]
    m = cfg.model
    lay = layout_of(cfg, world_size)
    problems = [Problem("error", msg, layout=True) for msg in _layout_errors(cfg, lay)]
    problems += [Problem("error", msg) for msg in _shape_errors(cfg)]

    def err(msg: str) -> None:
        problems.append(Problem("error", msg))

    if m.sequence_parallel and lay.tp == 1:
        problems.append(
            Problem("warning", "sequence_parallel has no effect at TP=1; set model.sequence_parallel=false")
        )

    problems += [Problem("error", msg) for msg in vision_budget_problems(cfg)]
    data_errors, data_warnings = dataset_findings(cfg)
    problems += [Problem("error", msg) for msg in data_errors] + [Problem("warning", msg) for msg in data_warnings]
    from bridge_recipes.runner import checkpoints

    problems += [Problem("error", msg) for msg in checkpoints.problems(cfg, world_size, recipe)]

    if getattr(m, "calculate_per_token_loss", False) and getattr(cfg.ddp, "average_in_collective", False):
        err(
            "per-token loss sums gradients across ranks and cannot average in the collective; "
            "set ddp.average_in_collective=false"
        )

    for msg in fp8_parameter_problems(cfg):
        err(msg)
    for msg in op_fuser_problems(cfg):
        err(msg)
    from bridge_recipes import features

    for msg in features.problems(cfg, *recipe_gpu(cfg)):
        err(msg)

    # Batch shape.
    gbs, mbs = cfg.train.global_batch_size, cfg.train.micro_batch_size
    if lay.dp is not None and not divides(gbs, mbs * lay.dp):
        from bridge_recipes.data.packed_rows import recipe_rows

        k = rows_per_sequence(cfg)
        if k > 1 and k == recipe_rows(cfg):  # the build joined the recipe's rows: its -gb counts rows
            msg = (
                f"global batch {gbs} sequences of {k} rows is not divisible by micro batch x DP = {mbs} x "
                f"{lay.dp}; use -gb (rows per step) as a multiple of {mbs * lay.dp * k}"
            )
        else:
            msg = (
                f"global batch {gbs} is not divisible by micro batch x DP = {mbs} x {lay.dp}; "
                f"use -gb as a multiple of {mbs * lay.dp} or change -mb"
            )
        problems.append(Problem("error", msg, layout=True))
    return problems


def _layout_errors(cfg: Any, lay: Any) -> list[str]:
    """The layers over the stages and the parallel sizes against the world, the model and the sequence."""
    m, out = cfg.model, []
    # Layers over pipeline stages: the split itself (first/last) is the recipe's to fix.
    stages = stage_layers(cfg)
    if stages is None:
        out.append(
            f"{m.num_layers} layers do not split over PP={lay.pp} stages "
            f"with first={m.num_layers_in_first_pipeline_stage}"
            f" last={m.num_layers_in_last_pipeline_stage}: the remaining layers must divide evenly over the middle "
            f"stages; change model.num_layers_in_first/last_pipeline_stage or -pp"
        )
    if m.num_moe_experts and lay.etp is None:
        out.append(
            "model.expert_tensor_parallel_size is unset and would silently inherit TP; set -etp explicitly (usually 1)"
        )
    # The parallel sizes against the world, the stages, the heads, the experts and the sequence.
    return out + rule_problems(model_shape(m), lay, stages)


def _shape_errors(cfg: Any) -> list[str]:
    """The per-layer patterns, and the sequence length and vocabulary the data and the tokenizer ask of the
    model."""
    m = cfg.model
    out = layer_pattern_problems(m)
    # a packed sample may join several rows (dataset.rows_per_sample): its length is theirs together
    data_seq = getattr(cfg.dataset, "seq_length", m.seq_length) * rows_per_sequence(cfg)
    if data_seq != m.seq_length:
        out.append(
            f"model.seq_length={m.seq_length} differs from dataset.seq_length={data_seq}; set both (-sl sets both)"
        )
    # Megatron-Bridge stops at setup when the tokenizer's vocabulary outgrows the embedding.
    tok = getattr(cfg, "tokenizer", None)
    tok_vocab = getattr(tok, "vocab_size", None) if getattr(tok, "tokenizer_type", None) == "NullTokenizer" else None
    if tok_vocab and m.vocab_size and tok_vocab > m.vocab_size:
        out.append(
            f"tokenizer.vocab_size={tok_vocab} is larger than model.vocab_size={m.vocab_size}; "
            f"set tokenizer.vocab_size={m.vocab_size} with the smaller model vocabulary"
        )
    return out


def layer_pattern_problems(m: Any) -> list[str]:
    """The per-layer patterns (``linear_attention_freq``: 1 a Gated DeltaNet layer, 0 full attention;
    ``moe_layer_freq``: 1 an MoE layer) against ``model.num_layers``: Megatron-Core asserts a list's
    length at model build, on the GPU, and an interval that does not divide the layers leaves the
    model without the full-attention layer that ends each block of the Qwen3.5 layout."""
    n, out = m.num_layers, []
    intervals = {"linear_attention_freq": "4 (one full-attention layer every 4)", "moe_layer_freq": "1 (every layer)"}
    for name, interval in intervals.items():
        freq, field = getattr(m, name, None), f"model.{name}"
        if isinstance(freq, list):
            if len(freq) != n:
                out.append(
                    f"{field} lists {len(freq)} layers but model.num_layers={n}: the pattern needs one entry a "
                    f"layer; set model.num_layers={len(freq)}, or {field}={interval}"
                )
            elif odd := [v for v in freq if isinstance(v, bool) or v not in (0, 1)]:
                out.append(f"{field} holds {odd[0]!r}: each entry is 1 or 0; fix the list, or set {field}={interval}")
        elif name == "linear_attention_freq" and isinstance(freq, int) and not isinstance(freq, bool):
            if freq < 1:
                out.append(f"{field}={freq}: the full-attention interval is an integer >= 1; set {field}={interval}")
            elif n % freq:
                out.append(
                    f"model.num_layers={n} is not a multiple of {field}={freq}: the last {n % freq} layer(s) would "
                    f"follow the final full-attention layer; set model.num_layers to a multiple of {freq}"
                )
    return out


def precision_summary(cfg: Any) -> str:
    """The mixed-precision preset in a line, as it runs: its name where the recipe names one, the FP8
    recipe and where the parameters live (e.g. ``bf16_mixed``; ``FP8 tensorwise GEMMs, first 1 and last 1
    layers BF16, BF16 parameters``); for LoRA on a base stored in FP8, the base's storage and the GEMMs'
    precision (``features.fp8_base``)."""
    from bridge_recipes.features import fp8_base
    from bridge_recipes.plan.memory import fp8_parameters, mixed_precision_config

    if base := fp8_base.describe(cfg):
        return base

    mp, named = mixed_precision_config(cfg), cfg.mixed_precision if isinstance(cfg.mixed_precision, str) else None
    if mp is None or not getattr(mp, "fp8", None):
        base = named or ("bf16" if getattr(mp, "bf16", False) else "fp16" if getattr(mp, "fp16", False) else "fp32")
        return base
    ends = (
        f", first {mp.num_layers_at_start_in_bf16} and last {mp.num_layers_at_end_in_bf16} layers BF16"
        if getattr(mp, "first_last_layers_bf16", False)
        else ""
    )
    params = "FP8 parameters" if fp8_parameters(mp) else "BF16 parameters"
    return f"{named + ': ' if named else ''}FP8 {mp.fp8_recipe} GEMMs{ends}, {params}"


def fp8_parameter_problems(cfg: Any, weights: str | None = None) -> list[str]:
    """A full fine-tune from pretrained weights (``checkpoint.pretrained_checkpoint``, or ``weights``: the
    ``--hf-checkpoint`` folder the launch converts and attaches later) with FP8 parameters: Megatron-Core
    fills the master weights from the parameters after a load without optimizer state, dequantizing FP8
    ones, so the run would start from (and export) the pretrained weights rounded to FP8. LoRA keeps the
    base weights frozen and exports the adapters, so it is not refused."""
    from bridge_recipes.plan.memory import fp8_parameters, mixed_precision_config

    fp8_params = fp8_parameters(mixed_precision_config(cfg))
    source = f"--hf-checkpoint {weights}" if weights else None
    if cfg.checkpoint.pretrained_checkpoint:
        source = f"checkpoint.pretrained_checkpoint={cfg.checkpoint.pretrained_checkpoint}"
    if not (fp8_params and source and cfg.peft is None):
        return []
    return [
        f"mixed_precision keeps the parameters in FP8 (fp8_param_gather=true) while fine-tuning from {source}: "
        "the master weights would be filled from the FP8-rounded parameters and the export would read them; set "
        "mixed_precision.fp8_param_gather=false (FP8 GEMMs, BF16 parameters)"
    ]


def op_fuser_problems(cfg: Any, environ: dict[str, str] | None = None) -> list[str]:
    """What stops Megatron-Core 0.19.2 from building the routed experts as one Transformer Engine op-fuser
    chain (``model.use_transformer_engine_op_fuser``): it asserts at model build, minutes into a launch,
    unless the experts are unsplit by tensor parallelism, take the routing probabilities after the
    activation, and, for SwiGLU, the environment (the recipe's ``env_vars`` or the process's) opts in to
    Transformer Engine's fused grouped MLP. That fused kernel runs on Blackwell (compute capability 10);
    on other GPUs the chain's ops run one by one."""
    from bridge_recipes.hardware.installed import OP_FUSER_ENV

    m = cfg.model
    if not getattr(m, "use_transformer_engine_op_fuser", False) or not m.num_moe_experts:
        return []
    found, fix = [], "or set model.use_transformer_engine_op_fuser=false"
    if (m.tensor_model_parallel_size or 1) > 1:
        found.append(
            f"model.use_transformer_engine_op_fuser=true with model.tensor_model_parallel_size="
            f"{m.tensor_model_parallel_size}: the fused expert chain does not support tensor parallelism; "
            f"use -tp 1 {fix}"
        )
    if getattr(m, "moe_apply_probs_on_input", False):
        found.append(
            f"model.use_transformer_engine_op_fuser=true with model.moe_apply_probs_on_input=true: the fused expert "
            f"chain scales by the routing probabilities after the activation; set model.moe_apply_probs_on_input="
            f"false {fix}"
        )
    from bridge_recipes.runner.env_settings import env_advice, setting

    try:
        opted_in = int(setting(OP_FUSER_ENV, getattr(cfg, "env_vars", None), environ, default="0")) > 0
    except ValueError:
        opted_in = False
    if m.gated_linear_unit and not opted_in:
        found.append(
            f"model.use_transformer_engine_op_fuser=true for SwiGLU experts needs {OP_FUSER_ENV}=1 in the "
            "environment (Megatron-Core stops at model build without it); add "
            f"{env_advice(OP_FUSER_ENV, '1', environ)} {fix}"
        )
    return found


def recipe_gpu(cfg: Any) -> tuple[tuple[int, int] | None, str | None]:
    """The compute capability and name of the GPU the config's recipe is written for (None, None where the
    recipe or its GPU is not known): what a dry run checks the features against."""
    from bridge_recipes.hardware.gpus import GPUS

    meta = getattr(cfg, "meta", None)
    gpu = GPUS.get(str(getattr(meta, "gpu", "")).upper())
    return (gpu.capability, f"{gpu.name}, the recipe's GPU") if gpu else (None, None)


def vision_patches_per_micro_batch(cfg: Any) -> int | None:
    """Upper bound of vision patches in one micro batch from the dataset's image budget (one
    image per sample, as in image-text pair data), or None when the dataset sets no budget."""
    enc = getattr(cfg.dataset, "task_encoder", None)
    max_pixels = getattr(enc, "max_pixels", None)
    if max_pixels is None:
        return None
    patch = getattr(enc, "patch_size", None) or cfg.model.vision_config.patch_size
    return cfg.train.micro_batch_size * (-(-max_pixels // (patch * patch)))


def vision_budget_problems(cfg: Any) -> list[str]:
    """The image budget against what holds it: the sequence (an image's tokens after the 2 x 2
    spatial merge must leave room in a sample) and the vision CUDA-graph cap where the recipe
    captures the vision tower."""
    patches = vision_patches_per_micro_batch(cfg) if is_vlm(cfg) else None
    if patches is None:
        return []
    out, mbs = [], cfg.train.micro_batch_size
    max_pixels = cfg.dataset.task_encoder.max_pixels
    merge = getattr(cfg.model.vision_config, "spatial_merge_size", 1) or 1
    image_tokens = -(-patches // mbs) // (merge * merge)
    if image_tokens >= cfg.model.seq_length:
        out.append(
            f"one image of dataset.task_encoder.max_pixels={max_pixels} is {image_tokens} tokens after the "
            f"{merge} x {merge} merge, not less than the {cfg.model.seq_length}-token sequence; lower max_pixels "
            "or raise -sl"
        )
    cap = getattr(cfg.model, "max_vision_cuda_graph_seq_length", None)
    if cap is not None and patches > cap:
        out.append(
            f"image budget of {patches} vision patches per micro batch (micro batch {mbs} x "
            f"dataset.task_encoder.max_pixels={max_pixels}) exceeds the vision CUDA-graph cap "
            f"of {cap} this recipe was measured with; lower dataset.task_encoder.max_pixels or the micro batch"
        )
    return out


def dataset_findings(cfg: Any) -> tuple[list[str], list[str]]:
    """Errors and warnings about the selected dataset: sft-rows checked in full, an Energon dataset's
    metadata, and a built one's processor, files and image budget."""
    kind = type(cfg.dataset).__name__
    if kind == "PackedSFTRowsConfig":
        from bridge_recipes.data.packed_rows import dry_run_problems

        return dry_run_problems(cfg)
    if kind == "EnergonDatasetConfig":
        from bridge_recipes.vl.vl_checks import dry_run_problems

        return dry_run_problems(cfg)
    return [], []


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def summary(cfg: Any, world_size: int) -> str:
    """One screen describing the layout and batch a launch will use."""
    m, t = cfg.model, cfg.train
    lay = layout_of(cfg, world_size)
    stages = stage_layers(cfg)
    mbs_per_step = t.global_batch_size // (t.micro_batch_size * lay.dp) if lay.dp else "?"
    recompute = (
        f"{m.recompute_granularity} {m.recompute_method or ''} {m.recompute_num_layers or ''}".strip()
        if m.recompute_granularity
        else "none"
    )
    opt = cfg.optimizer
    offload = (
        f"CPU offload {getattr(opt, 'optimizer_offload_fraction', 0):g}"
        if getattr(opt, "optimizer_cpu_offload", False)
        else "on GPU"
    )
    lines = [
        f"world size        {world_size}  ->  {lay.label()}",
        f"layers per stage  {stages if stages is not None else 'invalid'}" + (f" (VPP {lay.vpp})" if lay.vpp else ""),
        f"sequence          {m.seq_length} tokens"
        + (", SP" if m.sequence_parallel else "")
        + (f", CP{lay.cp}" if lay.cp > 1 else ""),
        f"batch             global {t.global_batch_size} = micro {t.micro_batch_size} x DP {lay.dp} "
        f"x {mbs_per_step} micro-batches",
        f"recompute         {recompute}",
    ]
    if m.num_moe_experts:
        lines.append(
            f"MoE               {m.num_moe_experts} experts top-{m.moe_router_topk}, "
            f"{m.num_moe_experts // lay.ep} per GPU, dispatcher {m.moe_token_dispatcher_type}"
            + (f"/{m.moe_flex_dispatcher_backend}" if m.moe_token_dispatcher_type == "flex" else "")
        )
    lines.append(
        f"optimizer         {opt.optimizer}, distributed={opt.use_distributed_optimizer}, "
        f"precision-aware={getattr(opt, 'use_precision_aware_optimizer', False)}, {offload}"
    )
    lines.append(f"precision         {precision_summary(cfg)}")
    from bridge_recipes import features

    lines += features.summary(cfg)
    lines.append(f"train             {t.train_iters} steps, lr {opt.lr:g} -> {opt.min_lr:g}")
    return "\n".join(lines)
