#!/usr/bin/env bash
# On the GPU machine, in one call: the remoting overhead twice (synchronize
# signalled by the device through the channel's completion word), the
# scheduler's fairness and accounting (busy periods), and the C program's
# launch rates natively and through the stand-in.
# Carried: target/release/{fairvgpu,libcuda.so,cudarc-guest}.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=./target/release/fairvgpu
{
  echo "== date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for i in 1 2; do
    echo "== bench overhead --executor cuda (run $i)"
    RUST_LOG=warn $B bench overhead --executor cuda; echo "rc=$?"
  done
} 2>&1 | tee "$OUT/hot-path.log"
bash scripts/gpu/fairness.sh
bash scripts/gpu/libcuda.sh
