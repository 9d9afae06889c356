"""Qwen3.5 / Qwen3.6 real-data training recipes for Megatron-Bridge.

``bridge_recipes.build(name, ...)`` builds a recipe's config by name (scale-down, dataset,
flags, overrides: see :mod:`bridge_recipes.config.builder`). Importing the package imports neither
torch nor Megatron.
"""

from bridge_recipes.config.builder import build, runner_args

__all__ = ["build", "runner_args"]
