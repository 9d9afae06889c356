"""Candidate policies against the published H200 SFT policies: what each changes, the proxy ratio
predicted before it runs, and the memory planner's verdict at full scale.

A candidate is its published recipe plus a few overrides. It is measured side by side with the
published policy in one command (``python -m lab.benchmark --candidate NAME --proxy-layers 4``, the
one-GPU proxy at the recipe's per-GPU shard), and only a candidate that fits at full scale by the
planner (with its framework overhead) and whose loss curve agrees with the published policy's can
become a recipe. The candidates, each with its prediction and the basis written before it ran, are
data: ``lab/results/candidates/candidates.json``. docs/performance.md shows :func:`candidates_table`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import RESULTS as LAB_RESULTS

# the published policies the candidates change (their perf counterparts run on mock data)
PUBLISHED = {
    "qwen35_35b_a3b": "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
    "qwen35_27b": "qwen35_27b_sft_8gpu_h200_bf16_config",
}


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
        from bridge_recipes.plan.layout import stage_layers
        from bridge_recipes.recipes.scaledown import scaled_block_recompute

        stage = max(stage_layers(bridge_recipes.build(self.recipe)))
        out = []
        for o in self.overrides:
            key, _, value = o.partition("=")
            if key == "model.recompute_num_layers" and value.isdigit():
                o = f"{key}={scaled_block_recompute(int(value), stage, proxy_layers)}"
            out.append(o)
        return out


# Each measured candidate: STEM.yaml and STEM_against.yaml (the candidate and its published policy,
# one command), STEM_ratio.json, with STEM from result_stem (its depth, its data); logs in lab/evidence/candidates/.
RESULTS = LAB_RESULTS / "candidates"
HISTORY = RESULTS / "candidates.json"


def _load(path: Path) -> tuple[Candidate, ...]:
    """The candidates of ``path``: a list of Candidate fields (lists for the tuples)."""
    tuples = ("overrides", "published_overrides")
    return tuple(
        Candidate(**{k: tuple(v) if k in tuples else v for k, v in d.items()}) for d in json.loads(path.read_text())
    )


CANDIDATES: tuple[Candidate, ...] = _load(HISTORY)


def find(name: str) -> Candidate:
    for c in CANDIDATES:
        if c.name == name:
            return c
    raise ValueError(f"candidate={name!r} is not known; choose one of {', '.join(c.name for c in CANDIDATES)}")


def full_scale_verdict(candidate: Candidate) -> dict[str, Any]:
    """The planner at the recipe's own GPU count: fits (with its overhead), the peak, and whether
    the planner models every part of the candidate's policy (``exact``), and whether it recomputes
    selectively (``selective``: counted module by module, checked on one measured pair only)."""
    import bridge_recipes
    from bridge_recipes.plan.memory import SELECTIVE_MODULES, plan_memory, selective_modules

    cfg = bridge_recipes.build(candidate.recipe, overrides=list(candidate.overrides))
    gpus = bridge_recipes.recipes.registry.find(candidate.recipe).meta.gpus
    plan = plan_memory(cfg, gpus, gpu="h200")
    modules = selective_modules(cfg.model)
    return {
        "fits": plan.fits,
        "peak_gb": round(plan.peak_gb, 1),
        "capacity_gb": round(plan.gpu_memory_gb, 1),
        "exact": modules <= SELECTIVE_MODULES,
        "selective": bool(modules),
    }


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
    """The candidates' table of docs/performance.md: each candidate, its prediction and its verdict."""
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
