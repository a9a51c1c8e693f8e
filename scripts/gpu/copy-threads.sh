#!/usr/bin/env bash
# On the GPU machine: the remoting overhead three times with the default
# guest copy threads (each run also copies 64 MiB each way by one and by
# two guest threads in turn), once pinned, and once with one copy thread.
# `copy-threads.sh noisy`: instead, twice beside 12 busy-loop processes.
# Carried: target/release/fairvgpu.
set -uo pipefail
. scripts/gpu/lib.sh
B=./target/release/fairvgpu
if [ "${1:-}" = noisy ]; then
  {
    header
    hogs_start 12
    for i in 1 2; do
      echo "== bench overhead --executor cuda, 12 CPU hogs (run $i)"
      RUST_LOG=warn $B bench overhead --executor cuda; echo "rc=$?"
    done
    hogs_stop
  } 2>&1 | tee "$OUT/copy-threads-noisy.log"
  exit 0
fi
{
  header
  nproc; lscpu -e | head -20
  for i in 1 2 3; do
    echo "== bench overhead --executor cuda (run $i)"
    RUST_LOG=warn $B bench overhead --executor cuda; echo "rc=$?"
  done
  echo "== bench overhead --executor cuda --pin 2,5"
  RUST_LOG=warn $B bench overhead --executor cuda --pin 2,5; echo "rc=$?"
  echo "== FAIRVGPU_COPY_THREADS=1 bench overhead --executor cuda"
  FAIRVGPU_COPY_THREADS=1 RUST_LOG=warn $B bench overhead --executor cuda; echo "rc=$?"
} 2>&1 | tee "$OUT/copy-threads.log"
