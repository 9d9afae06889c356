"""Gradient parity of packed rows: a BF16 path's gradients against an FP32 reference, per part.

``compare`` measures one path's gradients against the reference's (the same weights, the row's
conversations run alone in FP32); ``summarize`` turns the per-path records of a probe
(``lab/tests/gpu/test_packed_gradient_parity.py``) into the cases of ``lab/results/packed_gradient_parity.json``;
``holds`` is the acceptance rule: the global gradient norm within ``NORM_RATIO`` of the reference's
and the gated-attention error at most ``FLOOR_FACTOR`` times the noise floor, which is the error of
the same conversations run alone in BF16.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from bridge_recipes.features.packed_attention import DEFAULT_MODE
from lab.evidence import mixer_of

PARTS = ("attention", "gdn", "mtp", "experts", "rest")
NORM_RATIO = (0.98, 1.02)
FLOOR_FACTOR = 3.0
DEFAULT_PATH = DEFAULT_MODE  # the path a run takes on the GPUs the parity test runs on
NOISE_PATH = "alone"
WORST = 12  # the parameters a record lists, largest relative error first


def part_of(name: str) -> str:
    """The part of the model a (Megatron-named) parameter belongs to."""
    if "mtp" in name:
        return "mtp"
    mixer = mixer_of(name)
    if mixer:
        return mixer
    if ".experts." in name or ".router." in name or ".shared_experts." in name:
        return "experts"
    return "rest"


def compare(grads: Mapping[str, Any], ref: Mapping[str, Any]) -> dict[str, Any]:
    """Norms and relative errors of ``grads`` against ``ref`` (tensors by parameter name).

    ``max_rel_err[part]`` is the largest ``|g - r| / |r|`` over the part's parameters;
    ``rel_err[part]`` is the part's ``|g - r| / |r|`` taken over all its parameters at once."""
    missing = sorted(set(ref) ^ set(grads))
    per_param: dict[str, float] = {}
    diff_sq = dict.fromkeys(PARTS, 0.0)
    ref_sq = dict.fromkeys(PARTS, 0.0)
    norm_sq = ref_norm_sq = 0.0
    for name, r in ref.items():
        if name not in grads:
            continue
        g = grads[name]
        d2, r2, g2 = float((g - r).pow(2).sum()), float(r.pow(2).sum()), float(g.pow(2).sum())
        part = part_of(name)
        diff_sq[part] += d2
        ref_sq[part] += r2
        norm_sq += g2
        ref_norm_sq += r2
        per_param[name] = math.sqrt(d2 / r2) if r2 > 0 else (0.0 if d2 == 0 else math.inf)
    max_rel = dict.fromkeys(PARTS, 0.0)
    for name, rel in per_param.items():
        part = part_of(name)
        if not rel <= max_rel[part]:  # NaN wins: a part with a non-finite gradient is not at any error
            max_rel[part] = rel
    present = {p for p in PARTS if ref_sq[p] > 0 or diff_sq[p] > 0}
    return {
        "grad_norm": math.sqrt(norm_sq),
        "ref_grad_norm": math.sqrt(ref_norm_sq),
        "max_rel_err": {p: max_rel[p] for p in PARTS if p in present},
        "rel_err": {p: math.sqrt(diff_sq[p] / ref_sq[p]) if ref_sq[p] else 0.0 for p in PARTS if p in present},
        "params": sorted(per_param.items(), key=lambda kv: -kv[1])[:WORST],
        "missing": missing[:WORST],
    }


def holds(case: Mapping[str, Any]) -> bool:
    lo, hi = NORM_RATIO
    ratio, err, floor = case["grad_norm_ratio"], case["max_rel_err_attention"], case["noise_floor"]
    if None in (ratio, err, floor):  # a non-finite gradient
        return False
    return lo <= ratio <= hi and err <= FLOOR_FACTOR * floor and not case.get("missing")


def _finite(x: float) -> float | None:
    """``x``, or None where it is NaN or infinite (JSON has no such numbers)."""
    return x if math.isfinite(x) else None


def _part_error(record: Mapping[str, Any], part: str) -> float | None:
    """A part's largest relative error, None where any of its gradients is not finite."""
    if not math.isfinite(record["rel_err"].get(part, 0.0)):
        return None
    return _finite(record["max_rel_err"].get(part, 0.0))


def summarize(records: Iterable[Mapping[str, Any]], default_path: str = DEFAULT_PATH) -> list[dict[str, Any]]:
    """One case per packed path of each probe case, with that case's noise floor; the result file's rows."""
    by_case: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in records:
        by_case.setdefault(r["case"], {})[r["path"]] = r
    out = []
    for name, paths in by_case.items():
        noise = paths.get(NOISE_PATH)
        if noise is None:
            continue
        for path, r in paths.items():
            if path == NOISE_PATH:
                continue
            case = {
                "name": name,
                "model": r["model"],
                "mtp": r["mtp"],
                "grouped_gemm": r["grouped_gemm"],
                "aux_loss": r.get("aux_loss", False),
                "recompute": r.get("recompute"),
                "packing": "boundaries",
                "path": path,
                "default_path": path == default_path,
                "grad_norm_ratio": _finite(r["grad_norm"] / r["ref_grad_norm"]),
                "max_rel_err_attention": _part_error(r, "attention"),
                "max_rel_err_gdn": _part_error(r, "gdn"),
                "max_rel_err_mtp": _part_error(r, "mtp"),
                "max_rel_err_experts": _part_error(r, "experts"),
                "noise_floor": _part_error(noise, "attention"),
                "noise_floor_gdn": _part_error(noise, "gdn"),
                "noise_floor_mtp": _part_error(noise, "mtp"),
                "noise_grad_norm_ratio": _finite(noise["grad_norm"] / noise["ref_grad_norm"]),
                "missing": list(r.get("missing", [])),
            }
            case["holds"] = holds(case)
            out.append(case)
    return out
