#!/usr/bin/env bash
# Creates .venv (Python 3.12) with the training stack and this project in editable mode.
#
#   bash scripts/install.sh [--gpu|--cpu|--light] [--wheelhouse DIR]... [--reuse-site-packages] [--python PY] [--dry-run]
#
# --light installs only what building and inspecting SFT rows and listing the recipes need
# (requirements/light.txt at cpu.lock's pins): nothing is compiled, and no training stack.
#
# The stack is installed from requirements/cpu.lock with --no-deps: megatron-bridge declares
# dependencies that cannot be built on a machine without CUDA (flashinfer, fast-hadamard-
# transform, ...) while importing only the listed ones. Transformer Engine's PyTorch extension
# (transformer_engine_torch) is published as source only: it is taken from a wheelhouse when one
# holds it, otherwise compiled against the venv's torch (about 10 to 25 minutes on 2 cores; needs a CUDA
# toolkit's nvcc and a C++ compiler, the CUDA_HOME it uses is printed). A shared wheelhouse folder
# beside the checkout is used by default when it exists.
# --gpu (the default when `nvidia-smi -L` lists a GPU; --cpu turns it off) also installs
# requirements/gpu.lock (the gpu extra: nvidia-resiliency-ext, TileLang, and their dependencies),
# then imports the training entry points and prints the GPU, CUDA and stack versions.
# --reuse-site-packages makes the packages PY already has (its own site-packages, also when PY
# belongs to another virtual environment) visible in .venv, so pins they satisfy are kept and only
# the rest is installed: a GPU machine with a preinstalled torch and CUDA stack and no registry
# installs from a small wheelhouse (`python -m bridge_recipes.hardware.wheelhouse` builds one; PIP_NO_INDEX=1 keeps
# pip off the network).
# --dry-run prints the commands instead of running them.
# A failed step leaves .venv as far as it got; running the same command again resumes (pip keeps
# what is installed), `rm -rf .venv` starts over.
set -euo pipefail
cd "$(dirname "$0")/.."

wheelhouses=()
[ -d ../shared/wheelhouse ] && wheelhouses=(../shared/wheelhouse)
given_wheelhouse=0
reuse=0
python=""
gpu=auto
light=0
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
    --light) light=1; gpu=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (known: --gpu, --cpu, --light, --wheelhouse DIR, --reuse-site-packages, --python PY, --dry-run)" >&2; exit 2 ;;
  esac
done
if [ "$gpu" = auto ] && [ "$light" = 0 ]; then
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

# where the install is, for the progress lines and the message on failure
started=$SECONDS
n_steps=$((light ? 3 : gpu ? 6 : 4))
step_no=0
step_name="checking the options"
step() {
  step_no=$((step_no + 1)); step_name="$1"
  echo "[install] step $step_no/$n_steps: $1 ($((SECONDS - started)) s so far)"
}
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] || [ "$dry_run" = 1 ] || [ "$step_no" = 0 ] && return
  echo "[install] FAILED at step $step_no/$n_steps ($step_name) after $((SECONDS - started)) s, exit $rc." >&2
  echo "[install] .venv keeps what was installed so far: fix the cause above and run the same command" >&2
  echo "[install] again to resume (installed pins are not fetched again), or 'rm -rf .venv' to start over." >&2
}
trap on_exit EXIT

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

step "creating .venv with $python"
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

if [ "$light" = 1 ]; then
  light_lock=.venv/install/light.lock
  step "installing requirements/light.txt at requirements/cpu.lock's pins (no training stack)"
  run mkdir -p .venv/install
  if [ "$dry_run" = 1 ]; then
    echo "+ write $light_lock: the cpu.lock pins of the names in requirements/light.txt"
  else
    names=$(grep -vE '^\s*(#|$)' requirements/light.txt | tr 'A-Z_' 'a-z-')
    : >"$light_lock"
    for name in $names; do
      pin=$(grep -iE "^${name//-/[-_.]}==" requirements/cpu.lock || true)
      [ -n "$pin" ] || { echo "install.sh: requirements/light.txt names $name, which requirements/cpu.lock does not pin" >&2; exit 1; }
      echo "$pin" >>"$light_lock"
    done
  fi
  run .venv/bin/python -m pip install --no-deps --progress-bar off "${find_links[@]}" -r "$light_lock"
  step "installing this project (editable) and checking the data tools import"
  run .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  run .venv/bin/python -c "import bridge_recipes.data.sft_rows, bridge_recipes.data.inspect_rows, bridge_recipes.runner.cli, transformers; print('[install] ok: light (rows, inspection, --list); bash scripts/install.sh adds the training stack')"
  [ "$dry_run" = 1 ] || echo "[install] done in $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s; .venv is $(du -sh .venv | cut -f1)"
  exit 0
fi

# Transformer Engine's PyTorch extension builds against the venv's torch (no build isolation, which
# would fetch another torch), so it comes after the rest of the lock.
te_pin=$(grep -iE '^transformer[-_]engine[-_]torch==' requirements/cpu.lock || true)
stack_lock=.venv/install/cpu-stack.lock
step "installing requirements/cpu.lock except ${te_pin:-transformer_engine_torch} (no dependency resolution; a few minutes)"
run mkdir -p .venv/install
if [ "$dry_run" = 1 ]; then
  echo "+ write $stack_lock: requirements/cpu.lock without ${te_pin:-transformer_engine_torch}"
else
  grep -viE '^transformer[-_]engine[-_]torch==' requirements/cpu.lock >"$stack_lock"
fi
run .venv/bin/python -m pip install --no-deps --progress-bar off "${find_links[@]}" -r "$stack_lock"
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

# cuda_home: a CUDA toolkit root with bin/nvcc and include/cuda_runtime.h (CUDA_HOME, CUDA_PATH,
# the folder of the nvcc on PATH, /usr/local/cuda); nvcc on PATH may be a wrapper script, so its
# folder's parent is checked like the others rather than trusted
cuda_home() {
  local nvcc cand
  nvcc=$(command -v nvcc 2>/dev/null || true)
  for cand in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "${nvcc:+$(dirname "$(dirname "$(readlink -f "$nvcc")")")}" /usr/local/cuda; do
    [ -n "$cand" ] && [ -x "$cand/bin/nvcc" ] && [ -f "$cand/include/cuda_runtime.h" ] && { echo "$cand"; return 0; }
  done
  return 1
}

step "Transformer Engine's PyTorch extension (${te_pin:-not pinned})"
if [ -z "$te_pin" ]; then
  echo "[install] requirements/cpu.lock pins no transformer_engine_torch: nothing to build"
elif [ "$dry_run" = 1 ]; then
  echo "+ .venv/bin/python -m pip install -q --no-deps --only-binary :all: ${find_links[*]} $te_pin"
  echo "[install] (when no prebuilt wheel is found, it compiles with CUDA_HOME=$(cuda_home || echo '<none found>'):)"
  echo "+ CUDA_HOME=... CPATH=<venv nvidia/*/include> .venv/bin/python -m pip install --no-deps --no-build-isolation ${find_links[*]} $te_pin"
elif .venv/bin/python -m pip install -q --no-deps --only-binary :all: "${find_links[@]}" "$te_pin" 2>/dev/null; then
  echo "[install] $te_pin installed from a prebuilt wheel"
else
  home=$(cuda_home) || home=""
  if [ -z "$home" ]; then
    echo "install.sh: compiling $te_pin needs a CUDA toolkit (bin/nvcc and include/cuda_runtime.h), and none" >&2
    echo "  was found in CUDA_HOME, CUDA_PATH, the nvcc on PATH or /usr/local/cuda. Install the CUDA 13 toolkit" >&2
    echo "  and set CUDA_HOME to its folder, or pass --wheelhouse DIR with a prebuilt $te_pin wheel." >&2
    exit 2
  fi
  command -v "${CXX:-g++}" >/dev/null 2>&1 || {
    echo "install.sh: compiling $te_pin needs a C++ compiler (${CXX:-g++}); install one (Debian: apt-get install g++)" >&2
    exit 2; }
  # the headers torch's CUDA build includes (nccl.h, cudnn.h, cusparseLt.h, ...) ship in the
  # venv's nvidia/* wheels, not in every CUDA toolkit
  cpath=$(ls -d "$PWD/$venv_site"/nvidia/*/include 2>/dev/null | paste -sd: || true)
  log=.venv/install/transformer_engine_torch.log
  echo "[install] compiling $te_pin from source with CUDA_HOME=${home:-?}; one compiler job per core, $(nproc 2>/dev/null || echo '?') here"
  echo "[install] compiler output: $log"
  compile_started=$SECONDS
  # one compiler job per core (ninja's and Transformer Engine's build read MAX_JOBS)
  MAX_JOBS=${MAX_JOBS:-$(nproc 2>/dev/null || echo 2)} \
  CUDA_HOME=$home CPATH="$cpath${CPATH:+:$CPATH}" .venv/bin/python -m pip install -v --no-deps --no-build-isolation \
    --progress-bar off "${find_links[@]}" "$te_pin" >"$log" 2>&1 &
  pid=$!
  next_note=60
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - compile_started)) -ge "$next_note" ] && kill -0 "$pid" 2>/dev/null; then
      echo "[install] still compiling: $((next_note / 60)) min so far"
      next_note=$((next_note + 60))
    fi
  done
  if ! wait "$pid"; then
    echo "[install] the compile failed; the end of $log:" >&2
    tail -n 25 "$log" >&2
    exit 1
  fi
  took=$((SECONDS - compile_started))
  echo "[install] compiled $te_pin in $((took / 60)) min $((took % 60)) s"
fi

if [ "$gpu" = 1 ]; then
  step "installing requirements/gpu.lock (the gpu extra: nvidia-resiliency-ext, TileLang)"
  run .venv/bin/python -m pip install --no-deps --progress-bar off "${find_links[@]}" -r requirements/gpu.lock
fi
step "installing this project (editable) and checking the stack imports"
run .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
run .venv/bin/python -c "import torch, transformer_engine.pytorch, megatron.core, megatron.bridge.training.config; import bridge_recipes, perf_recipes; print('[install] ok: torch', torch.__version__)"
if [ "$gpu" = 1 ]; then
  step "checking the training entry points on the GPU"
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
[ "$dry_run" = 1 ] || echo "[install] done in $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s; .venv is $(du -sh .venv | cut -f1)"
