"""Reading what training runs wrote: Megatron's training log, run logs and window statistics.

Below both the planner (:mod:`bridge_recipes.plan`) and the benchmarks (:mod:`bridge_recipes.bench`),
which read the same logs; it imports neither.
"""
