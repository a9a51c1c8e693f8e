#!/usr/bin/env bash
# On the GPU machine (issue 51): VMs packed onto one GPU running a
# latency-bound loop (a kernel over 4 MiB and a synchronous 4 MiB copy back),
# fairvgpu against no scheduler, with the GPU shared at once (the default)
# and exclusively (one vGPU a slice); the mixes; the three guests quiet and
# beside 12 busy loops. Carried: target/release/fairvgpu.
set -uo pipefail
. scripts/gpu/lib.sh
b=./target/release/fairvgpu
{
  header
  echo "== bench fairness --executor cuda --seconds ${SECS:-6} --density ${VMS:-8,32}"
  RUST_LOG=warn $b bench fairness --executor cuda --seconds "${SECS:-6}" --density "${VMS:-8,32}"; echo "rc=$?"
  echo "== the same, --sharing exclusive, --density 8"
  RUST_LOG=warn $b bench fairness --executor cuda --seconds "${SECS:-6}" --sharing exclusive --density 8; echo "rc=$?"
  echo "== bench fairness --executor cuda --seconds ${SECS:-6} --hogs 12 --realtime"
  RUST_LOG=warn $b bench fairness --executor cuda --seconds "${SECS:-6}" --hogs 12 --realtime; echo "rc=$?"
} 2>&1 | tee "$OUT/density.log" | grep -aE '^(==|density|mix|vms=|hogs=|fairvgpu:|none:|rc=|fairvgpu_mmr|[A-Z].*H[12]00)'
