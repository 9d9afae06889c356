# Source on the H200 host after staging the bundles (`source scripts/gpu/host_env.sh`).
# - Kernel caches (Triton kernels and autotuning results, TorchInductor graphs) live in
#   /tmp/jit, shared by every training process of the lease; a cache tarball carried as
#   .jit/jit.tar (from a previous lease's $OUT) is unpacked there first.
# - Wheels carried in .whl/ (e.g. qwen-vl-utils, py-spy) are installed into /tmp/site.
# - `save_jit` writes the caches to $OUT/jit.tar so the next lease can carry them.
export TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor TRITON_CACHE_AUTOTUNING=1
mkdir -p /tmp/jit
if [ -f .jit/jit.tar ] && [ ! -f /tmp/jit/.restored ]; then
  tar -xf .jit/jit.tar -C /tmp/jit && touch /tmp/jit/.restored && echo "kernel caches restored: $(du -sh /tmp/jit | cut -f1)"
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PATH=/tmp/site/bin:$PATH
fi
save_jit() { tar -cf "${OUT:-.}/jit.tar" -C /tmp/jit triton inductor && ls -la "${OUT:-.}/jit.tar"; }
