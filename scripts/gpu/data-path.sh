#!/usr/bin/env bash
# Runs on the GPU machine (device tool) over a copy of the tree, with the
# release binary carried in target/release/fairvgpu (built on a CPU machine).
# Usage: scripts/gpu/data-path.sh  -> prints everything; copies logs to $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
B=./target/release/fairvgpu
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{
  echo "== date: $(date -u +%FT%TZ)"
  echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "== demo --executor cuda"; RUST_LOG=warn $B demo --executor cuda; echo "rc=$?"
  echo "== bench overhead --executor cuda"; RUST_LOG=warn $B bench overhead --executor cuda; echo "rc=$?"
  echo "== bench ring"; $B bench ring --iters 200000; echo "rc=$?"
  echo "== bench ring throughput"; $B bench ring --mode throughput --iters 2000; echo "rc=$?"
} 2>&1 | tee "$OUT/data-path.log"
# Same bench with the guest and the worker pinned (two pairs of CPUs, in one call).
{
  echo "== cpu topology"; lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA node)" ; cat /sys/devices/system/cpu/cpu2/topology/thread_siblings_list 2>/dev/null
  echo "== bench overhead --executor cuda --pin 2,3"; RUST_LOG=warn $B bench overhead --executor cuda --pin 2,3; echo "rc=$?"
  echo "== bench overhead --executor cuda --pin 2,10"; RUST_LOG=warn $B bench overhead --executor cuda --pin 2,10; echo "rc=$?"
} 2>&1 | tee -a "$OUT/data-path.log"
