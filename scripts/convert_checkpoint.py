#!/usr/bin/env python3
"""Convert Qwen3.5/3.6 checkpoints between Hugging Face folders and Megatron checkpoints:

    python scripts/convert_checkpoint.py import --hf /models/Qwen3.6-35B-A3B \\
        --recipe qwen36_35b_a3b_sft_8gpu_h200_bf16_config --out /ckpt/qwen36_35b_a3b_mcore
    python scripts/convert_checkpoint.py export --megatron /runs/sft/checkpoints \\
        --hf-template /models/Qwen3.6-35B-A3B --recipe qwen36_35b_a3b_sft_8gpu_h200_bf16_config --out /models/sft-hf

--recipe takes every name run_recipe.py takes (``qwen36_`` and ``qwen38_`` names included). The HF config is
checked against the recipe's model first (a mismatch exits 2 naming the
field); ``--scaled`` compares only the family fields, for toy or scaled-down checkpoints.
Conversions need a GPU (Megatron-Bridge builds the Megatron model with Transformer Engine).
The logic lives in bridge_recipes.hf (importable and tested).
"""

from __future__ import annotations

import sys

from bridge_recipes.hf.cli import main
from bridge_recipes.utils import quiet
from bridge_recipes.utils.outputs import exit_on_termination

if __name__ == "__main__":
    quiet.install()  # other libraries' start-up notices (shown with --verbose)
    exit_on_termination()  # a kill removes the staging folder beside --out
    sys.exit(main())
