#!/usr/bin/env bash
# On the GPU machine: a guest's copy out of a DMA target, memcpy against
# non-temporal stores (scripts/gpu/copy_probe.c). Needs nvcc only.
set -uo pipefail
NV=/usr/local/nvidia/lib64
export LD_LIBRARY_PATH=$NV
W=/tmp/fvg-copy; rm -rf $W; mkdir -p $W
echo "== date: $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O2 -o $W/copy_probe scripts/gpu/copy_probe.c -L$NV -lcuda && echo built
$W/copy_probe; echo "rc=$?"
