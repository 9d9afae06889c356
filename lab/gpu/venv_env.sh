# Source on a GPU host where `scripts/install.sh` built .venv (instead of staging the bundles and
# sourcing .gpu-bundle/b/env.sh): the venv's interpreter first on PATH, NVLink multicast off
# (it must stay off on these hosts), unbuffered output for the logs.
source .venv/bin/activate
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
