#!/usr/bin/env bash
# Run a queue of GPU-host commands detached, so a sequence longer than one 10-minute command
# keeps the GPU busy between commands, and collect what it wrote from later commands.
#
#   bash lab/gpu/detached.sh start QUEUE [QUEUE...]
#                                              # each non-empty, non-# line of the QUEUEs is one
#                                              # step, run in order with OUT=$DETACHED_DIR/out
#   bash lab/gpu/detached.sh wait [SECS]   # wait until the queue is done or SECS pass (540),
#                                              # then pack its outputs into $OUT (see below)
#
# Each step runs in bash from the repository root after $DETACHED_SETUP (the host's stack and
# kernel caches); a failing step is logged with its exit status and the next one runs. Status
# lines ("<UTC time> start|rc N: <step>") go to $DETACHED_DIR/status.log, each step's output to
# $DETACHED_DIR/out/step_NN.out. `wait` writes $OUT/detached.tgz (status log and out/, less the
# kernel-cache parts) and copies the jit.tar.xz.NN parts of `save_jit` beside it: a command
# returns at most 8 files. Outputs live outside the working tree, which the host refreshes at the
# start of every command.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
dir=${DETACHED_DIR:-/tmp/detached}
setup=${DETACHED_SETUP-"source .gpu-bundle/b/env.sh && source lab/gpu/host_env.sh"}

run_queue() {  # run_queue QUEUE: the detached worker
  local n=0 line rc
  while IFS= read -r line || [ -n "$line" ]; do
    [[ -z "${line// }" || "$line" =~ ^[[:space:]]*# ]] && continue
    n=$((n + 1))
    echo "$(date -u +%FT%TZ) start: $line" >>"$dir/status.log"
    (eval "$setup" && export OUT="$dir/out" && eval "$line") >"$dir/out/$(printf 'step_%02d.out' "$n")" 2>&1
    rc=$?
    echo "$(date -u +%FT%TZ) rc $rc: $line" >>"$dir/status.log"
  done <"$1"
  touch "$dir/done"
}

case "${1:-}" in
  start)
    shift
    [ $# -ge 1 ] || { echo "usage: detached.sh start QUEUE [QUEUE...]" >&2; exit 2; }
    for queue in "$@"; do
      [ -f "$queue" ] || { echo "detached.sh: no queue file $queue" >&2; exit 2; }
    done
    if [ -f "$dir/status.log" ] && [ ! -f "$dir/done" ]; then
      echo "detached.sh: a queue is still running in $dir (status.log has no done marker)" >&2; exit 2
    fi
    rm -rf "$dir" && mkdir -p "$dir/out" && : >"$dir/status.log"  # running from now
    for queue in "$@"; do cat "$queue"; echo; done >"$dir/queue"  # a queue without a final newline ends its line
    setsid nohup bash lab/gpu/detached.sh _run "$dir/queue" >"$dir/worker.log" 2>&1 </dev/null &
    echo "detached.sh: queue of $(grep -cv '^[[:space:]]*\(#\|$\)' "$dir/queue") step(s) started in $dir"
    ;;
  _run) run_queue "$2" ;;
  wait)
    [ -d "$dir" ] || { echo "detached.sh: nothing started in $dir" >&2; exit 2; }
    end=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt "$end" ] && [ ! -f "$dir/done" ]; do sleep 5; done
    out=${OUT:-.}
    mkdir -p "$out"
    tar czf "$out/detached.tgz" --exclude='jit.tar.xz.*' -C "$dir" status.log out
    if compgen -G "$dir/out/jit.tar.xz.*" >/dev/null; then cp "$dir"/out/jit.tar.xz.* "$out/"; fi
    cat "$dir/status.log"
    if [ -f "$dir/done" ]; then echo "detached.sh: done"; else echo "detached.sh: still running"; fi
    ;;
  *) echo "usage: detached.sh start QUEUE [QUEUE...] | wait [SECONDS]" >&2; exit 2 ;;
esac
