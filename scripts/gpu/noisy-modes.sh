#!/usr/bin/env bash
# On the GPU machine: fairness on a noisy host (CPU hogs beside the guests
# and workers) with graph_launches "runs" and "all" alternated: is the "all"
# mode's lower MMR on some machines the host's noise? Carried:
# target/release/fairvgpu.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HOGS=${HOGS:-12}
{
  echo "== date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "== $HOGS busy-loop processes on $(nproc) CPUs"
  pids=""
  for i in $(seq $HOGS); do sh -c 'while :; do :; done' & pids="$pids $!"; done
  for round in 1 2; do
    for g in runs all; do
      echo "== noisy host, round $round: --graph-launches $g"
      RUST_LOG=warn ./target/release/fairvgpu bench fairness --executor cuda --seconds 10 --graph-launches $g 2>&1 | grep -v "^none "
      echo "rc=$?"
    done
  done
  kill $pids; wait $pids 2>/dev/null
} 2>&1 | tee "$OUT/noisy-modes.log"
