"""Use a recipe from Python: build it, change fields, hand it to Megatron-Bridge.

torchrun --nproc-per-node 8 examples/python_api.py
"""

from bridge_recipes.qwen.h200.qwen35 import qwen35_35b_a3b_sft_8gpu_h200_bf16_config
from bridge_recipes.runner import checks, launch

cfg = qwen35_35b_a3b_sft_8gpu_h200_bf16_config()
cfg.train.train_iters = 200
cfg.optimizer.lr = 2e-5
cfg.checkpoint.save = cfg.checkpoint.load = "/checkpoints/qwen35_35b_a3b_sft"  # resume from where it saves

problems = checks.errors(checks.check(cfg, world_size=8))
if problems:
    raise SystemExit("\n".join(map(str, problems)))
# Export cfg.env_vars before Python starts (or launch through scripts/run_recipe.py, which
# re-executes itself with them) so Transformer Engine reads them at import.
launch.run(cfg, task="sft")
