"""Recipe metadata: what a recipe is for and the evidence behind it.

Every exported recipe function carries ``@recipe(...)``. Its arguments must be literals: the
runner reads them from the source without importing the module (``--list`` stays fast and
never imports Megatron), and a test checks that the static and the runtime views agree.

Fields:
- task: ``pretrain`` | ``sft`` | ``peft``
- gpus, gpu: the GPU count and type the layout is written for (``h100``, ``h200``, ...)
- precision: ``bf16`` | ``fp8cs`` | ``fp8mx`` | ``fp8base`` (LoRA: the frozen base weights stored in FP8)
- layout: short layout label, e.g. ``"TP1 PP1 EP8 DP8"`` (tests check it against the config)
- status: ``measured`` (a result file in ``results/`` backs the figure), ``functional``
  (trained on a GPU at reduced scale, log committed), ``unmeasured``
- reference: the published figure the recipe is compared with:
  ``{"tokens_per_s_per_gpu": 4663.1, "source": "..."}``
- measured: ``{"tokens_per_s_per_gpu": ..., "result": "results/....yaml"}`` for ``measured``
- evidence: path of the committed log or result file behind a ``functional`` status
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TASKS = ("pretrain", "sft", "peft")
STATUSES = ("measured", "functional", "unmeasured")
PRECISIONS = ("bf16", "fp8cs", "fp8mx", "fp8base")


@dataclass(frozen=True)
class RecipeMeta:
    task: str
    gpus: int
    gpu: str
    precision: str
    layout: str
    status: str = "unmeasured"
    reference: dict[str, Any] | None = None
    measured: dict[str, Any] | None = None
    evidence: str | None = None

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"recipe task {self.task!r} is not one of {TASKS}")
        if self.status not in STATUSES:
            raise ValueError(f"recipe status {self.status!r} is not one of {STATUSES}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"recipe precision {self.precision!r} is not one of {PRECISIONS}")
        if self.status == "measured" and not (self.measured and self.measured.get("result")):
            raise ValueError("a 'measured' recipe must name its result file: measured={'result': 'results/...'}")
        if self.status == "functional" and not self.evidence:
            raise ValueError("a 'functional' recipe must name its evidence (the committed log of its run)")


def recipe(**meta: Any) -> Callable:
    """Attach :class:`RecipeMeta` to a recipe function (``fn.recipe_meta``)."""
    info = RecipeMeta(**meta)

    def wrap(fn: Callable) -> Callable:
        fn.recipe_meta = info
        return fn

    return wrap
