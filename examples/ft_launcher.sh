#!/bin/bash
# Fault-tolerant launch: NVRx's ft_launcher in place of torchrun. It starts a rank monitor per
# rank (heartbeats, section timeouts computed from the run) and restarts the workload after a
# failure; the recipe resumes from the latest checkpoint in checkpoint.save (load == save).
#   bash examples/ft_launcher.sh qwen35_35b_a3b_sft_8gpu_h200_bf16_config --save-dir /ckpt/run1
# Under plain torchrun the runner turns fault tolerance off with one log line. Run from the
# repository root after `bash scripts/install.sh --gpu`: ft_launcher is the venv's (FT_LAUNCHER
# picks another).
set -euo pipefail
RECIPE=${1:?usage: ft_launcher.sh RECIPE [flags] [KEY=VALUE ...]}
shift
exec "${FT_LAUNCHER:-.venv/bin/ft_launcher}" --nproc-per-node="${GPUS_PER_NODE:-8}" --nnodes="${NNODES:-1}" \
  --max-restarts="${MAX_RESTARTS:-3}" --ft-param-initial_rank_heartbeat_timeout=1800 \
  --ft-param-rank_heartbeat_timeout=600 \
  scripts/run_recipe.py --recipe "$RECIPE" "$@"
