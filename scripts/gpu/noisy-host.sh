#!/usr/bin/env bash
# On the GPU machine: fairness on a noisy host (CPU hogs beside the guests
# and workers), two builds alternated, then the new build's accounting and
# fairness on a quiet host. Carried: target/release/fairvgpu (new) and
# target/release/fairvgpu-old (the build before the change).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HOGS=${HOGS:-12}
fair() { RUST_LOG=warn $1 bench fairness --executor cuda --seconds 10 2>&1 | grep -v "^none "; echo "rc=$?"; }
{
  echo "== date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "== $HOGS busy-loop processes on $(nproc) CPUs"
  pids=""
  for i in $(seq $HOGS); do sh -c 'while :; do :; done' & pids="$pids $!"; done
  for round in 1 2; do
    for b in old new; do
      echo "== noisy host, round $round: $b build"
      if [ $b = old ]; then fair ./target/release/fairvgpu-old; else fair ./target/release/fairvgpu; fi
    done
  done
  kill $pids; wait $pids 2>/dev/null
  echo "== quiet host: new build, bench accounting --executor cuda --seconds 2"
  RUST_LOG=warn ./target/release/fairvgpu bench accounting --executor cuda --seconds 2; echo "rc=$?"
  echo "== quiet host: new build, fairness"
  fair ./target/release/fairvgpu
} 2>&1 | tee "$OUT/noisy-host.log"
