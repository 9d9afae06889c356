"""What a recipe returns: Megatron-Bridge's ``ConfigContainer`` with the run's features and the recipe's
metadata, one object.

:class:`RecipeConfig` is a ``ConfigContainer`` (``pretrain(cfg, forward_step)`` takes it as it is) with
one more section, ``features`` (:class:`bridge_recipes.features.Features`), which the YAML of a config
file, ``--show-yaml``, the overrides and the fingerprint see like any other, and the recipe it was built
from with its metadata (:attr:`RecipeConfig.recipe`, :attr:`RecipeConfig.meta`; not part of the YAML: the
config file's ``# recipe:`` line names it).

Importing this module imports Megatron-Bridge.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from megatron.bridge.training.config import ConfigContainer

from bridge_recipes.features import Features


@dataclass(kw_only=True)
class RecipeConfig(ConfigContainer):
    """A recipe's run: the ConfigContainer, its run-time ``features``, and the recipe it came from."""

    features: Features = field(default_factory=Features)
    _recipe: str | None = field(default=None, init=False, repr=False)
    _meta: Any = field(default=None, init=False, repr=False)
    _save_interval: Any = field(default=None, init=False, repr=False)

    @property
    def recipe(self) -> str | None:
        """The name of the recipe this run was built from (None when it is not known)."""
        return self._recipe

    @property
    def meta(self) -> Any:
        """The recipe's :class:`bridge_recipes.recipes.recipe.RecipeMeta` (None when it is not known)."""
        return self._meta

    def name_recipe(self, name: str, meta: Any) -> None:
        """Record the recipe this run was built from and its metadata."""
        self._recipe, self._meta = name, meta

    @property
    def derived_save_interval(self) -> Any:
        """How ``checkpoint.save_interval`` was set from the run's length and expected time
        (:class:`bridge_recipes.config.save_interval.Derived`), or None when it was not (given, or the recipe's)."""
        return self._save_interval

    def log_non_default_values(self) -> None:
        """Megatron-Bridge's list of every value that differs from Megatron-Core's defaults (about a
        thousand lines before the first step): with ``--verbose`` only; the run's summary says what runs."""
        from bridge_recipes.utils import quiet

        if quiet.verbose():
            super().log_non_default_values()

    def record_save_interval(self, derived: Any) -> None:
        """Record how the save interval was set from the run
        (:func:`bridge_recipes.config.save_interval.follow_run`)."""
        self._save_interval = derived


def promote(cfg: Any, features: Features | None) -> RecipeConfig:
    """``cfg`` as a :class:`RecipeConfig` with ``features`` (None: its own): itself when it is one, else a
    RecipeConfig holding the same sections (the same objects). A plain ConfigContainer holds no features,
    so they are given, never the dataclass defaults (a config file's come from its recipe)."""
    if isinstance(cfg, RecipeConfig):
        if features is not None:
            cfg.features = features
        return cfg
    if features is None:
        raise ValueError("a plain ConfigContainer holds no features: give the run's (its recipe's)")
    out = RecipeConfig.__new__(RecipeConfig)
    for f in fields(ConfigContainer):
        setattr(out, f.name, getattr(cfg, f.name))
    out.features = features
    out._recipe = out._meta = out._save_interval = None
    return out
