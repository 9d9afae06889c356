"""The recipe runner's logic (scripts/run_recipe.py is a thin entry point over it).

Importing this package imports neither torch nor Megatron: discovery and listing stay fast;
the heavy imports happen only when a recipe is built or run.
"""
