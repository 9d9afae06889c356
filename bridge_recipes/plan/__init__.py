"""Planning a launch before it happens: per-GPU memory of a recipe.

``plan_memory(cfg, world_size)`` estimates, per pipeline stage, what the busiest rank holds:
weights, main gradients, optimizer state, saved activations and the loss's logits, plus a
framework overhead, and says whether that fits the GPU. ``plan_report`` gives the runner's
``--plan`` text and the fit verdict. Both, and the parts they add up, are gathered in
:mod:`.memory` (whose docstring states the model); formulas and their sources: ``docs/memory_plan.md``.
"""
