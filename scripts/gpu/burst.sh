#!/usr/bin/env bash
# On the GPU machine: scripts/gpu/burst.cu (short bursts of GPU work after
# CPU pauses) natively and through the stand-in ($R: `fairvgpu` and
# `libcuda.so`), alternated twice.
# usage: R=.carry/release bash scripts/gpu/burst.sh
set -uo pipefail
. scripts/gpu/lib.sh
header
W=/tmp/burst; rm -rf $W; mkdir -p $W/lib
nvcc -O2 -o $W/burst scripts/gpu/burst.cu || exit 1
cp "$R/libcuda.so" $W/lib/libcuda.so.1
daemon_start $W 8000
for k in 1 2; do
  echo "== native, run $k"; LD_LIBRARY_PATH=$NV $W/burst
  echo "== through the stand-in, run $k"; LD_LIBRARY_PATH=$W/lib $W/burst
done
daemon_stop
grep -aE 'WARN|ERROR' $W/logs/daemon.log | head -5
