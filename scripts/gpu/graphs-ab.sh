#!/usr/bin/env bash
# On the GPU machine: the scheduler's fairness and the data path with the
# worker submitting every launch as a graph launch ("all", the default) and
# only runs of queued launches ("runs"),
# alternated in one call. Carried: target/release/fairvgpu.
set -uo pipefail
. scripts/gpu/lib.sh
B=./target/release/fairvgpu
{
  header
  for i in 1 2; do
    for g in all runs; do
      echo "== bench fairness --executor cuda --seconds 10 --graph-launches $g (round $i)"
      RUST_LOG=warn $B bench fairness --executor cuda --seconds 10 --graph-launches $g; echo "rc=$?"
    done
  done
  for g in all runs; do
    echo "== bench overhead --executor cuda --graph-launches $g"
    RUST_LOG=warn $B bench overhead --executor cuda --graph-launches $g; echo "rc=$?"
  done
} 2>&1 | tee "$OUT/graphs-ab.log"
