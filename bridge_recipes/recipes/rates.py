"""A recipe's rate on the card a run is planned for: its measured figure where it ran on that card, an
estimate on another card, nothing where the figure does not carry over.

A measured recipe has one figure, the useful (non-padding) tokens/s per GPU of its result file on the
GPU that run used (:func:`bridge_recipes.recipes.registry.measured`); a step's time is costed at the same run's
tokens/s padding included (a step reads its rows' padding too). A recipe for a smaller card is measured on a
larger GPU capped at the card's memory: its memory is the card's, its speed the GPU's. So:

- on a card of the measured GPU's type, the figure, named with the GPU, its cap and the day;
- on another card of the GPU table, an estimate: the figure times the smallest of the card's ratios to
  the measured GPU in dense BF16 tensor FLOP/s, dense FP8 tensor FLOP/s (when the run multiplies in
  FP8) and memory bandwidth (:func:`bridge_recipes.hardware.gpus.speed_ratio`: the conservative end), labelled
  as such with that basis;
- at another micro batch x sequence length (``-sl``, ``-mb``) the figure does not carry over: nothing,
  with the reason; nor on a card outside the GPU table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge_recipes.hardware.gpus import GPUS, speed_ratio
from bridge_recipes.recipes import registry


@dataclass(frozen=True)
class Rate:
    """The rate of a run on a card (None when there is none) and what it rests on, or why there is none."""

    tokens_per_s_per_gpu: float | None  # padding included: what the steps' times are costed at
    basis: str  # "measured on ...", the measured figure times the ratio, or why there is no rate
    estimate_for: str | None = None  # the card an estimate is for
    useful_share: float = 1.0  # useful tokens per token a step reads, in the measured run

    @property
    def costed(self) -> str:
        """What step times are costed at, when the figure shown leaves the padding out: ``steps costed at
        4,432.1 tokens/s per GPU, padding included``; else nothing."""
        if self.tokens_per_s_per_gpu is None or self.useful_share >= 1.0:
            return ""
        return f"steps costed at {self.tokens_per_s_per_gpu:,.1f} tokens/s per GPU, padding included"

    @property
    def estimate(self) -> bool:
        return self.estimate_for is not None

    def describe(self) -> str:
        """One clause: ``4,317.8 useful tokens/s per GPU, measured on H100 80GB HBM3, ...``,
        ``314.2 useful tokens/s per GPU, an estimate for L40S: 1,218.5 measured on ...``, or
        ``not estimated: why``."""
        if self.tokens_per_s_per_gpu is None:
            return f"not estimated: {self.basis}"
        figure = (
            f"{self.tokens_per_s_per_gpu * self.useful_share:,.1f} useful tokens/s per GPU"
            if self.useful_share < 1.0
            else f"{self.tokens_per_s_per_gpu:,.1f} tokens/s per GPU"
        )
        return (
            f"{figure}, an estimate for {self.estimate_for}: {self.basis}"
            if self.estimate
            else f"{figure}, {self.basis}"
        )


def gemms_in_fp8(cfg: Any) -> bool:
    """Whether ``cfg``'s run multiplies in FP8: an FP8 base with ``features.fp8_base.gemms=fp8``, or FP8
    mixed precision on a model that is not an FP8-stored LoRA base (which multiplies in BF16 by default)."""
    from bridge_recipes.plan.precision import effective_precision, fp8_base_gemms, fp8_frozen_base

    if fp8_frozen_base(cfg):
        return fp8_base_gemms(cfg) == "fp8"
    return bool(effective_precision(cfg)["fp8"])


def tokens_per_micro_batch(cfg: Any) -> int:
    """Micro batch x sequence length: the shape a rate is measured at."""
    return int(cfg.train.micro_batch_size * cfg.model.seq_length)


def rate_on(name: str, card: str, cfg: Any) -> Rate:
    """Recipe ``name``'s rate for ``cfg`` on ``card`` (a key of :data:`~bridge_recipes.hardware.gpus.GPUS`, or
    another card's name): see the module."""
    m = registry.measured(name)
    if m is None:
        return Rate(None, f"{name} has no measured rate (--list shows the measured recipes)")
    this = tokens_per_micro_batch(cfg)
    if this != m.tokens_per_micro_batch:
        return Rate(
            None,
            f"{name}'s rate was measured at {m.tokens_per_micro_batch:,} tokens per micro batch (micro batch x "
            f"sequence length), this run has {this:,}, and the rate does not carry over",
        )
    if card == m.gpu_type:
        return Rate(m.tokens_per_s_per_gpu, f"measured on {m.where}", useful_share=m.useful_share)
    if card not in GPUS:
        return Rate(None, f"{name} was measured on {m.gpu}, and {card} is not a card of the GPU table")
    try:
        ratio, why = speed_ratio(card, m.gpu_type, gemms_in_fp8(cfg))
    except KeyError as exc:
        return Rate(None, str(exc.args[0]))
    return Rate(
        m.tokens_per_s_per_gpu * ratio,
        f"{m.shown:,.1f} measured on {m.where}, x {ratio:.3f} ({why})",
        estimate_for=card,
        useful_share=m.useful_share,
    )


def run_rate(name: str, card: str, cfg: Any, *, world: int, recipe_gpus: int, scaled: bool) -> Rate:
    """:func:`rate_on` for a run of ``world`` GPUs (``scaled``: shrunk by ``--scale-down``): a recipe's rate
    is of its own model on its own ``recipe_gpus`` GPUs, and times no other."""
    if scaled or world != recipe_gpus:
        return Rate(
            None,
            f"the recipe's measured rate is for its own model on {recipe_gpus} GPU(s), and --scale-down or "
            "another GPU count changes what a step does",
        )
    return rate_on(name, card, cfg)
