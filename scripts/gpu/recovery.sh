#!/usr/bin/env bash
# Runs on the GPU machine (device tool) over a copy of the tree, with the
# release binary carried in target/release/fairvgpu (built on a CPU machine).
# Usage: scripts/gpu/recovery.sh  -> prints everything; copies logs to $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
B=./target/release/fairvgpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{
  echo "== date: $(date -u +%FT%TZ)"
  echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  echo "== one process, two contexts: does a fault in one break the other?"
  nvcc -o /tmp/poison_probe scripts/gpu/poison_probe.c -lcuda -L/usr/local/nvidia/lib64 && /tmp/poison_probe; echo "rc=$?"
  echo "== bench recovery --executor cuda (workers confined by the seccomp sandbox)"
  RUST_LOG=warn $B bench recovery --executor cuda; echo "rc=$?"
  echo "== again, to see the spread"
  RUST_LOG=warn $B bench recovery --executor cuda; echo "rc=$?"
  echo "== GPU memory after (no stray allocations)"; nvidia-smi --query-gpu=memory.used --format=csv
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} 2>&1 | tee "$OUT/recovery.log"
