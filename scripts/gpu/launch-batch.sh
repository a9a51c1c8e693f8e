#!/usr/bin/env bash
# On the GPU machine: host cost of B small launches as B cuLaunchKernel calls
# versus one CUDA graph launch (scripts/gpu/graph_probe.c). Needs nvcc only.
set -uo pipefail
NV=/usr/local/nvidia/lib64
export LD_LIBRARY_PATH=$NV
W=/tmp/fvg-batch; rm -rf $W; mkdir -p $W
echo "== date: $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O2 -o $W/graph_probe scripts/gpu/graph_probe.c -L$NV -lcuda && echo built
$W/graph_probe 200000; echo "rc=$?"
