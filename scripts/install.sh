#!/usr/bin/env bash
# Creates .venv (Python 3.12) with the CPU test stack and this project in editable mode.
#
#   bash scripts/install.sh [--wheelhouse DIR] [--python PY]
#
# The stack is installed from requirements/cpu.lock with --no-deps: megatron-bridge declares
# dependencies that cannot be built on a machine without CUDA (flashinfer, fast-hadamard-
# transform, ...) while importing only the listed ones. Transformer Engine's PyTorch
# extension is an sdist that compiles for ~8 minutes; a wheelhouse holding a prebuilt
# transformer_engine_torch wheel skips that. A shared wheelhouse folder beside the checkout is
# used by default when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."

wheelhouse=""
[ -d ../shared/wheelhouse ] && wheelhouse=../shared/wheelhouse
python=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) wheelhouse="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (known: --wheelhouse DIR, --python PY)" >&2; exit 2 ;;
  esac
done

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
if [ -n "$wheelhouse" ]; then
  [ -d "$wheelhouse" ] || { echo "install.sh: --wheelhouse '$wheelhouse' is not a folder" >&2; exit 2; }
  find_links=(--find-links "$wheelhouse")
  echo "[install] using wheelhouse $wheelhouse"
fi

echo "[install] creating .venv with $python"
"$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade "pip>=25"
echo "[install] installing requirements/cpu.lock (no dependency resolution; a few minutes)"
.venv/bin/python -m pip install --no-deps --progress-bar off "${find_links[@]}" -r requirements/cpu.lock
.venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
echo "[install] checking the stack imports"
.venv/bin/python -c "import torch, transformer_engine.pytorch, megatron.core, megatron.bridge.training.config; import bridge_recipes, perf_recipes; print('[install] ok: torch', torch.__version__)"
