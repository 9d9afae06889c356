"""The result file of a benchmark run: a YAML in the shape of an OpenRecipes recipe.

Top-level keys, in this order: ``schema_version``, ``recipe`` (our recipe function's name),
``fingerprint`` (the recipe's fingerprint as it stood when the run was measured,
:mod:`bridge_recipes.config.fingerprint`: its config and features; the ``command`` says what the run added, such
as its steps and data; null for a name that is no recipe; results written before it was recorded lack
it), ``model``, ``gpu`` {type, count, memory_gb}, ``layout`` (parallel sizes, layer split, micro
batch, recompute, offload, dispatcher), ``workload`` {row_tokens, global_batch, precision,
dataset}, ``stack`` (versions of the running environment), ``result`` (throughput, MFU,
step-time CV, peak memory, window, FLOPs per token), ``command``, ``notes``.

Field names follow OpenRecipes' recipe YAML (openrecipes-35b-h200, openrecipes-27b-h200: ``tokens_per_s_per_gpu``,
``step_time_cv_percent``, ``mfu``, ``window: [5, 19]``, ``window_tokens``, ``steps_per_run``,
``measured``); the additions are ``tflops_per_s_per_gpu``, ``mfu_6n`` (MFU with OpenRecipes'
6N, the figure comparable with theirs; ``mfu`` uses the architecture's FLOPs of
:mod:`bridge_recipes.models.flops`), ``peak_tflops_per_gpu``, ``step_time_mean_s``, the peak
memory and ``flops_per_token``. Rounding (2 decimals for rates and CV, 4 for MFU and seconds,
3 for GB, whole FLOPs) happens here, once, on writing.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
from pathlib import Path
from typing import Any

import yaml

from bridge_recipes.config.datasets import row_tokens, rows_per_sequence, rows_per_step
from bridge_recipes.hardware.gpus import GPUS, gpu_type_from_name
from bridge_recipes.logs.stats import WindowStats
from bridge_recipes.models.flops import FlopsPerToken
from bridge_recipes.plan.layout import layout_of

SCHEMA_VERSION = 1
TOP_LEVEL_KEYS = (
    "schema_version",
    "recipe",
    "fingerprint",
    "model",
    "gpu",
    "layout",
    "workload",
    "stack",
    "result",
    "command",
    "notes",
)
# Keys a result file may lack: written before the key was recorded.
LATER_KEYS = ("fingerprint",)

# stack key -> distribution names to try, first found wins
STACK_PACKAGES = {
    "pytorch": ("torch",),
    "megatron_core": ("megatron-core",),
    "megatron_bridge": ("megatron-bridge",),
    "transformer_engine": ("transformer-engine", "transformer-engine-torch"),
    "flash_linear_attention": ("flash-linear-attention",),  # the Gated DeltaNet kernels
}


# --- layout and workload from a Megatron-Bridge ConfigContainer -------------------------------


def layout_from_config(cfg: Any, world_size: int) -> dict[str, Any]:
    """The ``layout`` block of a ConfigContainer (or any object with its ``model``, ``train``
    and ``optimizer`` attributes) launched on ``world_size`` GPUs."""
    m, opt = cfg.model, getattr(cfg, "optimizer", None)
    lay = layout_of(cfg, world_size)
    if world_size < 1 or lay.dp is None:
        raise ValueError(f"world size {world_size} is not a multiple of TP x PP x CP = {lay.tp} x {lay.pp} x {lay.cp}")
    experts = getattr(m, "num_moe_experts", None)
    first = getattr(m, "num_layers_in_first_pipeline_stage", None)
    last = getattr(m, "num_layers_in_last_pipeline_stage", None)
    rows = cfg.train.micro_batch_size * rows_per_sequence(cfg)
    return {
        "label": lay.label(),
        "tp": lay.tp,
        "pp": lay.pp,
        "vpp": lay.vpp or 1,
        "cp": lay.cp,
        "ep": lay.ep,
        "etp": lay.expert_tp,
        "dp": lay.dp,
        "sequence_parallel": lay.sp,
        "layer_split": None if first is None and last is None else {"first": first, "last": last},
        # tokens one GPU holds per micro batch: the rows, split over context parallelism
        "max_tokens_per_gpu": cfg.train.micro_batch_size * m.seq_length // lay.cp,
        "rows_per_microbatch": rows,
        "recompute": _recompute(m),
        "offload": _offload(opt),
        "dispatcher": getattr(m, "moe_token_dispatcher_type", None) if experts else None,
    }


def _recompute(m: Any) -> dict[str, Any] | None:
    granularity = getattr(m, "recompute_granularity", None)
    if not granularity:
        return None
    block = {
        "granularity": granularity,
        "method": getattr(m, "recompute_method", None),
        "num_layers": getattr(m, "recompute_num_layers", None),
    }
    if granularity == "selective":
        block["modules"] = list(getattr(m, "recompute_modules", None) or [])
    return block


def _offload(opt: Any) -> dict[str, Any] | None:
    """OpenRecipes' shape: null, or the optimizer's offloaded fraction and copy overlap."""
    if opt is None or not getattr(opt, "optimizer_cpu_offload", False):
        return None
    return {
        "optimizer_fraction": float(getattr(opt, "optimizer_offload_fraction", 1.0)),
        "overlap_d2h_h2d": bool(getattr(opt, "overlap_cpu_optimizer_d2h_h2d", False)),
    }


def precision_from_config(cfg: Any) -> str:
    """``bf16``, ``fp8cs`` (tensorwise current scaling), ``fp8mx`` (MXFP8), ``fp8-<recipe>``,
    ``fp16`` or ``fp32``, or ``fp8base`` (LoRA on a base stored in FP8): the names of the recipe metadata."""
    from bridge_recipes.plan.memory import fp8_frozen_base

    if fp8_frozen_base(cfg):
        return "fp8base"
    m = cfg.model
    if getattr(m, "fp8", None):
        recipe = getattr(m, "fp8_recipe", None)
        return {"tensorwise": "fp8cs", "mxfp8": "fp8mx"}.get(recipe, f"fp8-{recipe}")
    if getattr(m, "bf16", False):
        return "bf16"
    return "fp16" if getattr(m, "fp16", False) else "fp32"


def dataset_from_config(cfg: Any) -> dict[str, Any]:
    """What the config says of its data: mock, or the dataset config's type and path."""
    d = getattr(cfg, "dataset", None)
    if d is None:
        return {"name": None, "source": None}
    if getattr(d, "mock", False):
        return {"name": "mock", "source": None}
    source = next((getattr(d, a) for a in ("data_path", "path", "dataset_root", "blend") if getattr(d, a, None)), None)
    return {"name": type(d).__name__, "source": None if source is None else str(source)}


def workload_from_config(cfg: Any, *, dataset: Any = None, precision: str | None = None) -> dict[str, Any]:
    """The ``workload`` block; ``dataset`` (a name or an OpenRecipes-style dict) and ``precision``
    override what the config says."""
    return {
        "row_tokens": row_tokens(cfg),
        "global_batch": rows_per_step(cfg),
        "precision": precision or precision_from_config(cfg),
        "dataset": dataset_from_config(cfg) if dataset is None else dataset,
    }


# --- environment -------------------------------------------------------------------------------


def _version(distributions: tuple[str, ...]) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def stack_versions() -> dict[str, Any]:
    """Versions of the running environment; null for whatever is missing (no GPU, no package)."""
    stack: dict[str, Any] = {key: _version(dists) for key, dists in STACK_PACKAGES.items()}
    stack.update(python=platform.python_version(), cuda=None, nccl=None, gpu_name=None)
    try:
        import torch
    except ImportError:
        return stack
    stack["cuda"] = torch.version.cuda
    try:
        nccl = torch.cuda.nccl.version()
        stack["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # torch built without NCCL, or the library cannot load
        pass
    try:
        if torch.cuda.is_available():
            stack["gpu_name"] = torch.cuda.get_device_name(0)
    except Exception:  # a broken driver: report no GPU rather than fail the result
        pass
    return stack


def gpu_block(gpu: str | None, count: int) -> dict[str, Any]:
    """``{type, count, memory_gb}``: the type from a table key or device name (``"NVIDIA H200"``
    -> ``H200``), the datasheet memory where the type is in :data:`~bridge_recipes.hardware.gpus.GPUS`."""
    try:
        gpu_type = gpu_type_from_name(gpu) if gpu else None
    except KeyError:
        gpu_type = gpu  # not in the table: keep the name, memory unknown
    known = GPUS.get(gpu_type) if gpu_type else None
    return {"type": gpu_type, "count": count, "memory_gb": known.memory_gb if known else None}


# --- result -------------------------------------------------------------------------------------


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


def result_block(
    stats: WindowStats,
    *,
    flops: FlopsPerToken | None = None,
    steps_per_run: int | None = None,
    measured: dt.date | None = None,
    phase_time_mean_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The ``result`` block from the window statistics (and the FLOPs breakdown, and the mean
    seconds per step of Megatron's phase timers, if given)."""
    model_flops = flops.training_total if flops is not None else stats.flops_per_token
    six_n = stats.six_n_flops_per_token
    per_token: dict[str, Any] = {
        "model": None if model_flops is None else round(model_flops),
        "six_n": None if six_n is None else round(six_n),
    }
    if flops is not None:
        per_token["seq_length"] = flops.seq_length
        per_token["gdn_chunk_size"] = flops.chunk_size
        per_token["mtp_num_layers"] = flops.mtp_num_layers
        per_token["breakdown"] = {name: round(value) for name, value in flops.training.items()}
    return {
        "tokens_per_s_per_gpu": _round(stats.tokens_per_s_per_gpu, 2),
        "tflops_per_s_per_gpu": _round(stats.tflops_per_s_per_gpu, 2),
        "mfu": _round(stats.mfu, 4),
        "mfu_6n": _round(stats.mfu_6n, 4),
        "peak_tflops_per_gpu": _round(None if stats.peak_flops is None else stats.peak_flops / 1e12, 1),
        "active_params": None if six_n is None else {"count": round(six_n) // 6},
        "step_time_mean_s": _round(stats.step_time_mean_s, 4),
        "step_time_cv_percent": _round(stats.step_time_cv_percent, 2),
        "peak_allocated_gb": _round(stats.peak_allocated_gb, 3),
        "peak_reserved_gb": _round(stats.peak_reserved_gb, 3),
        "measured": measured or dt.datetime.now(dt.UTC).date(),
        "steps_per_run": steps_per_run if steps_per_run is not None else stats.steps_recorded,
        "window": list(stats.window),
        "window_tokens": stats.window_tokens,
        "flops_per_token": per_token,
        **({"phase_time_mean_s": {k: round(v, 4) for k, v in phase_time_mean_s.items()}} if phase_time_mean_s else {}),
    }


def build_result(
    *,
    recipe: str,
    model: str,
    cfg: Any,
    stats: WindowStats,
    gpu: str | None = None,
    flops: FlopsPerToken | None = None,
    steps_per_run: int | None = None,
    measured: dt.date | None = None,
    dataset: Any = None,
    precision: str | None = None,
    stack: dict[str, Any] | None = None,
    command: str | None = None,
    notes: str | list[str] | None = None,
    phase_time_mean_s: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The whole result document. ``gpu`` defaults to the running GPU's name; ``stack`` entries
    override (or add to) :func:`stack_versions`; the GPU count is ``stats.world_size``; the fingerprint
    is the recipe's as it builds now (:func:`recipe_fingerprint`)."""
    env = stack_versions()
    env.update(stack or {})
    return {
        "schema_version": SCHEMA_VERSION,
        "recipe": recipe,
        "fingerprint": recipe_fingerprint(recipe),
        "model": model,
        "gpu": gpu_block(gpu or env.get("gpu_name"), stats.world_size),
        "layout": layout_from_config(cfg, stats.world_size),
        "workload": workload_from_config(cfg, dataset=dataset, precision=precision),
        "stack": env,
        "result": result_block(
            stats, flops=flops, steps_per_run=steps_per_run, measured=measured, phase_time_mean_s=phase_time_mean_s
        ),
        "command": command,
        "notes": notes,
    }


def recipe_fingerprint(recipe: str) -> dict[str, str] | None:
    """The fingerprint of recipe ``recipe`` as it builds now, None for a name that is no recipe."""
    from bridge_recipes.config import fingerprint
    from bridge_recipes.recipes import registry

    if recipe not in registry.entries():
        return None
    return fingerprint.recipe_fingerprint(recipe)


def dump_result(path: str | Path, document: dict[str, Any]) -> Path:
    """Write a result document as YAML (keys in document order), creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Benchmark result of {document.get('recipe')}; written by bridge_recipes.bench.result.\n"
    path.write_text(header + yaml.safe_dump(document, sort_keys=False, width=100, allow_unicode=True))
    return path


def write_result(path: str | Path, **fields: Any) -> dict[str, Any]:
    """:func:`build_result` with ``fields``, written to ``path``; returns the document."""
    document = build_result(**fields)
    dump_result(path, document)
    return document


# A run whose allocator was capped below the GPU's memory says so in its notes, in these words.
CAP_NOTE = "GPU memory capped (run_recipe.py --gpu-memory-gb) at"


def memory_cap_gb(document: dict[str, Any]) -> float | None:
    """The GB a result's run was capped at (``run_recipe.py --gpu-memory-gb``), None when uncapped:
    such a run measures the memory of a smaller card, its speed stays the GPU's it ran on."""
    notes = document.get("notes") or []
    for note in [notes] if isinstance(notes, str) else notes:
        if str(note).startswith(CAP_NOTE):
            return float(str(note)[len(CAP_NOTE) :].split()[0])
    return None


def read_result(path: str | Path) -> dict[str, Any]:
    """Load a result file, checking it is one (schema version and top-level keys)."""
    document = yaml.safe_load(Path(path).read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a result file (no mapping at the top level)")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version!r}, expected {SCHEMA_VERSION}")
    missing = [key for key in TOP_LEVEL_KEYS if key not in document and key not in LATER_KEYS]
    if missing:
        raise ValueError(f"{path}: missing top-level keys {missing}")
    return document
