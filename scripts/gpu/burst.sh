#!/usr/bin/env bash
# On the GPU machine: scripts/gpu/burst.cu (short bursts of GPU work after
# CPU pauses) natively and through the stand-in of each build in BUILDS
# (directories with `fairvgpu` and `libcuda.so`; default $R), alternated
# twice, with the CPU time the daemon's workers spent during each run.
# usage: [BUILDS=".carry/a .carry/b"] R=.carry/release bash scripts/gpu/burst.sh
set -uo pipefail
. scripts/gpu/lib.sh
header
W=/tmp/burst; rm -rf $W; mkdir -p $W
nvcc -O2 -o $W/burst scripts/gpu/burst.cu || exit 1
# CPU seconds (user + system) the running workers have spent so far.
workers_cpu() {
  local t=0
  for p in $(pgrep -f "fairvgpu worker"); do
    t=$((t + $(awk '{ print $14 + $15 }' /proc/$p/stat 2>/dev/null || echo 0)))
  done
  awk -v t=$t -v hz=$(getconf CLK_TCK) 'BEGIN { printf "%.2f", t / hz }'
}
for k in 1 2; do
  echo "== native, run $k"; LD_LIBRARY_PATH=$NV $W/burst
  for b in ${BUILDS:-$R}; do
    R=$b; tag=$(basename $b); mkdir -p $W/$tag/lib; cp $R/libcuda.so $W/$tag/lib/libcuda.so.1
    daemon_start $W/$tag 8000
    c0=$(workers_cpu); t0=$(date +%s.%N)
    echo "== through the stand-in ($tag), run $k"; LD_LIBRARY_PATH=$W/$tag/lib $W/burst
    echo "   workers' CPU: $(awk -v a=$c0 -v b=$(workers_cpu) 'BEGIN { print b - a }') s" \
      "in $(awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN { printf "%.2f", b - a }') s"
    daemon_stop
    grep -aE 'WARN|ERROR' $W/$tag/logs/daemon.log | head -5
  done
done
