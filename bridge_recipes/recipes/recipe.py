"""Recipe metadata: what a recipe is for and the evidence behind it.

Every exported recipe function carries ``@recipe(...)``. Its arguments must be literals: the
runner reads them from the source without importing the module (``--list`` stays fast and
never imports Megatron), and a test checks that the static and the runtime views agree.

Fields:
- task: ``pretrain`` | ``sft`` | ``peft``
- gpus, gpu: the GPU count and type the layout is written for (``h100``, ``h200``, ...)
- precision: ``bf16`` | ``fp8cs`` | ``fp8mx`` | ``fp8base`` (LoRA: the frozen base weights stored in FP8)
- layout: short layout label, e.g. ``"TP1 PP1 EP8 DP8"`` (tests check it against the config)
- status: ``measured`` (a result file backs the figure), ``functional`` (trained on a GPU at
  reduced scale, log committed), ``unmeasured``. A ``measured`` recipe whose fingerprint
  (:mod:`bridge_recipes.config.fingerprint`) is no longer the one its result file records is shown as
  :data:`CHANGED_SINCE_MEASURED` until a new result covers it (the lab's report finds it)
- reference: the published figure the recipe is compared with:
  ``{"tokens_per_s_per_gpu": 4663.1, "source": "..."}``
- measured: ``{"result": ID}`` for ``measured``: the id of its result file
- evidence: the id of the committed log or result file behind a ``functional`` status

An evidence id is the file's path in the measurement lab beside the package (``results/...`` or
``evidence/...``); the lab resolves and checks it, the package never opens it.

A benchmark twin (mock data, benchmark settings) carries ``@benchmark_of(real.<recipe>, ...)``
instead: its real recipe's metadata less that recipe's own evidence (:data:`TWIN_RESETS`), plus
the differences it declares as keyword literals; ``twin_of`` then names the real recipe.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

TASKS = ("pretrain", "sft", "peft")
STATUSES = ("measured", "functional", "unmeasured")
# What a measured recipe's status reads once what it builds differs from what its result measured.
CHANGED_SINCE_MEASURED = "changed since measured"
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
    twin_of: str | None = None  # a benchmark twin: the real-data recipe it measures

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


def own_run_folder(cfg: Any, name: str) -> None:
    """Give a config built by recipe ``name`` its own run folder ``experiments/<name>``: the save folder
    (and the resume folder that follows it) and the TensorBoard folder of the model-level default
    ``experiments/<model>_<task>``, which recipes of one model and task would otherwise share (and a
    run of one would resume a checkpoint of another). Folders a recipe sets elsewhere are kept."""
    experiments = os.path.join(os.getcwd(), "experiments")
    run = os.path.join(experiments, name)
    c, log = cfg.checkpoint, cfg.logger

    def default(path: str | None, leaf: str) -> bool:
        return bool(path) and os.path.basename(path) == leaf and os.path.dirname(os.path.dirname(path)) == experiments

    if default(c.save, "checkpoints"):
        if c.load == c.save:
            c.load = os.path.join(run, "checkpoints")
        c.save = os.path.join(run, "checkpoints")
    if default(log.tensorboard_dir, "tb"):
        log.tensorboard_dir = os.path.join(run, "tb")


# What a benchmark twin does not take from its real recipe: the evidence behind that recipe's status
# (the twin is unmeasured until a run of its own is declared).
TWIN_RESETS: dict[str, Any] = {"status": "unmeasured", "measured": None, "evidence": None}


def twin_meta(real: RecipeMeta, real_name: str, **declared: Any) -> RecipeMeta:
    """A benchmark twin's metadata: ``real``'s with :data:`TWIN_RESETS` and the ``declared`` differences."""
    return replace(real, **{**TWIN_RESETS, **declared, "twin_of": real_name})


def _attach(info: RecipeMeta) -> Callable:
    def wrap(fn: Callable) -> Callable:
        name = fn.__name__.removesuffix("_config")

        @functools.wraps(fn)
        def build(*args: Any, **kwargs: Any) -> Any:
            cfg = fn(*args, **kwargs)
            own_run_folder(cfg, name)
            cfg.name_recipe(fn.__name__, info)  # a RecipeConfig (bridge_recipes.recipes.base builds every recipe's)
            return cfg

        build.recipe_meta = info
        return build

    return wrap


def recipe(**meta: Any) -> Callable:
    """Attach :class:`RecipeMeta` to a recipe function (``fn.recipe_meta``); the runs it builds
    (:class:`bridge_recipes.recipe_config.RecipeConfig`) name the recipe and its metadata and get the
    recipe's own run folder (:func:`own_run_folder`)."""
    return _attach(RecipeMeta(**meta))


def benchmark_of(real: Callable, **declared: Any) -> Callable:
    """:func:`recipe` for a benchmark twin of the recipe function ``real`` (:func:`twin_meta`)."""
    return _attach(twin_meta(real.recipe_meta, real.__name__, **declared))
