# Source on the H200 host after staging the bundles (`source lab/gpu/host_env.sh`).
# - Kernel caches (Triton kernels and autotuning results, TorchInductor graphs) live in
#   /tmp/jit, shared by every training process of the lease.
# - Caches of an earlier lease, carried as .jit/jit.tar.xz.NN (the parts `save_jit` wrote to
#   $OUT), are unpacked there first.
# - Wheels carried in .whl/ or a folder of it (e.g. qwen-vl-utils, py-spy; the peer's parts
#   .whl/peer_a and .whl/peer_b, carried in separate commands) are installed into /tmp/site,
#   each once a lease.
# - The package is not installed on the host: the checkout (this folder) goes on PYTHONPATH,
#   for the scripts and every training process they start.
# - `save_jit` writes the caches to $OUT as xz parts of at most 15 MiB (what comes back from a
#   command is limited to 16 MiB per file, 8 files).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor TRITON_CACHE_AUTOTUNING=1
mkdir -p /tmp/jit
if compgen -G ".jit/jit.tar.xz.*" >/dev/null && [ ! -f /tmp/jit/.restored ]; then
  cat .jit/jit.tar.xz.* | tar -xJf - -C /tmp/jit && touch /tmp/jit/.restored \
    && echo "kernel caches restored: $(du -sh /tmp/jit | cut -f1)"
fi
if compgen -G ".whl/*.whl" >/dev/null || compgen -G ".whl/*/*.whl" >/dev/null; then
  # each wheel once a lease: every step of a detached queue sources this file again, and a part
  # carried by a later command adds its wheels to those installed
  mkdir -p /tmp/site/.installed
  new_wheels=()
  for w in .whl/*.whl .whl/*/*.whl; do
    [ -f "$w" ] && [ ! -f "/tmp/site/.installed/$(basename "$w")" ] && new_wheels+=("$w")
  done
  if [ ${#new_wheels[@]} -gt 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${new_wheels[@]}" && for w in "${new_wheels[@]}"; do touch "/tmp/site/.installed/$(basename "$w")"; done
  fi
  export PATH=/tmp/site/bin:$PATH
fi
save_jit() {
  tar -cf - -C /tmp/jit triton inductor | xz -T0 -3 | split -b 15m -d - "${OUT:-.}/jit.tar.xz."
  ls -la "${OUT:-.}"/jit.tar.xz.*
}
