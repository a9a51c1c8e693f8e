#!/usr/bin/env bash
# On the GPU machine: four guests of 8-block kernels at weights 1:1:2:4,
# time-sliced against co-running under the daemon's MPS control daemon
# (`fairvgpu bench space --executor cuda`), three of full-GPU kernels the
# same two ways, a copier and a computer with and without phase
# selection, and a co-running guest's fault. Carried: the release fairvgpu
# in $R (default .carry/release). Last line:
#   corun_speedup=… corun_mmr=… phase_speedup=… fault_recovery_ms=… sliced_mmr=… full_gpu_ratio=…
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
export PATH=/usr/local/nvidia/bin:$PATH
{
  header
  echo "== bench space --executor cuda --seconds 8"
  timeout 280 "$R/fairvgpu" bench space --executor cuda --seconds 8; echo "rc=$?"
  echo "== MPS processes left (none expected)"
  pgrep -a nvidia-cuda-mps || true
} 2>&1 | tee "$OUT/space.log"
