"""Compare two loss curves the way Megatron-Bridge's ``validate_convergence`` does.

Thresholds (Megatron-Bridge's pipeline defaults, bridge-convergence in docs/sources.md):
Pearson correlation >= 0.95; point-wise relative tolerance of 10% where the reference loss is
above 2, 5% between 0.5 and 2, 2% below 0.5, with at most 10% of points failing; final-loss
difference <= 3% (relative); the first 20% of steps are skipped (warm-up noise). OpenRecipes
reports correlation, final-loss difference and point-wise failures over 20 steps of a
candidate layout against a reference layout on the same rows; :func:`compare` returns all
three with the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

MIN_CORRELATION = 0.95
MAX_FINAL_DIFF = 0.03
MAX_FAILING_FRACTION = 0.10
SKIP_FIRST_FRACTION = 0.20


def pointwise_tolerance(reference_loss: float) -> float:
    if reference_loss > 2.0:
        return 0.10
    if reference_loss >= 0.5:
        return 0.05
    return 0.02


OVERFLOW_SAFE = 1e100  # below this, products and squares of a few thousand values stay finite


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    # a series near the float range is scaled by its largest magnitude first (the correlation does not
    # change; their squares would overflow); ordinary losses are left as they are, bit for bit
    a, b = (_scaled(list(x)) for x in (a, b))
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    if va == 0 or vb == 0:
        return 1.0 if va == vb and all(x == y for x, y in zip(a, b)) else 0.0
    return cov / math.sqrt(va * vb)


def _scaled(values: list[float]) -> list[float]:
    top = max((abs(v) for v in values), default=0.0)
    return [v / top for v in values] if top > OVERFLOW_SAFE else values


@dataclass(frozen=True)
class Comparison:
    steps: list[int]
    correlation: float
    final_loss_difference: float  # relative: |cand - ref| / |ref| at the last common step
    pointwise_failures: int
    points_checked: int
    passed: bool
    reasons: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def diverged(reference: Mapping[int, float], candidate: Mapping[int, float]) -> list[str]:
    """A reason per curve whose loss is not finite (inf or nan) at a step both curves log: that run
    diverged, so the curves disagree (:func:`compare` measures finite curves only)."""
    common = sorted(set(reference) & set(candidate))
    reasons = []
    for name, curve in (("reference", reference), ("candidate", candidate)):
        if bad := [s for s in common if not math.isfinite(curve[s])]:
            reasons.append(
                f"{name} loss is {curve[bad[0]]} at step {bad[0]} ({len(bad)} step(s) not finite): it diverged"
            )
    return reasons


def compare(
    reference: Mapping[int, float],
    candidate: Mapping[int, float],
    *,
    skip_first_fraction: float = SKIP_FIRST_FRACTION,
    min_correlation: float = MIN_CORRELATION,
    max_final_diff: float = MAX_FINAL_DIFF,
    max_failing_fraction: float = MAX_FAILING_FRACTION,
) -> Comparison:
    """``reference`` and ``candidate`` map step -> loss; only the steps both have are compared."""
    common = sorted(set(reference) & set(candidate))
    if len(common) < 3:
        raise ValueError(f"need at least 3 common steps to compare loss curves, got {len(common)}")
    for name, curve in (("reference", reference), ("candidate", candidate)):
        bad = [s for s in common if not math.isfinite(curve[s])]
        if bad:
            raise ValueError(f"{name} loss is not finite at steps {bad}")
    kept = common[int(len(common) * skip_first_fraction) :]
    ref = [reference[s] for s in kept]
    cand = [candidate[s] for s in kept]
    corr = pearson(ref, cand)
    failures = sum(abs(c - r) > pointwise_tolerance(r) * abs(r) for r, c in zip(ref, cand))
    final = abs(cand[-1] - ref[-1]) / abs(ref[-1]) if ref[-1] else abs(cand[-1])
    reasons = []
    if not corr >= min_correlation:  # nan included
        reasons.append(f"correlation {corr:.4f} < {min_correlation}")
    if failures > max_failing_fraction * len(kept):
        reasons.append(f"{failures} of {len(kept)} points outside the point-wise tolerance")
    if final > max_final_diff:
        reasons.append(f"final loss differs by {final:.2%} > {max_final_diff:.0%}")
    return Comparison(kept, corr, final, failures, len(kept), not reasons, reasons)
