#!/usr/bin/env bash
# On a machine with two GPUs (issue 50): a PyTorch training moved between
# them through the stand-in, with what its worker leaves on the GPU it left
# (migrate-torch.sh, MT_STEPS=150), then Numba's cudadrv suite and cudapy's
# test_array, natively and through the stand-in (numba-suite.sh).
# Carried: .carry/release/{fairvgpu,libcuda.so,libnvidia_ml.so}.
set -uo pipefail
export R=.carry/release
MT_STEPS=${MT_STEPS:-150} bash scripts/gpu/migrate-torch.sh 2>&1 | tee "${OUT:-/tmp/out}/migrate.log" | tail -n 30
bash scripts/gpu/numba-suite.sh numba.cuda.tests.cudadrv numba.cuda.tests.cudapy.test_array 2>&1 |
    tee "${OUT:-/tmp/out}/numba.log" | tail -n 25
