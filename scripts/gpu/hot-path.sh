#!/usr/bin/env bash
# On the GPU machine, in one call: the remoting overhead twice (and once
# with only queued runs of launches as graph launches), the
# scheduler's fairness (twice) and accounting, the C program's launch rates
# natively and through the stand-in, and the stand-in's rate once more with
# the daemon's scheduler off (what the scheduler's per-launch work costs).
# Carried: target/release/{fairvgpu,libcuda.so,cudarc-guest}.
set -uo pipefail
. scripts/gpu/lib.sh
B=./target/release/fairvgpu
{
  header
  for i in 1 2; do
    echo "== bench overhead --executor cuda (run $i)"
    RUST_LOG=warn $B bench overhead --executor cuda; echo "rc=$?"
  done
  echo "== bench overhead --executor cuda --graph-launches runs"
  RUST_LOG=warn $B bench overhead --executor cuda --graph-launches runs; echo "rc=$?"
} 2>&1 | tee "$OUT/hot-path.log"
bash scripts/gpu/fairness.sh
{
  echo "== bench fairness --executor cuda --seconds 10 (run 2)"
  RUST_LOG=warn $B bench fairness --executor cuda --seconds 10; echo "rc=$?"
} 2>&1 | tee -a "$OUT/fairness.log"
bash scripts/gpu/libcuda.sh
# libcuda.sh left the C program in /tmp/fvg.
W=/tmp/fvg; mkdir -p $W/run2
cat > $W/nosched.toml <<TOML
[daemon]
run_dir = "$W/run2"
executor = "cuda"
scheduler = false
[[vm]]
name = "vm1"
tenant = "t"
memory_limit_mib = 8192
TOML
{
  echo "== through the stand-in, daemon with scheduler = false"
  RUST_LOG=warn $B serve --config $W/nosched.toml &
  D=$!
  for i in $(seq 100); do [ -S $W/run2/vm1.sock ] && break; sleep 0.1; done
  FAIRVGPU_SOCKET=$W/run2/vm1.sock LD_LIBRARY_PATH=$W/lib $W/driver_api $PWD/worker/kernels/fairvgpu.ptx rate | grep -E "launches=|bursts="; echo "rc=$?"
  kill $D; wait $D
} 2>&1 | tee -a "$OUT/libcuda.log"
