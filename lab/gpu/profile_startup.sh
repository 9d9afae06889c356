#!/usr/bin/env bash
# Where a training process's start-up time goes (H200 host; source .gpu-bundle/b/env.sh and
# lab/gpu/host_env.sh first). Runs the 35B-A3B H200 SFT policy scaled to one GPU twice:
#   1. under py-spy (all processes sampled at 20 Hz; speedscope profile in $OUT);
#   2. again through the launcher with no recompute (warm kernel caches, the runner's re-exec),
#      as the second policy of the pair.
# Every log line carries the wall-clock time, to split start-up into imports, set-up, first step.
set -uo pipefail
out=${OUT:-.}
budget=${BUDGET_S:-590}
R=qwen35_35b_a3b_sft_8gpu_h200_bf16_config
A=(--scale-down 4 --scale-experts 32 -gb 4 --max-steps 10 --lr 3e-4 --min-lr 3e-5 --warmup-iters 1
   checkpoint.save=null checkpoint.load=null checkpoint.async_save=false)
stamp() { while IFS= read -r l; do printf '[%(%T)T] %s\n' -1 "$l"; done; }
python3 -c "import time; time.sleep(3)" & sleep 1
if py-spy dump --pid $! >/dev/null 2>&1; then spy=(py-spy record --subprocesses --rate 20 --format speedscope
  -o "$out/startup.speedscope.json" --); else echo "py-spy cannot attach here: running unprofiled"; spy=(); fi
wait
echo "[$(date +%T)] profiled run starts"
"${spy[@]}" python3 -m torch.distributed.run --nproc-per-node 1 --master-port 29512 scripts/run_recipe.py \
  --recipe $R "${A[@]}" 2>&1 | stamp > "$out/profiled.log"
echo "[$(date +%T)] profiled run ended: $(grep -c 'lm loss' "$out/profiled.log") steps logged"
grep -E "iteration +[0-9]+/" "$out/profiled.log" | sed -E 's/.*(iteration +[0-9]+).*per iteration \(ms\): ([0-9.]+).*lm loss: ([0-9.E+-]+).*/\1 \2 ms loss \3/'
timeout $((budget - SECONDS)) python3 -m bridge_recipes.bench.runs --name no_recompute --log "$out/second.log" \
  --recipe $R -- "${A[@]}" model.recompute_granularity=null model.recompute_method=null model.recompute_num_layers=null
echo "[$(date +%T)] kernel caches: $(du -sh /tmp/jit 2>/dev/null | cut -f1)"
