#!/usr/bin/env bash
# Runs on a machine with two GPUs (device tool, kind nvidia-h200-x2) over a
# copy of the tree, with the release binary carried in
# target/release/fairvgpu (built on a CPU machine).
# Usage: scripts/gpu/migrate.sh  -> prints everything; copies logs to $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
B=./target/release/fairvgpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{
  echo "== date: $(date -u +%FT%TZ)"
  echo "== devices"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  nvidia-smi topo -m 2>/dev/null | head -5
  echo "== demo --executor cuda (VMM allocations, handle tables)"; RUST_LOG=warn timeout 120 $B demo --executor cuda; echo "rc=$?"
  echo "== bench migrate --executor cuda --gib 1,8"
  RUST_LOG=warn timeout 400 $B bench migrate --executor cuda --gib 1,8; echo "rc=$?"
  echo "== bench recovery --executor cuda"
  RUST_LOG=warn timeout 120 $B bench recovery --executor cuda; echo "rc=$?"
  echo "== bench overhead --executor cuda --scale 0.2 (does the handle table cost anything?)"
  RUST_LOG=warn timeout 200 $B bench overhead --executor cuda --scale 0.2; echo "rc=$?"
  echo "== GPU memory after"; nvidia-smi --query-gpu=index,memory.used --format=csv
} 2>&1 | tee "$OUT/migrate.log"
