"""The command line of scripts/run_recipe.py: argparse, messages, layout checks, re-exec, launch.

The library underneath (bridge_recipes.build, registry, overrides, datasets, layout) never
imports this package. Importing it imports neither torch nor Megatron: discovery and listing
stay fast; the heavy imports happen only when a recipe is built or run.
"""
