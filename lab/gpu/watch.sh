#!/usr/bin/env bash
# Run a command under watch: GPU utilization and memory every 15 s, Python stacks of every process
# on the GPU (py-spy, carried in .whl/) every STACK_EVERY seconds, and the command and its children
# ended after LIMIT seconds (exit 124). Output goes to $OUT/NAME.{out,gpu.csv,stacks.txt,native.txt}.
#
#   NAME=run LIMIT=540 STACK_EVERY=120 bash lab/gpu/watch.sh CMD...
set -uo pipefail
name=${NAME:-run} limit=${LIMIT:-540} every=${STACK_EVERY:-120}
out=${OUT:-.}
mkdir -p "$out"
rm -f "$out/$name.stopped"
smi=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 15 >"$out/$name.gpu.csv" 2>&1 &
  smi=$!
fi
setsid "$@" >"$out/$name.out" 2>&1 &
cmd=$!
start=$SECONDS
next=$every
while kill -0 $cmd 2>/dev/null; do
  sleep 5
  elapsed=$((SECONDS - start))
  if [ $elapsed -ge "$next" ] || [ $elapsed -ge "$limit" ]; then
    next=$((next + every))
    for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null || pgrep -g $cmd); do
      { echo "=== ${elapsed}s pid $pid"; timeout 60 py-spy dump --pid "$pid" 2>&1; } >>"$out/$name.stacks.txt"
      { echo "=== ${elapsed}s pid $pid (native)"; timeout 90 py-spy dump --native --pid "$pid" 2>&1 | head -150; } >>"$out/$name.native.txt"
    done
  fi
  if [ $elapsed -ge "$limit" ]; then
    echo "watch.sh: $name ended after ${limit}s" >>"$out/$name.out"
    : >"$out/$name.stopped"
    kill -TERM -- -$cmd 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 $cmd 2>/dev/null || break; sleep 1; done
    kill -KILL -- -$cmd 2>/dev/null
    break
  fi
done
wait $cmd; rc=$?
[ -f "$out/$name.stopped" ] && rc=124
[ -n "$smi" ] && kill $smi 2>/dev/null
echo "watch.sh: $name rc $rc after $((SECONDS - start))s"
exit $rc
