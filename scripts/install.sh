#!/usr/bin/env bash
# Creates .venv (Python 3.12) with the training stack and this project in editable mode.
#
#   bash scripts/install.sh [--gpu|--cpu] [--wheelhouse DIR]... [--reuse-site-packages] [--python PY] [--dry-run]
#
# The stack is installed from requirements/cpu.lock with --no-deps: megatron-bridge declares
# dependencies that cannot be built on a machine without CUDA (flashinfer, fast-hadamard-
# transform, ...) while importing only the listed ones. Transformer Engine's PyTorch
# extension is an sdist that compiles for ~8 minutes; a wheelhouse holding a prebuilt
# transformer_engine_torch wheel skips that. A shared wheelhouse folder beside the checkout is
# used by default when it exists.
# --gpu (the default when `nvidia-smi -L` lists a GPU; --cpu turns it off) also installs
# requirements/gpu.lock (the gpu extra: nvidia-resiliency-ext, TileLang, and their dependencies),
# then imports the training entry points and prints the GPU, CUDA and stack versions.
# --reuse-site-packages makes the packages PY already has (its own site-packages, also when PY
# belongs to another virtual environment) visible in .venv, so pins they satisfy are kept and only
# the rest is installed: a GPU machine with a preinstalled torch and CUDA stack and no registry
# installs from a small wheelhouse (`python -m bridge_recipes.wheelhouse` builds one; PIP_NO_INDEX=1 keeps
# pip off the network).
# --dry-run prints the commands instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."

wheelhouses=()
[ -d ../shared/wheelhouse ] && wheelhouses=(../shared/wheelhouse)
given_wheelhouse=0
reuse=0
python=""
gpu=auto
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse)
      [ $# -ge 2 ] || { echo "install.sh: --wheelhouse needs a folder" >&2; exit 2; }
      [ "$given_wheelhouse" = 1 ] || wheelhouses=()
      given_wheelhouse=1; wheelhouses+=("$2"); shift 2 ;;
    --reuse-site-packages) reuse=1; shift ;;
    --python) python="$2"; shift 2 ;;
    --gpu) gpu=1; shift ;;
    --cpu) gpu=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (known: --gpu, --cpu, --wheelhouse DIR, --reuse-site-packages, --python PY, --dry-run)" >&2; exit 2 ;;
  esac
done
if [ "$gpu" = auto ]; then
  gpu=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    gpu=1
    echo "[install] nvidia-smi lists a GPU: installing the GPU additions too (--cpu to skip them)"
  fi
fi

# run CMD...: runs it, or with --dry-run prints it
run() {
  if [ "$dry_run" = 1 ]; then echo "+ $*"; else "$@"; fi
}

find_python() {
  for cand in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  return 1
}
[ -n "$python" ] || python=$(find_python) || {
  echo "install.sh: no Python 3.12 found; megatron-bridge needs it. Pass --python /path/to/python3.12" >&2; exit 2; }

find_links=()
for wheelhouse in "${wheelhouses[@]}"; do
  [ -d "$wheelhouse" ] || { echo "install.sh: --wheelhouse '$wheelhouse' is not a folder" >&2; exit 2; }
  find_links+=(--find-links "$wheelhouse")
  echo "[install] using wheelhouse $wheelhouse"
done

echo "[install] creating .venv with $python"
run "$python" -m venv .venv
venv_site=.venv/lib/python3.12/site-packages
if [ "$reuse" = 1 ]; then
  # a .pth file puts PY's site-packages after .venv's own: what .venv installs comes first
  sites=$("$python" -c 'import site; print("\n".join(site.getsitepackages()))')
  echo "[install] reusing the packages of $python: $(echo $sites)"
  pth="$venv_site/_reused_site_packages.pth"
  if [ "$dry_run" = 1 ]; then echo "+ write $pth: $(echo $sites)"; else printf '%s\n' "$sites" >"$pth"; fi
fi
run .venv/bin/python -m pip install -q --upgrade "${find_links[@]}" "pip>=25"
echo "[install] installing requirements/cpu.lock (no dependency resolution; a few minutes)"
run .venv/bin/python -m pip install --no-deps --progress-bar off "${find_links[@]}" -r requirements/cpu.lock
if [ "$gpu" = 1 ]; then
  echo "[install] installing requirements/gpu.lock (the gpu extra: nvidia-resiliency-ext, TileLang)"
  run .venv/bin/python -m pip install --no-deps --progress-bar off "${find_links[@]}" -r requirements/gpu.lock
fi
if [ "$reuse" = 1 ]; then
  # Transformer Engine looks for the CUDA libraries (cuDNN, cuBLAS, ...) of the nvidia-* wheels only
  # under the venv's own site-packages: link in each one the reused site has and .venv lacks,
  # after pip ran, so that nothing is ever installed through a link into the other site.
  venv_nvidia=$venv_site/nvidia
  for site_dir in $sites; do
    [ -d "$site_dir/nvidia" ] || continue
    run mkdir -p "$venv_nvidia"
    for lib in "$site_dir"/nvidia/*; do
      [ -e "$venv_nvidia/$(basename "$lib")" ] || run ln -s "$lib" "$venv_nvidia/$(basename "$lib")"
    done
  done
fi
run .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
echo "[install] checking the stack imports"
run .venv/bin/python -c "import torch, transformer_engine.pytorch, megatron.core, megatron.bridge.training.config; import bridge_recipes, perf_recipes; print('[install] ok: torch', torch.__version__)"
if [ "$gpu" = 1 ]; then
  echo "[install] checking the training entry points on the GPU"
  run .venv/bin/python -c "
import importlib.metadata as md
import torch
import megatron.bridge.training.finetune, megatron.bridge.training.pretrain, megatron.bridge.training.vlm_step
import nvidia_resiliency_ext, tilelang, qwen_vl_utils
assert torch.cuda.is_available(), 'torch sees no CUDA GPU'
print('[install] gpu:', torch.cuda.get_device_name(0), 'x', torch.cuda.device_count(), '| CUDA', torch.version.cuda)
print('[install] ' + ', '.join(f'{p} {md.version(p)}' for p in ('torch', 'transformer-engine', 'megatron-core', 'megatron-bridge', 'nvidia-resiliency-ext', 'tilelang')))
"
fi
