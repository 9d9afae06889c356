"""The measuring side of the benchmark harness, testable without a GPU.

- :mod:`~bridge_recipes.models.flops`: training FLOPs per token of the Qwen3.5 architecture
  (gated attention, Gated DeltaNet, MoE, LM head, MTP), and OpenRecipes' ``6 x N``;
- :mod:`~bridge_recipes.logs.stats`: window statistics over per-step records (tokens/s/GPU,
  TFLOP/s/GPU, MFU, step-time CV, peak memory), with the GPU peaks of :mod:`bridge_recipes.hardware.gpus`;
- :mod:`~bridge_recipes.logs.megatron_log`: the parser of Megatron's training log (iteration,
  memory and timer lines) into step records;
- :mod:`~bridge_recipes.bench.result`: the result file, a YAML in the shape of an OpenRecipes
  recipe (layout, workload, stack, result), and reading it back.
"""
