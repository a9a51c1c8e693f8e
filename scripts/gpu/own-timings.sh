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
R=${R:-.carry/release}
U=/tmp/fvg-upstream
if [ ! -d .samples/bin ]; then
  rm -rf "$U" .samples; mkdir -p "$U"
  tar xJf .carry/upstream.tar.xz -C "$U" || exit 1
  python3 scripts/gpu/build_upstream.py "$U" .samples > $OUT/build.log 2>&1
  tail -1 $OUT/build.log
fi
header
W=/tmp/gl33; rm -rf $W; mkdir -p $W/lib
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
  mkdir -p $W/lib-$tag $W/run-$tag; cp $R/libcuda.so $W/lib-$tag/libcuda.so.1
  cat > $W/host-$tag.toml <<TOML
[daemon]
run_dir = "$W/run-$tag"
executor = "cuda"
graph_launches = "$mode"
[[vm]]
name = "vm1"
tenant = "t"
memory_limit_mib = 40000
TOML
  RUST_LOG=warn $R/fairvgpu serve --config $W/host-$tag.toml 2>> $W/daemon.log &
  D=$!
  for i in $(seq 100); do [ -S $W/run-$tag/vm1.sock ] && break; sleep 0.1; done
  run_all "$tag" FAIRVGPU_SOCKET=$W/run-$tag/vm1.sock LD_LIBRARY_PATH=$W/lib-$tag
  kill $D; wait $D 2>/dev/null
done
run_all native LD_LIBRARY_PATH=$NV
grep -aE 'WARN|ERROR' $W/daemon.log | head -5
