"""The benchmark harness: run a recipe for N steps, measure a window, write a result file.

Full mode runs the recipe at its own GPU count. Proxy mode (one GPU) keeps the recipe's
execution policy with fewer layers and, where the recipe uses EP > 1, the per-GPU expert count
it would have (experts / EP), so that two policies can be compared side by side on one GPU;
proxy figures are only meaningful as a ratio between policies measured in the same session,
never as absolute throughput, and the result files say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bridge_recipes
from bridge_recipes.config.builder import runner_args
from bridge_recipes.config.datasets import row_tokens, rows_per_step
from bridge_recipes.logs.megatron_log import phase_time_means, step_records_from_log
from bridge_recipes.logs.stats import DEFAULT_WINDOW, summarize
from bridge_recipes.models.flops import model_flops_per_token, six_n_flops_per_token
from bridge_recipes.models.qwen35 import SPECS, Qwen35Spec, is_vlm
from bridge_recipes.recipes import registry

BENCHMARK_OVERRIDES = [
    "checkpoint.save=null",
    "checkpoint.load=null",
    "checkpoint.async_save=false",
    "logger.log_interval=1",
]


def proxy_experts(cfg: Any, gpus: int = 1) -> int | None:
    """Routed experts of a proxy on ``gpus`` GPUs that keeps the recipe's experts per GPU: one
    GPU's share under the recipe's expert parallelism, times the expert-parallel size the proxy
    keeps (the largest common divisor of the recipe's EP and ``gpus``). None for dense."""
    import math

    m = cfg.model
    if not m.num_moe_experts:
        return None
    ep = m.expert_model_parallel_size or 1
    return m.num_moe_experts // ep * math.gcd(ep, gpus)


# Micro batches per proxy step. A recipe's own global batch on one GPU would be 128 micro batches
# per step (minutes per step at 4 layers); both policies of a comparison get this same count, so
# the ratio compares per-token work with the optimizer step amortized alike.
PROXY_GLOBAL_BATCH = 8
# Proxy runs log Megatron's forward-backward and optimizer timers each step: a proxy step has 8
# micro batches where a full-scale rank has 16-64, so it overweights the optimizer step, and the
# forward-backward time per token is the part of a ratio that carries over to full scale.
PROXY_OVERRIDES = ["logger.timing_log_level=1"]


def run_request(
    cfg: Any,
    *,
    steps: int,
    proxy_layers: int | None,
    extra: Sequence[str] = (),
    proxy_global_batch: int = PROXY_GLOBAL_BATCH,
    proxy_gpus: int = 1,
) -> dict[str, Any]:
    """The :func:`bridge_recipes.build` keywords of a benchmark run of the recipe ``cfg`` was
    built from: ``steps`` steps, no checkpoints, a log line every step; in proxy mode its
    scale-down (layers, per-GPU experts, on ``proxy_gpus`` GPUs), the proxy global batch and the
    phase timers.
    ``extra``: the user's KEY=VALUE overrides, last (they win)."""
    request: dict[str, Any] = {"flags": {"max_steps": steps}, "overrides": [*BENCHMARK_OVERRIDES]}
    if proxy_layers:
        request["scale_down"] = proxy_layers
        request["scale_experts"] = proxy_experts(cfg, proxy_gpus)
        if proxy_gpus > 1:
            request["gpus"] = proxy_gpus  # the scale-down keeps what fits of the recipe's layout
        request["flags"] = {"gb": proxy_global_batch, **request["flags"]}
        request["overrides"] += PROXY_OVERRIDES
    request["overrides"] += list(extra)
    return request


def run_args(cfg: Any, **kwargs: Any) -> list[str]:
    """run_recipe.py arguments after ``--recipe NAME`` of :func:`run_request`."""
    return runner_args(**run_request(cfg, **kwargs))


def published_step_seconds(cfg: Any, entry: registry.RecipeEntry) -> float | None:
    """Seconds one full-scale step of ``cfg`` takes at the registry ``entry``'s published tokens/s
    per GPU (its ``meta.reference``) or, without one, at its own measured rate
    (:func:`bridge_recipes.recipes.registry.measured_rate`); None without either: what a step count costs in
    device time before a run starts."""
    rate = (entry.meta.reference or {}).get("tokens_per_s_per_gpu") or registry.measured_rate(
        entry.alias_of or entry.name
    )
    if not rate:
        return None
    return cfg.train.global_batch_size * cfg.model.seq_length / (rate * entry.meta.gpus)


def build_config(name: str, **request: Any) -> Any:
    """The config ``run_recipe.py`` builds for recipe ``name`` and the :func:`bridge_recipes.build`
    keywords ``request`` (no GPU needed); scale-down changes are printed as the runner prints them."""
    return bridge_recipes.build(name, **request, report=lambda change: print(f"[run_recipe] {change}"))


def proxy_config(name: str, steps: int = 20, proxy_layers: int = 4) -> Any:
    """The config of a one-GPU proxy run of recipe ``name``."""
    return build_config(name, **run_request(registry.load(name)(), steps=steps, proxy_layers=proxy_layers))


def model_spec(cfg: Any) -> Qwen35Spec:
    """The catalog spec matching a (possibly scaled) config: layers, experts, MTP and vocabulary as configured."""
    spec = next(
        s
        for s in SPECS.values()
        if s.hidden_size == cfg.model.hidden_size
        and s.is_vl == is_vlm(cfg)
        and s.num_attention_heads == cfg.model.num_attention_heads
    )
    return dataclasses.replace(
        spec,
        num_layers=cfg.model.num_layers,
        num_experts=cfg.model.num_moe_experts or spec.num_experts,
        moe_router_topk=cfg.model.moe_router_topk or spec.moe_router_topk,
        mtp_num_layers=cfg.model.mtp_num_layers or 0,
        vocab_size=cfg.model.vocab_size or spec.vocab_size,
    )


def measure(log_text: str, cfg: Any, world_size: int, gpu: str, window: tuple[int, int] = DEFAULT_WINDOW):
    """Window statistics and the FLOPs model of one run's log."""
    spec = model_spec(cfg)
    seq = cfg.model.seq_length
    flops = model_flops_per_token(spec, seq)
    records = step_records_from_log(log_text, seq)
    stats = summarize(
        records,
        window,
        world_size,
        flops.training_total,
        gpu.upper(),
        six_n_flops_per_token=six_n_flops_per_token(spec),
    )
    return stats, flops


def rows_workload(cfg: Any) -> dict[str, Any] | None:
    """What a run on SFT rows trains on, from the rows' manifest: the packing mode, the conversations,
    their mean length, the row length and the share of a row's tokens that are conversation tokens
    (padding excluded). None for mock or other data."""
    from bridge_recipes.data.integrity import read_manifest
    from bridge_recipes.data.packed_rows import PackedSFTRowsConfig

    if not isinstance(cfg.dataset, PackedSFTRowsConfig) or not cfg.dataset.path:
        return None
    path = cfg.dataset.path
    m = read_manifest(path)
    conversations = m["conversations"]["used"]
    total = m["rows"] * m["row_tokens"]
    return {
        "packing": m["packing"],
        "conversations": conversations,
        "mean_conversation_tokens": round(m["stream_tokens"] / conversations, 1) if conversations else 0.0,
        "row_tokens": m["row_tokens"],
        "useful_token_share": round(1 - m["padding_tokens"] / total, 4) if total else 0.0,
    }


def write(
    path: Path,
    *,
    recipe: str,
    cfg: Any,
    log_text: str,
    world_size: int,
    gpu: str,
    window,
    command: str,
    proxy: bool,
    notes: list[str] | None = None,
) -> dict:
    stats, flops = measure(log_text, cfg, world_size, gpu, window)
    notes = [*(notes or []), fusion_note(cfg, log_text)]
    if proxy:
        notes.insert(
            0,
            "proxy run: the recipe's policy on one GPU with fewer layers; compare only as a ratio "
            "with a policy measured in the same session",
        )
    from bridge_recipes.bench.result import build_result, dump_result

    document = build_result(
        recipe=recipe,
        model=model_spec(cfg).name,
        cfg=cfg,
        stats=stats,
        gpu=gpu.upper(),
        phase_time_mean_s=phase_time_means(log_text, tuple(window)),
        flops=flops,
        command=command,
        notes=notes,
    )
    rows = rows_workload(cfg)
    if rows:
        # the rows' padding is work that trains nothing: the figure that counts is conversation tokens
        document["workload"]["rows"] = rows
        r = document["result"]
        r["useful_tokens_per_s_per_gpu"] = round(r["tokens_per_s_per_gpu"] * rows["useful_token_share"], 1)
    dump_result(path, document)
    return document


FUSION_NOTE = "gradient-accumulation fusion: "


def fusion_note(cfg: Any, log_text: str) -> str:
    """How a run accumulated its weight gradients: its config's ``gradient_accumulation_fusion``, unless
    the runner's log says it went without (no APEX and the stand-in failed its check)."""
    from bridge_recipes.features.te_wgrad import FUSION_OFF, ran_fused

    if not getattr(cfg.model, "gradient_accumulation_fusion", False):
        return f"{FUSION_NOTE}off (the config)"
    if not ran_fused(cfg, log_text):
        said = [line for line in log_text.splitlines() if FUSION_OFF in line]
        return f"{FUSION_NOTE}off (the runner: {said[-1].split(FUSION_OFF, 1)[1].strip()})"
    return f"{FUSION_NOTE}on"


def result_fused(doc: dict[str, Any]) -> bool:
    """Whether a benchmark result's run accumulated its weight gradients fused (its ``notes`` say so, see
    :func:`fusion_note`). Results written before runs noted it ran without: on a host without APEX the
    runner turned fusion off until ``bridge_recipes.features.te_wgrad`` stood in for it."""
    notes = doc.get("notes") or []
    return f"{FUSION_NOTE}on" in ([notes] if isinstance(notes, str) else notes)


def different_training(candidate_cfg: Any, reference_cfg: Any) -> str | None:
    """Why two runs' loss curves cannot be compared (they train different models or read
    different rows), or None. A proxy keeps each layout's per-GPU expert count, so two MoE
    layouts with different expert parallelism become different models."""
    a, b = candidate_cfg, reference_cfg
    experts = (a.model.num_moe_experts, b.model.num_moe_experts)
    # rows joined into longer sequences train as the rows apart do: compare rows, not sequences
    (rows_a, row_a), (rows_b, row_b) = (rows_per_step(a), row_tokens(a)), (rows_per_step(b), row_tokens(b))
    checks = [  # (what to name, candidate's value, reference's value)
        (
            "model" + (" (routed experts {} vs {})".format(*experts) if experts[0] != experts[1] else ""),
            model_spec(a),
            model_spec(b),
        ),
        (f"row length ({row_a} vs {row_b} tokens)", row_a, row_b),
        ("rows per step", rows_a, rows_b),
        ("dataset", type(a.dataset).__name__, type(b.dataset).__name__),
        ("dataset.path", getattr(a.dataset, "path", None), getattr(b.dataset, "path", None)),
        ("dataset.random_seed", getattr(a.dataset, "random_seed", None), getattr(b.dataset, "random_seed", None)),
        ("rng.seed", a.rng.seed, b.rng.seed),
    ]
    differ = [name for name, x, y in checks if x != y]
    return "the runs differ in " + ", ".join(differ) if differ else None


def comparison(
    candidate: dict, reference: dict, *, proxy: bool, losses: tuple[dict, dict] | str | None = None
) -> dict:
    """The ratio file of two result documents measured back to back: tokens/s/GPU of the
    candidate over the reference and, where both logged their phase timers, the ratio of
    forward-backward seconds per token (reference over candidate: > 1 means the candidate's
    forward-backward is faster) and each run's optimizer seconds per step. ``losses``: the
    (candidate, reference) loss curves where the two runs trained the same model on the same
    rows, compared by validate_convergence's rules; or why they could not be compared."""
    from bridge_recipes.bench.convergence import compare

    out = {
        "candidate": candidate["recipe"],
        "reference": reference["recipe"],
        "tokens_per_s_ratio": round(
            candidate["result"]["tokens_per_s_per_gpu"] / reference["result"]["tokens_per_s_per_gpu"], 4
        ),
        "proxy": proxy,
    }
    rows = [d["workload"].get("rows") for d in (candidate, reference)]
    if all(rows):
        useful = [d["result"]["useful_tokens_per_s_per_gpu"] for d in (candidate, reference)]
        out["useful_tokens_per_s_ratio"] = round(useful[0] / useful[1], 4)
        out["packing"], out["baseline_packing"] = rows[0]["packing"], rows[1]["packing"]
        same = ("conversations", "mean_conversation_tokens", "row_tokens")
        out.update({k: rows[0][k] for k in same if rows[0][k] == rows[1][k]})
    if isinstance(losses, str):
        out["loss_curves"] = {"compared": False, "why": losses}
    elif losses:
        try:
            out["loss_curves"] = {"compared": True, **compare(losses[1], losses[0]).as_dict()}
        except ValueError as exc:  # too few common steps, or a loss that is not finite
            out["loss_curves"] = {"compared": False, "why": str(exc)}
    phases = [d["result"].get("phase_time_mean_s") for d in (candidate, reference)]
    if all(phases):
        per_token = [
            p["forward-backward"] / (d["workload"]["global_batch"] * d["workload"]["row_tokens"])
            for p, d in zip(phases, (candidate, reference))
        ]
        out["forward_backward_per_token_ratio"] = round(per_token[1] / per_token[0], 4)
        out["optimizer_s_per_step"] = {"candidate": phases[0]["optimizer"], "reference": phases[1]["optimizer"]}
    return out
