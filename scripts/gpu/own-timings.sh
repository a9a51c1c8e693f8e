#!/usr/bin/env bash
# On the GPU machine: the timings cuda-samples programs print of their own
# GPU phases (event-timed kernels, "GPU time", simpleHyperQ's measured
# time), natively and through the stand-in, twice each, natively again at
# the end. PAIRS: "BUILD:MODE ..." (default .carry/release:all), each a
# directory with `fairvgpu` and `libcuda.so` and the daemon's
# `graph_launches` to run it with; PROGS: the programs (built from
# .carry/upstream.tar.xz as upstream.sh does, kept in .samples).
# usage: [PAIRS=".carry/a:all .carry/b:all"] [PROGS="stereoDisparity ..."] bash scripts/gpu/own-timings.sh
set -uo pipefail
. scripts/gpu/lib.sh
samples_build || exit 1
header
W=/tmp/own-timings; rm -rf $W; mkdir -p $W
PROGS=${PROGS:-stereoDisparity sortingNetworks jacobiCudaGraphs simpleHyperQ fastWalshTransform}
timing() { grep -a -i -E 'time|throughput' "$1" | grep -a -E '[0-9]' | grep -a -v -i 'cudaDeviceSynchronize' | head -4 | tr '\n' ';' | cut -c1-300; }
run_all() { # label, env...
  local label=$1; shift
  for p in $PROGS; do
    d=.samples/bin/$p; [ -d $d ] || { echo "$p: not built"; continue; }
    for k in 1 2; do
      ( cd $d && env "$@" timeout 120 ./$p > $W/out.txt 2>&1 ); rc=$?
      echo "[$label] $p run $k rc=$rc: $(timing $W/out.txt)"
    done
  done
}
run_all native LD_LIBRARY_PATH=$NV
for pair in ${PAIRS:-.carry/release:all}; do
  R=${pair%%:*}; mode=${pair##*:}; tag=$(basename $R)-$mode
  mkdir -p $W/$tag/lib; cp $R/libcuda.so $W/$tag/lib/libcuda.so.1
  DAEMON_KEYS="graph_launches = \"$mode\"" daemon_start $W/$tag 40000
  run_all "$tag" FAIRVGPU_SOCKET=$FAIRVGPU_SOCKET LD_LIBRARY_PATH=$W/$tag/lib
  daemon_stop
  grep -aE 'WARN|ERROR' $W/$tag/logs/daemon.log | head -5
done
run_all native LD_LIBRARY_PATH=$NV
