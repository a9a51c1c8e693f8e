#!/usr/bin/env bash
# On the GPU machine: host cost of B small launches as B cuLaunchKernel calls
# versus one CUDA graph launch (scripts/gpu/graph_probe.c). Needs nvcc only.
set -uo pipefail
. scripts/gpu/lib.sh
probe graph_probe /tmp/fvg-batch 200000
