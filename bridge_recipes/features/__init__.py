"""The project's run-time features, each one module: a typed ``Config``, its checks, its one install
step and its upstream patch contract, side by side.

A run is what its recipe returns (``bridge_recipes.recipe_config.RecipeConfig``): Megatron-Bridge's
``ConfigContainer`` with a ``features`` section, :class:`Features`, one field per feature:

- ``packed_attention``: attention over rows with conversation boundaries (:mod:`.packed_attention`);
- ``chunked_loss``: the output layer and cross entropy a chunk of tokens at a time (:mod:`.chunked_loss`);
- ``fp8_base``: the GEMM precision of a LoRA base stored in FP8 (:mod:`.fp8_base`);
- ``gdn_warmup``: the Gated DeltaNet kernels compiled at model build (:mod:`.gdn_warmup`);
- ``te_wgrad``: Transformer Engine's GEMM in place of APEX's fused weight gradient (:mod:`.te_wgrad`);
- ``random_lora``: benchmark only, LoRA on random base weights (:mod:`.random_lora`).

The summary, the config file, ``--show-yaml``, the overrides (``features.chunked_loss.enabled=true``) and
the fingerprint all read this section; no environment variable switches a feature. :func:`problems`
refuses what cannot run (a value outside its choices, a feature on a GPU that lacks it, an environment
variable a key replaced), :func:`launch_changes` makes and names the changes a launch must make before
it prints what runs, and :func:`apply` installs, in the training process, the patches the run asks for.

Importing this package imports neither torch nor Megatron.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge_recipes.features import chunked_loss, fp8_base, gdn_warmup, packed_attention, random_lora, te_wgrad
from bridge_recipes.patches import dataset_helpers, warmup_rng
from bridge_recipes.patches.contract import Patch, check

FEATURES = "features"  # the run's section of the features: features.FEATURE.FIELD


@dataclass
class Features:
    """The run-time features of a run, one config per feature module."""

    packed_attention: packed_attention.Config = field(default_factory=packed_attention.Config)
    chunked_loss: chunked_loss.Config = field(default_factory=chunked_loss.Config)
    fp8_base: fp8_base.Config = field(default_factory=fp8_base.Config)
    gdn_warmup: gdn_warmup.Config = field(default_factory=gdn_warmup.Config)
    te_wgrad: te_wgrad.Config = field(default_factory=te_wgrad.Config)
    random_lora: random_lora.Config = field(default_factory=random_lora.Config)


# The config classes a saved config file may name (Megatron's instantiation allow-list).
CLASSES = tuple(
    f"{cls.__module__}.{cls.__qualname__}"
    for cls in (
        Features,
        packed_attention.Config,
        chunked_loss.Config,
        fp8_base.Config,
        gdn_warmup.Config,
        te_wgrad.Config,
        random_lora.Config,
    )
)

# The patches of the features.
PATCHES: tuple[Patch, ...] = (
    te_wgrad.PATCH,
    packed_attention.PATCH,
    chunked_loss.PATCH,
    gdn_warmup.PATCH,
    fp8_base.PATCH,
    random_lora.PATCH,
)
# Every patch a launch may install, in the order apply() installs them.
AT_LAUNCH: tuple[Patch, ...] = (
    te_wgrad.PATCH,
    dataset_helpers.PATCH,
    warmup_rng.PATCH,
    packed_attention.PATCH,
    chunked_loss.PATCH,
    gdn_warmup.PATCH,
    fp8_base.PATCH,
    random_lora.PATCH,
)

# Environment variables that once switched a feature, and the config key that does it now: a run that
# still sets one is refused with the key.
REPLACED_ENV: dict[str, str] = dict(m.REPLACES_ENV for m in (packed_attention, chunked_loss, fp8_base, gdn_warmup))


def replaced_env_problems(env_vars: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """One message per environment variable of :data:`REPLACED_ENV` that the recipe's ``env_vars`` or the
    process's environment (``environ``, ``os.environ`` when None) still sets, naming the key that replaced it."""
    process = os.environ if environ is None else environ
    out = []
    for name, key in REPLACED_ENV.items():
        if name in (env_vars or {}):
            out.append(
                f"env_vars.{name} no longer switches anything: set {key}=... instead (and drop env_vars.{name})"
            )
        if name in process:
            out.append(f"${name} no longer switches anything: unset it and set {key}=... on the command line")
    return out


# The settings that take one of a few values, each with its module's check of a value.
CHOICES: dict[str, Callable[[Any], str | None]] = {
    packed_attention.KEY: packed_attention.mode_problem,
    fp8_base.KEY: fp8_base.gemms_problem,
}
# How a message names the values a field's type takes.
_TAKES = {bool: "true or false", str: "a string", int: "an integer", float: "a number"}


def setting_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be the setting ``key`` (``features.FEATURE.FIELD``, a field of :class:`Features`):
    null, a type its field's annotation does not take (a number stands for a string, as an override reads
    it), or a value outside its :data:`CHOICES`; with the fix. None when it can be."""
    _, feature, name = key.split(".")
    config = type(getattr(Features(), feature))
    kind, default = typing.get_type_hints(config)[name], getattr(config(), name)
    shown = str(default).lower() if isinstance(default, bool) else default
    if isinstance(value, int | float) and not isinstance(value, bool) and kind is str:
        value = str(value)
    if check := CHOICES.get(key):
        return check(value)
    if not isinstance(kind, type):
        return None  # an annotation this check cannot read: the override's own type check answers
    if value is None or not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        given, takes = "null" if value is None else repr(value), _TAKES.get(kind, kind.__name__)
        fix = f"{key}=true or {key}=false" if kind is bool else f"{key} to {takes}"
        return f"{key}={given} is not {takes}; set {fix} (default {shown})"
    return None


def setting_problems(section: Any) -> list[str]:
    """:func:`setting_problem` of every field of a built run's ``features`` section."""
    out = []
    for feature in dataclasses.fields(Features):
        config = getattr(section, feature.name, None)
        for f in dataclasses.fields(config) if dataclasses.is_dataclass(config) else ():
            key = f"{FEATURES}.{feature.name}.{f.name}"
            if problem := setting_problem(key, getattr(config, f.name)):
                out.append(problem)
    return out


def problems(cfg: Any, capability: tuple[int, int] | None = None, gpu: str | None = None) -> list[str]:
    """Why the features ``cfg`` asks for cannot run on a GPU of ``capability`` (``gpu``: its name for the
    messages; None: no GPU known, the GPU checks are skipped), each naming the key and the choices: first a
    setting of the wrong type or outside its choices (:func:`setting_problems`), then what each feature
    refuses of the run."""
    f = cfg.features
    env = replaced_env_problems(getattr(cfg, "env_vars", None))
    if bad := setting_problems(f):
        return [*env, *bad]
    return [
        *env,
        *packed_attention.problems(f.packed_attention, capability, gpu),
        *chunked_loss.problems(cfg),
        *fp8_base.problems(cfg, capability, gpu),
    ]


def summary(cfg: Any) -> list[str]:
    """The summary's lines of what the features make of the run: packed attention and the loss (and the
    warm-up where switched on; random base weights are the run summary's ``weights``)."""
    f, m = cfg.features, cfg.model
    if f.chunked_loss.enabled:
        loss = f"a chunk of {chunked_loss.chunk_tokens(m.vocab_size or 0)} tokens at a time ({chunked_loss.KEY}=true)"
    else:
        kernel = f"{m.cross_entropy_fusion_impl} fused cross entropy" if m.cross_entropy_loss_fusion else "unfused"
        loss = f"the whole logits, {kernel} ({chunked_loss.KEY}=false)"
    lines = [f"packed attention  {packed_attention.describe(cfg)}", f"loss              {loss}"]
    if f.gdn_warmup.enabled:
        lines.append(f"warm-up           Gated DeltaNet kernels at model build ({gdn_warmup.KEY}=true)")
    return lines


def launch_changes(cfg: Any) -> list[str]:
    """The changes a launch makes to ``cfg`` on this machine, made now, before it prints what runs: the
    stand-in checkpoint folder of LoRA on random weights and gradient-accumulation fusion where APEX's
    kernel and its stand-in are both missing; one line per change."""
    return [line for line in (random_lora.launch_change(cfg), te_wgrad.launch_change(cfg)) if line]


def wanted(cfg: Any) -> list[Patch]:
    """The patches a run of ``cfg`` installs at launch, in their order."""
    return [p for p in AT_LAUNCH if p.wanted(cfg)]


def patch_problems(cfg: Any, *, dry_run: bool = False) -> list[str]:
    """Why a patch the run needs cannot be trusted on the installed upstream: a version outside its range
    or a symbol gone or changed (each names the patch, the package and both versions)."""
    from bridge_recipes.patches import flex_check
    from bridge_recipes.patches.contract import problems as contract_problems

    needed = wanted(cfg)
    if dry_run and flex_check.wanted(cfg):
        needed.append(flex_check.PATCH)
    return [msg for patch in needed for msg in contract_problems(patch)]


def apply(cfg: Any) -> list[str]:
    """Install, in the training process, the patches a run of ``cfg`` asks for (idempotent); the lines
    the runner logs. Raises :class:`~bridge_recipes.patches.contract.PatchError` before installing anything
    when one cannot be trusted."""
    needed = wanted(cfg)
    for patch in needed:
        check(patch)
    lines = []
    for patch in needed:
        if patch.install is not None and (line := patch.install(cfg)) is not None:
            lines.append(line)
    return lines
