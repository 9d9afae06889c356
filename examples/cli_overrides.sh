#!/bin/bash
# Overrides: convenience flags first, then Hydra-grammar KEY=VALUE (which win). Run from the
# repository root with the venv's interpreter (PYTHON picks another).
set -euo pipefail
"${PYTHON:-.venv/bin/python}" scripts/run_recipe.py --recipe qwen35_35b_a3b_sft_8gpu_h200_bf16_config --dry-run --world-size 16 \
  -gb 256 --max-steps 500 --lr 2e-5 \
  train.global_batch_size=512 \
  +env_vars.NCCL_DEBUG=WARN \
  model.recompute_num_layers=2
