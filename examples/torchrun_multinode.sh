#!/bin/bash
# The same recipe under plain torchrun on N nodes (run this on every node, from the repository
# root, after `bash scripts/install.sh`; PYTHON picks another interpreter than the venv's):
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=host0 bash examples/torchrun_multinode.sh RECIPE [KEY=VALUE ...]
set -euo pipefail
RECIPE=${1:?usage: torchrun_multinode.sh RECIPE [flags] [KEY=VALUE ...]}
shift
exec "${PYTHON:-.venv/bin/python}" -m torch.distributed.run \
  --nnodes="${NNODES:?}" --node-rank="${NODE_RANK:?}" --nproc-per-node="${GPUS_PER_NODE:-8}" \
  --master-addr="${MASTER_ADDR:?}" --master-port="${MASTER_PORT:-29500}" \
  scripts/run_recipe.py --recipe "$RECIPE" "$@"
