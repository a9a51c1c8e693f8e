#!/usr/bin/env bash
# On the GPU machine: scripts/gpu/chain.cu (chains of kernels shorter than
# a launch) natively and through the stand-in ($R: `fairvgpu` and
# `libcuda.so`) with each `[daemon] graph_launches` mode in MODES,
# alternated twice. With PERF=DIR (a `perf` and its libraries, DIR/lib),
# the second run's worker in the first mode is profiled too (report in
# $OUT/perf-worker.txt; $R's binaries need their symbols: `strip -g`).
# usage: R=.carry/release [MODES="all off"] [PERF=.carry/perf] bash scripts/gpu/chain.sh
set -uo pipefail
. scripts/gpu/lib.sh
header
W=/tmp/chain; rm -rf $W; mkdir -p $W/lib
nvcc -O2 -o $W/chain scripts/gpu/chain.cu || exit 1
cp "$R/libcuda.so" $W/lib/libcuda.so.1
modes=(${MODES:-all off})
for k in 1 2; do
  echo "== native, run $k"; LD_LIBRARY_PATH=$NV $W/chain
  for m in "${modes[@]}"; do
    DAEMON_KEYS="graph_launches = \"$m\"" daemon_start $W/$m 8000
    echo "== through the stand-in, graph_launches = $m, run $k"
    if [ -n "${PERF:-}" ] && [ $k = 2 ] && [ $m = "${modes[0]}" ]; then
      wk=$(pgrep -f "fairvgpu worker" | head -1)
      LD_LIBRARY_PATH=$PERF/lib $PERF/perf record -F 9999 -g -p "$wk" -o $W/perf.data 2> $W/perf.log &
      P=$!; sleep 0.5
      LD_LIBRARY_PATH=$W/lib $W/chain
      kill -INT $P; wait $P; cat $W/perf.log | tail -2
      LD_LIBRARY_PATH=$PERF/lib $PERF/perf report -i $W/perf.data --no-children --stdio \
        > $OUT/perf-worker.txt 2> /dev/null
      LD_LIBRARY_PATH=$PERF/lib $PERF/perf report -i $W/perf.data --no-children --stdio -g none \
        --percent-limit 0.3 2> /dev/null | grep '%' | head -60
    else
      LD_LIBRARY_PATH=$W/lib $W/chain
    fi
    daemon_stop
  done
done
grep -aE 'WARN|ERROR' $W/*/logs/daemon.log | head -5
