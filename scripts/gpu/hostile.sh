#!/usr/bin/env bash
# Runs on the GPU machine (device tool) over a copy of the tree, with the
# release binaries built on a CPU machine in $R (default .carry/release:
# fairvgpu, libcuda.so; the bench needs only fairvgpu, its good guests attach
# natively). Usage: R=.carry/release scripts/gpu/hostile.sh [SECONDS]
# One VM under every kind of guest abuse at once, the guests of two other
# VMs checked and timed, against a baseline phase of the same length
# (`fairvgpu bench hostile --executor cuda`). Prints the raw output; copies
# it and the daemon's logs to $OUT.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
S=${1:-60}
{
  header
  echo "== bench hostile --executor cuda --seconds $S"
  "$R/fairvgpu" bench hostile --executor cuda --seconds "$S" --log "$OUT/hostile-daemon-1.log"; echo "rc=$?"
  echo "== again, to see the spread"
  "$R/fairvgpu" bench hostile --executor cuda --seconds "$S" --log "$OUT/hostile-daemon-2.log"; echo "rc=$?"
  echo "== GPU memory after (no stray allocations)"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} 2>&1 | tee "$OUT/hostile.log"
