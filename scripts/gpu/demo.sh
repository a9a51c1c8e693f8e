#!/usr/bin/env bash
# On the GPU machine: `fairvgpu demo --executor cuda`, its three tenants
# (cli/src/demo/tenant.c, built there with cc against the stand-in) on
# the real GPU. Carried: the release fairvgpu and libcuda.so in $R (default
# .carry/release); the demo finds the stand-in beside the binary.
# Expected: each tenant prints `device <the GPU's name>`, vm1's
# `vector_add: 1048576 elements, 0 wrong` and `saxpy: ... 0 wrong`, the
# summary's shares `within 5` points of 1:2:3 and of 4:2:3, and rc=0.
set -uo pipefail
. scripts/gpu/lib.sh
R=${R:-.carry/release}
header
RUST_LOG=warn timeout 120 "$R/fairvgpu" demo --executor cuda --seconds 20 2>&1 | tee "$OUT/demo.txt"
echo "rc=${PIPESTATUS[0]}"
