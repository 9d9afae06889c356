#!/usr/bin/env bash
# One-GPU proxy comparison of a tuned H200 policy against the reference layout it was tuned
# from (H200 host; source .gpu-bundle/b/env.sh and lab/gpu/host_env.sh first). Both runs
# share the proxy shape (4 layers, the per-GPU expert count, 8 micro batches per step, steps
# 5..19 measured) and run back to back; the ratio lands in $OUT/<model>_ratio.json.
#   bash lab/gpu/proxy_layouts.sh 35b   # EP8 policy vs slime's TP2 PP2 CP2 EP4 layout (slime-35b-h100)
#   bash lab/gpu/proxy_layouts.sh 27b   # PP4 block-12 policy vs slime's TP4 PP2 layout (openrecipes-27b-h200)
# About 7 minutes each with cold kernel caches: one model per 10-minute command.
set -uo pipefail
out=${OUT:-.}
case "${1:-}" in
  35b) tuned=qwen35_35b_a3b_sft_8gpu_h200_bf16_config; reference=qwen35_35b_a3b_sft_8gpu_h100_bf16_config ;;
  27b) tuned=qwen35_27b_sft_8gpu_h200_bf16_config; reference=qwen35_27b_sft_8gpu_h200_bf16_slime_reference_config ;;
  *) echo "usage: $0 35b|27b" >&2; exit 2 ;;
esac
python3 scripts/benchmark.py --proxy-layers 4 --recipe "$tuned" --against "$reference" --out "$out/$1.yaml"
