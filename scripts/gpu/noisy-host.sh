#!/usr/bin/env bash
# On the GPU machine: fairness on a noisy host (CPU hogs beside the guests
# and workers), two variants alternated, twice.
#   noisy-host.sh builds  the build before a change (target/release/fairvgpu-old)
#                         against the one after it (target/release/fairvgpu);
#                         then the new build's accounting and fairness on a
#                         quiet host
#   noisy-host.sh modes   graph_launches "runs" against "all" (one build)
# HOGS (default 12): how many busy-loop processes.
set -uo pipefail
. scripts/gpu/lib.sh
MODE=${1:-builds}
B=./target/release/fairvgpu
# fair BINARY [FLAGS]: its fairness bench (the "none" rows left out).
fair() {
  local bin=$1; shift
  RUST_LOG=warn $bin bench fairness --executor cuda --seconds 10 "$@" 2>&1 | grep -v "^none "
  echo "rc=$?"
}
{
  header
  hogs_start "${HOGS:-12}"
  for round in 1 2; do
    if [ "$MODE" = modes ]; then
      for g in runs all; do
        echo "== noisy host, round $round: --graph-launches $g"
        fair $B --graph-launches $g
      done
    else
      for b in old new; do
        echo "== noisy host, round $round: $b build"
        if [ $b = old ]; then fair $B-old; else fair $B; fi
      done
    fi
  done
  hogs_stop
  if [ "$MODE" != modes ]; then
    echo "== quiet host: new build, bench accounting --executor cuda --seconds 2"
    RUST_LOG=warn $B bench accounting --executor cuda --seconds 2; echo "rc=$?"
    echo "== quiet host: new build, fairness"
    fair $B
  fi
} 2>&1 | tee "$OUT/noisy-host-$MODE.log"
