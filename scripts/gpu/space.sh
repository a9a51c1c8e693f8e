#!/usr/bin/env bash
# On the GPU machine: four guests of 8-block kernels at weights 1:1:2:4,
# time-sliced against co-running under the daemon's MPS control daemon
# (`fairvgpu bench space --executor cuda`), twice. Carried: the release
# fairvgpu in $R (default .carry/release). Last line of each run:
#   corun_speedup=… sliced_mmr=… corun_slowest=…
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
export PATH=/usr/local/nvidia/bin:$PATH
{
  header
  for i in 1 2; do
    echo "== bench space --executor cuda --seconds 10 (run $i)"
    timeout 200 "$R/fairvgpu" bench space --executor cuda --seconds 10; echo "rc=$?"
  done
  echo "== MPS processes left (none expected)"
  pgrep -a nvidia-cuda-mps || true
} 2>&1 | tee "$OUT/space.log"
