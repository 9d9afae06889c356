"""Use a recipe from Python: build it by name, change fields, hand it to Megatron-Bridge.

torchrun --nproc-per-node 8 examples/python_api.py
"""

import bridge_recipes
from bridge_recipes.runner import checks, launch

checkpoints = "/checkpoints/qwen35_35b_a3b_sft"
cfg = bridge_recipes.build(
    "qwen35_35b_a3b_sft_8gpu_h200_bf16_config",
    flags={
        "max_steps": 200,
        "lr": 2e-5,
        "save_dir": checkpoints,
        "load_dir": checkpoints,
    },  # resume from where it saves
)
cfg.logger.log_interval = 10  # any field can be set on the built config

problems = checks.errors(checks.check(cfg, world_size=8))
if problems:
    raise SystemExit("\n".join(map(str, problems)))
# Export cfg.env_vars before Python starts (or launch through scripts/run_recipe.py, which
# re-executes itself with them) so Transformer Engine reads them at import.
launch.run(cfg, task="sft")
