#!/usr/bin/env bash
# On the GPU machine: three guests 1:2:3 (20 us, 400 us, 1.6 ms kernels),
# fairvgpu's scheduler vs none; then the accounting's error against the
# guest's own CUDA events, and its cost. Carried: target/release/fairvgpu.
set -uo pipefail
. scripts/gpu/lib.sh
{
  header
  echo "== bench fairness --executor cuda --seconds 10"
  RUST_LOG=warn ./target/release/fairvgpu bench fairness --executor cuda --seconds 10; echo "rc=$?"
  echo "== bench accounting --executor cuda --seconds 2"
  RUST_LOG=warn ./target/release/fairvgpu bench accounting --executor cuda --seconds 2; echo "rc=$?"
} 2>&1 | tee "$OUT/fairness.log"
