#!/usr/bin/env bash
# Runs on the GPU machine (device tool) over a copy of the tree, with the
# release binary carried in target/release/fairvgpu (built on a CPU machine).
# Usage: scripts/gpu/slicing.sh  -> prints everything; copies logs to $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
B=./target/release/fairvgpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{
  echo "== date: $(date -u +%FT%TZ)"
  echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  for i in 1 2; do
    echo "== bench slicing --executor cuda --seconds 4 (run $i)"
    RUST_LOG=warn timeout 200 $B bench slicing --executor cuda --seconds 4; echo "rc=$?"
  done
} 2>&1 | tee "$OUT/slicing.log"
