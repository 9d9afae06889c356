"""Find recipes by exported function name, reading ``@recipe(...)`` from the source.

Nothing is imported to list recipes: each module under ``bridge_recipes`` and
``perf_recipes`` is parsed with :mod:`ast`, and the literal arguments of its ``@recipe``
decorators give the table; a benchmark twin's ``@benchmark_of(real.<recipe>, ...)`` takes the
metadata of the recipe it names (found earlier in the scan) as :func:`bridge_recipes.recipes.recipe.twin_meta`
does at run time. Only :func:`load` imports the one module a recipe lives in.

Qwen3.6 and Qwen3.8 names: their checkpoints share the Qwen3.5 architecture, so every ``qwen35_...``
recipe whose size has a Qwen3.6 (Qwen3.8) checkpoint in the catalog (``bridge_recipes.models.qwen35``)
is also listed as ``qwen36_...`` (``qwen38_...``): an alias of the one definition, whose config records
that checkpoint (:func:`bridge_recipes.models.qwen35.use_checkpoint_family`) and saves to its own
``experiments/qwen36_...`` (``qwen38_...``) folder.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, wraps
from pathlib import Path

from bridge_recipes.models.qwen35 import SPECS, Checkpoint
from bridge_recipes.recipes.recipe import STATUSES, RecipeMeta, own_run_folder, twin_meta

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # bridge_recipes/
TREES = {"bridge_recipes": PACKAGE_ROOT, "perf_recipes": PACKAGE_ROOT.parent / "perf_recipes"}
SKIP_DIRS = {"runner", "models", "__pycache__"}


class UnknownRecipe(LookupError):
    """A recipe name that matches nothing; carries the closest names."""

    def __init__(self, name: str, suggestions: list[str]):
        self.name, self.suggestions = name, suggestions
        hint = f" Did you mean: {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"no recipe named {name!r}.{hint} ('--list' shows them all)")


@dataclass(frozen=True)
class RecipeEntry:
    name: str
    module: str
    tree: str  # bridge_recipes (real data) | perf_recipes (mock-data benchmark)
    meta: RecipeMeta
    summary: str
    path: Path
    line: int
    family: str = "qwen3.5"  # the checkpoint family the config records: qwen3.5 | qwen3.6
    alias_of: str | None = None  # a qwen36_ alias: the name of the recipe it builds

    @property
    def model(self) -> str | None:
        """The catalog model the recipe trains (the longest spec name its definition starts with)."""
        base = self.alias_of or self.name
        found = [m for m in SPECS if base.startswith(m + "_")]
        return max(found, key=len) if found else None

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The Hugging Face checkpoint the recipe is for (None when the catalog has no such model)."""
        model = self.model
        return SPECS[model].checkpoints.get(self.family) if model else None


def literal_assignments(module: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` assignments (usable inside ``@recipe(...)``)."""
    out = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


class _Substitute(ast.NodeTransformer):
    def __init__(self, constants: dict[str, object]):
        self.constants = constants

    def visit_Name(self, node: ast.Name):
        return ast.Constant(self.constants[node.id]) if node.id in self.constants else node


def _decorator_name(dec: ast.expr) -> str | None:
    return getattr(dec.func, "id", getattr(dec.func, "attr", None)) if isinstance(dec, ast.Call) else None


def _recipe_meta(
    fn: ast.FunctionDef, path: Path, constants: dict[str, object], known: dict[str, RecipeEntry]
) -> RecipeMeta | None:
    """The metadata of ``fn``'s ``@recipe`` or ``@benchmark_of`` decorator (None without one)."""
    for dec in fn.decorator_list:
        kind = _decorator_name(dec)
        if kind not in ("recipe", "benchmark_of"):
            continue
        try:
            sub = _Substitute(constants)
            kwargs = {kw.arg: ast.literal_eval(sub.visit(kw.value)) for kw in dec.keywords}
        except ValueError as exc:
            raise ValueError(
                f"{path}:{fn.lineno}: @{kind} arguments of {fn.name} must be literals or module-level "
                f"literal constants ({exc})"
            ) from None
        if kind == "recipe":
            return RecipeMeta(**kwargs)
        real = getattr(dec.args[0], "attr", getattr(dec.args[0], "id", None)) if dec.args else None
        if real not in known:
            raise ValueError(
                f"{path}:{fn.lineno}: @benchmark_of of {fn.name} must name a real-data recipe function "
                f"(real.<name>_config), got {ast.unparse(dec.args[0]) if dec.args else 'nothing'}"
            )
        return twin_meta(known[real].meta, real, **kwargs)
    return None


def _module_name(tree: str, root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    return ".".join((tree, *rel.parts))


def scan_file(tree: str, root: Path, path: Path, known: dict[str, RecipeEntry] | None = None) -> list[RecipeEntry]:
    """The recipes defined in ``path``; ``known`` holds the recipes a benchmark twin may name."""
    module = ast.parse(path.read_text(), filename=str(path))
    constants = literal_assignments(module)
    out = []
    for node in module.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        meta = _recipe_meta(node, path, constants, known or {})
        if meta is None:
            continue
        doc = (ast.get_docstring(node) or "").strip().splitlines()
        out.append(
            RecipeEntry(
                node.name, _module_name(tree, root, path), tree, meta, doc[0] if doc else "", path, node.lineno
            )
        )
    return out


@lru_cache(maxsize=1)
def discover() -> dict[str, RecipeEntry]:
    """All recipes by name (the real-data tree first: benchmark twins name its recipes). Two recipes with
    one name are an error: lookups must be unambiguous."""
    found: dict[str, RecipeEntry] = {}
    for tree, root in TREES.items():
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            if SKIP_DIRS.intersection(path.relative_to(root).parts):
                continue
            for entry in scan_file(tree, root, path, found):
                if entry.name in found:
                    other = found[entry.name]
                    raise ValueError(f"recipe name {entry.name!r} is defined twice: {other.module} and {entry.module}")
                found[entry.name] = entry
    return found


QWEN35_PREFIX = "qwen35_"
# The later releases of the architecture, each listed under its own names: the catalog's key of a size's
# checkpoint of that release (Qwen35Spec.checkpoints) and the prefix its aliases take for ``qwen35_``.
ALIAS_FAMILIES = {"qwen3.6": "qwen36_", "qwen3.8": "qwen38_"}


def release_name(family: str) -> str:
    """A checkpoint family as Qwen names the release: ``qwen3.8`` -> ``Qwen3.8``."""
    return "Qwen" + family.removeprefix("qwen")


@lru_cache(maxsize=1)
def aliases() -> dict[str, RecipeEntry]:
    """The ``qwen36_`` / ``qwen38_`` name of each recipe whose model has that release's checkpoint in the
    catalog."""
    out = {}
    for entry in discover().values():
        if not entry.name.startswith(QWEN35_PREFIX) or entry.model is None:
            continue
        for family, prefix in ALIAS_FAMILIES.items():
            if family in SPECS[entry.model].checkpoints:
                name = prefix + entry.name.removeprefix(QWEN35_PREFIX)
                out[name] = replace(entry, name=name, family=family, alias_of=entry.name)
    return out


def entries() -> dict[str, RecipeEntry]:
    """Every name ``--list`` shows and :func:`find` resolves: the recipes and their Qwen3.6 / Qwen3.8
    aliases."""
    return {**discover(), **aliases()}


def find(name: str) -> RecipeEntry:
    recipes = entries()
    if name in recipes:
        return recipes[name]
    raise UnknownRecipe(name, difflib.get_close_matches(name, recipes, n=3, cutoff=0.6))


def load(name: str) -> Callable:
    """Import the recipe's module and return the function (for an alias: one that builds the
    recipe, records the alias's checkpoint family and gives it its own run folder)."""
    entry = find(name)
    fn = getattr(importlib.import_module(entry.module), entry.alias_of or entry.name)
    if entry.alias_of is None:
        return fn

    @wraps(fn)
    def build_for_family():
        from bridge_recipes.models.qwen35 import use_checkpoint_family

        cfg = fn()
        use_checkpoint_family(cfg, entry.model, entry.family)
        own_run_folder(cfg, entry.name.removesuffix("_config"))  # not its twin's: a run of one never resumes the other
        cfg.name_recipe(entry.name, entry.meta)
        return cfg

    return build_for_family


def matches(entry: RecipeEntry, terms: list[str]) -> bool:
    """Every term (case-insensitive) appears in the name, tree, task, GPU, precision or family, or is the
    status word (the PEFT recipes' scheme, LoRA, counts as part of their task; a GPU's class names the
    other cards it serves and its memory, e.g. ``rtx6000ada`` and ``48gb`` for an L40S recipe)."""
    from bridge_recipes.hardware.gpus import class_names

    m = entry.meta
    task = f"{m.task} lora" if m.task == "peft" else m.task
    try:
        gpus = class_names(m.gpu)
    except KeyError:
        gpus = (m.gpu,)
    hay = " ".join([entry.name, entry.tree, task, *gpus, m.precision, f"{m.gpus}gpu", entry.family]).lower()
    return all(t.lower() == m.status or (t.lower() not in STATUSES and t.lower() in hay) for t in terms)


# Each measured recipe's one figure: its result file's useful (non-padding) tokens/s per GPU, with the
# tokens/s per GPU padding included that step times are costed at, the GPU that run used as it recorded
# it, the memory cap it was held to (when one was applied) and the day, with the tokens per micro batch
# it ran and its status (``measured``, or ``changed since measured`` when its
# fingerprint is no longer its result's); generated from its result file by the lab's report (the product
# reads no evidence). --list, --plan, the dry run, the README and the performance page read it.
MEASURED_FIGURES = Path(__file__).with_name("measured_figures.json")


@lru_cache(maxsize=1)
def _measured_figures() -> dict[str, dict]:
    try:
        return json.loads(MEASURED_FIGURES.read_text())
    except (OSError, ValueError):
        return {}


@dataclass(frozen=True)
class Measured:
    """A recipe's measured figure and where it was measured (one entry of :data:`MEASURED_FIGURES`)."""

    tokens_per_s_per_gpu: float  # padding included: what a step of rows costs, whatever their padding
    useful_tokens_per_s_per_gpu: float | None  # the non-padding tokens of those rows: the figure shown
    gpu: str  # the GPU the run used, as its result records it: "H100 80GB HBM3"
    gpu_type: str  # that GPU as a key of the GPU table: "H100"
    memory_cap_gb: float | None  # the memory the run was capped at, GB of 1e9 bytes; None: the GPU's own
    date: str  # the day it was measured, YYYY-MM-DD
    tokens_per_micro_batch: int  # micro batch x sequence length the rate was measured at

    @classmethod
    def of(cls, record: dict) -> Measured:
        return cls(**{k: record.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]

    @property
    def where(self) -> str:
        """``H100 80GB HBM3, capped at 47.7 GB, 2026-12-05``: the GPU, the cap and the day."""
        cap = f", capped at {self.memory_cap_gb:.1f} GB" if self.memory_cap_gb else ""
        return f"{self.gpu}{cap}, {self.date}"

    @property
    def shown(self) -> float:
        """The figure shown: useful (non-padding) tokens/s per GPU where the result has them."""
        return self.useful_tokens_per_s_per_gpu or self.tokens_per_s_per_gpu

    @property
    def figure(self) -> str:
        """:attr:`shown` with its unit."""
        useful = "useful " if self.useful_tokens_per_s_per_gpu is not None else ""
        return f"{self.shown:,.1f} {useful}tokens/s per GPU"

    @property
    def useful_share(self) -> float:
        """Useful tokens per token the run's steps read (1.0 when the result does not say)."""
        return self.shown / self.tokens_per_s_per_gpu

    @property
    def listed(self) -> str:
        """The figure as --list shows it, its unit in the table's footer: the rate and where it was measured."""
        return f"{self.shown:,.1f} on {self.where}"


def measured(name: str) -> Measured | None:
    """Recipe ``name``'s measured figure (an alias: its recipe's), or None when it has none."""
    entry = entries().get(name)
    record = _measured_figures().get(entry.alias_of or name if entry else name)
    if not record or record.get("tokens_per_s_per_gpu") is None or "gpu_type" not in record:
        return None
    return Measured.of(record)


def _figure(d: dict | None) -> str:
    if not d or d.get("tokens_per_s_per_gpu") is None:
        return "-"
    return f"{d['tokens_per_s_per_gpu']:,.1f}"


def _measured(entry: RecipeEntry) -> str:
    if entry.meta.status != "measured" or (m := measured(entry.name)) is None:
        return "-"
    return m.listed


def status(entry: RecipeEntry) -> str:
    """The status ``--list`` shows: the metadata's, or for a measured recipe whose config or features changed
    since its result was measured, :data:`~bridge_recipes.recipes.recipe.CHANGED_SINCE_MEASURED`."""
    if entry.meta.status != "measured":
        return entry.meta.status
    return _measured_figures().get(entry.alias_of or entry.name, {}).get("status", entry.meta.status)


def measured_rate(name: str) -> float | None:
    """Recipe ``name``'s measured tokens/s per GPU (padding included), on the GPU :func:`measured` names,
    or None when it has none."""
    m = measured(name)
    return m.tokens_per_s_per_gpu if m else None


def table(entries: list[RecipeEntry]) -> str:
    """The --list table: one row a recipe."""
    header = ("recipe", "tree", "task", "GPUs", "GPU", "prec", "layout", "status", "measured", "published")
    rows = [
        (
            e.name,
            "perf" if e.tree == "perf_recipes" else "bridge",
            e.meta.task,
            str(e.meta.gpus),
            e.meta.gpu,
            e.meta.precision,
            e.meta.layout,
            status(e),
            _measured(e),
            _figure(e.meta.reference),
        )
        for e in entries
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    lines.append(
        f"{len(rows)} recipe(s); 'measured': useful tokens/s per GPU on the GPU the run used, its "
        "memory cap and the day (docs/performance.md; --plan gives the rate for your card, an estimate on "
        "another one); 'published': tokens/s/GPU"
    )
    return "\n".join(lines)
