#!/usr/bin/env bash
# The one-GPU smoke run through the runner under torchrun (H200 host, stack staged as in
# the GPU notes). Writes the full log to $OUT/smoke.log (or ./smoke.log) and prints the
# loss per step at the end.
set -uo pipefail
out="${OUT:-.}"
recipe=qwen35_35b_a3b_pretrain_1gpu_h200_bf16_smoke_config
{
  echo "# command: torchrun --nproc-per-node 1 scripts/run_recipe.py --recipe $recipe $*"
  echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/# gpu: /'
  python3 -c "import torch, megatron.core, transformer_engine as te; print('# torch', torch.__version__, '| megatron-core', megatron.core.__version__, '| TE', te.__version__)" 2>/dev/null
} > "$out/smoke.log"
torchrun --nproc-per-node 1 scripts/run_recipe.py --recipe "$recipe" "$@" 2>&1 | tee -a "$out/smoke.log" | grep -E "run_recipe|iteration .*lm loss|Error|error" | tail -40
rc=${PIPESTATUS[0]}
echo "exit status: $rc" | tee -a "$out/smoke.log"
exit $rc
